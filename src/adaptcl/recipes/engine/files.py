"""Files a recipe reads and writes: atomic JSON/text/figure/checkpoint writes, markdown
tables, derived files (caches, processed data) rebuilt when corrupt, and what a refused write
(a full disk) says to the user."""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from adaptcl.io import atomic_write
from adaptcl.recipes.engine.errors import RecipeError, first_line

# What the file system says when the user's disk or folder cannot take the output: the user's
# to fix (one line, exit 2), not a crash of ours. Nothing is half-written: writes are atomic.
_STORAGE_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
                   errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
                   errno.EPERM: "permission denied"}
# torch.save reports a full disk as a RuntimeError of its zip writer
_TORCH_WRITE_FAILURE = re.compile(r"PytorchStreamWriter failed|inline_container\.cc.*unexpected pos")


def storage_error(err: BaseException, path: str | os.PathLike | None = None) -> str | None:
    """The one-line message for an output that the disk or the folder refused, else ``None``;
    ``path``: what was being written, where the error does not name it (a write of an open
    file, torch's zip writer)."""
    if isinstance(err, OSError) and err.errno in _STORAGE_ERRNOS:
        # a copy or a rename names its destination second (shutil.copyfile, os.replace)
        path = err.filename2 or err.filename or path
        where = f" writing {path}" if path else ""
        return (f"{_STORAGE_ERRNOS[err.errno]}{where} ({err.strerror or err}); finished runs "
                "are kept, so rerun the same command once there is room")
    if isinstance(err, RuntimeError) and _TORCH_WRITE_FAILURE.search(str(err)):
        return (f"writing {path or 'a checkpoint'} failed (is the disk full?): "
                f"{str(err).splitlines()[0]}; finished runs are kept, so rerun once there is room")
    return None


#: the free space under which an output folder's disk counts as full: a run's first write after
#: training (its record, a checkpoint) would fail there
MIN_FREE_BYTES = 1 << 20


def check_output_dir(path: str | os.PathLike, option: str = "--output-dir") -> Path:
    """Refuse, creating nothing, an output folder that is a file, that (or its nearest
    existing parent) this process may not write, or whose disk is full (less than
    :data:`MIN_FREE_BYTES` free: refused before the training, not after it).

    >>> check_output_dir(__file__)
    Traceback (most recent call last):
    ...
    NotADirectoryError: --output-dir ... is a file, not a folder
    """
    out = existing = Path(path).expanduser()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "is a file" if existing == out else f"is inside {str(existing)!r}, which is a file"
        raise NotADirectoryError(f"{option} {str(out)!r} {what}, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == out else f" (its parent {str(existing)!r} is not writable)"
        raise PermissionError(f"{option} {str(out)!r} is not writable{where}: pick a folder "
                              "this user can write")
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        raise RecipeError(f"the disk is full under {option} {str(out)!r} ({free:,} bytes "
                          "free): make room or pick a folder on another disk")
    return out


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 1) == 0:
        return obj.item()  # numpy / torch scalars
    return obj.tolist() if hasattr(obj, "tolist") else obj


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda handle: handle.write(text), binary=False)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """``obj`` (numpy/torch scalars and arrays allowed) as strict JSON, atomically; a NaN or
    infinity is refused with a ``ValueError`` naming the file (bare ``NaN`` is not JSON)."""
    try:
        text = json.dumps(_jsonable(obj), indent=2, allow_nan=False)
    except ValueError as err:
        raise ValueError(f"refusing to write {str(path)!r}: {err} (a NaN or infinite value; "
                         "store None for a value that does not exist)") from err
    return write_text_atomic(path, text + "\n")


def torch_save_atomic(obj: Any, path: str | os.PathLike) -> Path:
    import torch

    return atomic_write(path, lambda handle: torch.save(obj, handle))


def save_figure_atomic(fig: Any, path: str | os.PathLike, dpi: int = 110) -> Path:
    """Save a matplotlib figure atomically (format from the suffix) and close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        return atomic_write(path, lambda handle: fig.savefig(
            handle, dpi=dpi, format=path.suffix.lstrip(".") or "png"))
    finally:
        plt.close(fig)


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
                   floatfmt: str = ".2f") -> str:
    """``rows`` (dicts) as a GitHub markdown table; floats use ``floatfmt``."""
    if not rows:
        raise ValueError("markdown_table needs at least one row")
    columns = list(columns) if columns is not None else list(rows[0].keys())

    def fmt(value: Any) -> str:
        return format(value, floatfmt) if isinstance(value, float) else (
            "" if value is None else str(value))

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(" --- " for _ in columns) + "|"]
    lines += ["| " + " | ".join(fmt(row.get(col)) for col in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def note_corrupt(what: str, path: str | os.PathLike, err: BaseException, then: str, *,
                 detail: bool = True) -> None:
    """``adaptcl: <what> at <path> is corrupt or truncated (<Error>: <first line>); <then>``."""
    reason = f"{type(err).__name__}: {first_line(err)}" if detail else type(err).__name__
    print(f"adaptcl: {what} at {path} is corrupt or truncated ({reason}); {then}",
          file=sys.stderr, flush=True)


def load_or_rebuild(path: str | os.PathLike, load: Callable[[], Any], rebuild: Callable[[], Any],
                    *, what: str) -> Any:
    """``load()``; if the file or folder at ``path`` is corrupt, say so, delete it and
    ``rebuild()`` (a kill mid-write must not break a dataset or cache for good). A write the
    disk refused (full, read-only: :func:`storage_error`) is no corruption: what it left is
    deleted and it is one :class:`RecipeError` naming ``path``."""
    target = Path(path)
    try:
        return load()
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, pickle.UnpicklingError) as err:
        refused = storage_error(err, target)
        if refused is None:
            note_corrupt(what, target, err, "rebuilding it")
        _remove(target)
        if refused is not None:
            raise RecipeError(refused) from err
        return rebuild()


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def torch_load_checked(path: str | os.PathLike, *, what: str, **kwargs: Any) -> Any | None:
    """``torch.load``; ``None`` if the file is missing or corrupt (then it is named and kept
    aside as ``<name>.corrupt``)."""
    import torch

    path = Path(path)
    if not path.is_file():
        return None
    try:
        return torch.load(path, **kwargs)
    except Exception as err:  # noqa: BLE001 - any failure to read means: recompute
        note_corrupt(what, path, err, f"kept aside as {path.name}.corrupt and recomputed",
                     detail=False)
        os.replace(path, path.with_name(path.name + ".corrupt"))
        return None
