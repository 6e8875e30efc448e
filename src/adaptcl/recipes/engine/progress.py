"""The one progress display (tqdm on stderr), or a silent stand-in."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class _NoBar:
    def __init__(self, iterable: Iterable | None = None) -> None:
        self._iterable = iterable

    def __iter__(self):
        return iter(self._iterable or ())

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_postfix_str(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def progress(iterable: Iterable | None = None, *, enabled: bool = True, desc: str = "",
             total: int | None = None, initial: int = 0, leave: bool = False) -> Any:
    """The one progress display (tqdm, to stderr); a silent stand-in when ``enabled`` is false."""
    if not enabled:
        return _NoBar(iterable)
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, initial=initial, leave=leave,
                dynamic_ncols=True)
