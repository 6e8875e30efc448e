"""Crash-safe file writing and the data root, shared by the layers above (imports no framework)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["DATA_ENV", "atomic_write", "resolve_data_root"]

DATA_ENV = "ADAPTCL_DATA"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[IO[Any]], object], *,
                 binary: bool = True) -> Path:
    """Write ``path`` with ``write(handle)`` through a temporary file in the same folder.

    The temporary file (``.<name>.<random>.tmp``) is flushed, fsynced, given ordinary
    permissions and renamed with ``os.replace``, so a kill or a full disk leaves the old file
    or none, never a truncated one; on an error the temporary file is removed.

    >>> import tempfile, pathlib
    >>> p = atomic_write(pathlib.Path(tempfile.mkdtemp()) / "a.txt", lambda h: h.write("hi"),
    ...                  binary=False)
    >>> p.read_text()
    'hi'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")) as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; these are ordinary files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def resolve_data_root(data_root: str | os.PathLike | None) -> Path:
    """Return the benchmark data root: the argument if given, else ``$ADAPTCL_DATA``.

    Raises ``FileNotFoundError`` naming both ways to set it when neither points to a folder.
    """
    candidate = data_root if data_root is not None else os.environ.get(DATA_ENV)
    if candidate is None:
        raise FileNotFoundError(
            f"no data root given: pass data_root=/--data-root or set ${DATA_ENV}"
        )
    path = Path(candidate).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"data root {str(path)!r} is not a directory")
    return path
