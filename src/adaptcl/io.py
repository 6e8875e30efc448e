"""Crash-safe file writing, content fingerprints and the data root, shared by the layers above
(imports no framework)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

__all__ = ["DATA_ENV", "atomic_write", "fingerprint_files", "resolve_data_root"]

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
    or none, never a truncated one; on an error the temporary file is removed, and a system
    error that names no file (a full disk while writing) names ``path``.

    >>> import tempfile, pathlib
    >>> p = atomic_write(pathlib.Path(tempfile.mkdtemp()) / "a.txt", lambda h: h.write("hi"),
    ...                  binary=False)
    >>> p.read_text()
    'hi'
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")) as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; these are ordinary files
        os.replace(tmp, path)
    except BaseException as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno is not None and _names_no_output(err, path):
            # the kernel's error of a write to the open file (a full disk) names no file, one
            # of the temporary file names ours
            err.filename = str(path)
        raise
    return path


def _names_no_output(err: OSError, path: Path) -> bool:
    """Whether ``err`` names no file the user knows of: none, or only the temporary file
    :func:`atomic_write` writes ``path`` through."""
    if err.filename2 is not None:  # a copy or a rename: its destination is named
        return False
    return err.filename is None or (
        Path(os.fsdecode(err.filename)).parent == path.parent
        and Path(os.fsdecode(err.filename)).name.startswith(f".{path.name}."))


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


_DIGESTS: dict[tuple, str] = {}


def _file_digest(path: Path) -> str:
    """SHA-256 of one file's bytes, memoised per process on (path, inode, size, mtime, ctime):
    a model folder or dataset is read once per run (ctime cannot be set back, unlike mtime)."""
    st = path.stat()
    stamp = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if stamp not in _DIGESTS:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        _DIGESTS[stamp] = digest.hexdigest()
    return _DIGESTS[stamp]


def fingerprint_files(paths: Iterable[str | os.PathLike], root: str | os.PathLike | None = None
                      ) -> dict[str, Any]:
    """Fingerprint of input files: SHA-256 over every file's name, size and content.

    ``paths`` may hold files and folders (walked recursively, sorted; hidden entries skipped).
    Names are taken relative to ``root`` when given, so a copy of the same data elsewhere has the
    same fingerprint; a changed byte anywhere changes it. The one content fingerprint of the
    package: data sets, sentence files, model folders.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp()); _ = (folder / "a.txt").write_text("hi")
    >>> fingerprint_files([folder], root=folder)["files"]
    1
    """
    files: list[Path] = []
    for entry in paths:
        entry = Path(entry)
        if entry.is_dir():
            files.extend(p for p in sorted(entry.rglob("*"))
                         if p.is_file() and not any(part.startswith(".") for part in
                                                    p.relative_to(entry).parts))
        elif entry.is_file():
            files.append(entry)
        else:
            raise FileNotFoundError(f"cannot fingerprint {str(entry)!r}: no such file or folder")
    digest = hashlib.sha256()
    total = 0
    for path in files:
        name = path.relative_to(root).as_posix() if root is not None else path.name
        size = path.stat().st_size
        total += size
        digest.update(f"{name}\0{size}\0{_file_digest(path)}".encode())
    return {"sha256": digest.hexdigest(), "files": len(files), "bytes": total}
