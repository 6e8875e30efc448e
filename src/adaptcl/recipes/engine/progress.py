"""The one progress display: a tqdm bar on a terminal; off a terminal (a log file, a CI job) one
line per finished run of the grid, and nothing for the bars inside a run."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any


def on_terminal(enabled: bool = True) -> bool:
    """Whether a framework's own redrawn bar belongs on stderr (``enabled`` and a terminal)."""
    return enabled and sys.stderr.isatty()


class _NoBar:
    def __init__(self, iterable: Iterable | None = None) -> None:
        self._iterable, self.n, self.postfix = iterable, 0, ""

    def __iter__(self):
        return iter(self._iterable or ())

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_postfix_str(self, text: str = "", **kwargs: Any) -> None:
        self.postfix = text

    def close(self) -> None:
        pass


class _Lines(_NoBar):
    """Off a terminal: ``adaptcl: <desc>: 3/6 (<postfix>)`` once per update, no redraws."""

    def __init__(self, desc: str, total: int | None, initial: int) -> None:
        super().__init__()
        self.desc, self.total, self.n = desc, total, initial

    def update(self, n: int = 1) -> None:
        self.n += n
        tail = f" ({self.postfix})" if self.postfix else ""
        print(f"adaptcl: {self.desc}: {self.n}/{self.total}{tail}", file=sys.stderr, flush=True)


def progress(iterable: Iterable | None = None, *, enabled: bool = True, desc: str = "",
             total: int | None = None, initial: int = 0, leave: bool = False) -> Any:
    """A tqdm bar on stderr; off a terminal a line per update of a lasting bar (``leave``: the
    grid's) and nothing for a passing one; nothing at all when not ``enabled``."""
    if not enabled or (not leave and not sys.stderr.isatty()):
        return _NoBar(iterable)
    if not sys.stderr.isatty():
        return _Lines(desc, total, initial)
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, initial=initial, leave=leave,
                dynamic_ncols=True)
