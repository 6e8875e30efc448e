"""The one progress display: a tqdm bar on a terminal; off a terminal (a log file, a CI job) one
line per finished run of the grid, and nothing for the bars inside a run."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any


def on_terminal(enabled: bool = True) -> bool:
    """Whether redrawn progress bars belong on stderr (``enabled`` and stderr is a terminal):
    what a framework's own bar (Lightning's, the trainer's) is given."""
    return enabled and sys.stderr.isatty()


class _NoBar:
    def __init__(self, iterable: Iterable | None = None) -> None:
        self._iterable = iterable
        self.n = 0

    def __iter__(self):
        return iter(self._iterable or ())

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_postfix_str(self, text: str = "", **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


class _Lines(_NoBar):
    """Off a terminal: ``<desc>: 3/6 (<what it last said>)`` once per update, no redraws."""

    def __init__(self, desc: str, total: int | None, initial: int) -> None:
        super().__init__()
        self.desc, self.total, self.n, self.postfix = desc, total, initial, ""

    def set_postfix_str(self, text: str = "", **kwargs: Any) -> None:
        self.postfix = text

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
