"""What produced a result: stable hashes, data fingerprints, the code version and the environment."""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import importlib
import json
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from adaptcl.recipes.template.files import write_json_atomic


def stable_hash(obj: Any, length: int = 16) -> str:
    """SHA-256 (hex, first ``length`` characters) of ``obj`` as canonical JSON."""
    blob = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def fingerprint_files(paths: Iterable[str | os.PathLike], root: str | os.PathLike | None = None
                      ) -> dict[str, Any]:
    """Fingerprint of input files: SHA-256 over every file's name, size and content.

    ``paths`` may hold files and folders (walked recursively, sorted; hidden entries skipped).
    Names are taken relative to ``root`` when given, so a copy of the same data elsewhere has the
    same fingerprint; a changed byte anywhere changes it.
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
        name = str(path.relative_to(root)) if root is not None else path.name
        size = path.stat().st_size
        total += size
        digest.update(f"{name}\0{size}\0".encode())
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return {"sha256": digest.hexdigest(), "files": len(files), "bytes": total}


def same_data(a: Any, b: Any) -> bool:
    """Whether two data fingerprints agree on the data both results used. A fingerprint per
    dataset (a mapping of names to fingerprints, as ``tu`` and ``moleculenet`` write) need only
    agree on the datasets both hold; a single fingerprint must be equal."""
    def per_dataset(fp: Any) -> bool:
        return isinstance(fp, dict) and bool(fp) and all(isinstance(v, dict) for v in fp.values())

    if per_dataset(a) and per_dataset(b):
        return all(a[name] == b[name] for name in set(a) & set(b))
    return a == b


def code_version(*modules: str) -> dict[str, Any]:
    """The code that determines a result: adaptcl's version and a hash of ``modules``' sources."""
    digest = hashlib.sha256()
    for name in sorted(modules):
        module = importlib.import_module(name)
        source = Path(getattr(module, "__file__", "") or "")
        if source.name == "__init__.py":  # a package: every module in it
            parts = sorted(source.parent.rglob("*.py"))
        else:
            parts = [source] if source.is_file() else []
        for part in parts:
            digest.update(part.name.encode() + b"\0" + part.read_bytes())
    return {"adaptcl": package_version(), "sources": digest.hexdigest()[:16],
            "modules": sorted(modules)}


def package_version() -> str:
    """adaptcl's version from the installed metadata (``adaptcl.__version__`` when not installed)."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("adaptcl")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        import adaptcl

        return adaptcl.__version__



def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """HEAD of the checkout adaptcl runs from (``+dirty`` with uncommitted changes to the
    package), read once per process: :func:`run_grid` reads it before computing, so a result
    names the commit its runs started from, not the one at the time it was written."""
    here = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=False)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--", "."],
                               capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _version_of(module: str) -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version(module)
    except PackageNotFoundError:
        return None


def environment(*, frameworks: Sequence[str] = (), device: str | None = None,
                data_root: str | os.PathLike | None = None,
                data_fingerprint: Any = None) -> dict[str, Any]:
    """What a reader needs to reproduce a result: versions, host, threads, time, commit, data."""
    import torch

    env: dict[str, Any] = {
        "adaptcl": package_version(), "python": platform.python_version(),
        "torch": torch.__version__,
        "frameworks": {name: _version_of(name) for name in frameworks},
        "platform": platform.platform(), "cpu": _cpu_model(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "device": device,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "data_root": str(Path(data_root).resolve()) if data_root is not None else None,
        "data_fingerprint": data_fingerprint,
    }
    return env


def write_measurements(path: str | os.PathLike, measurements: Mapping[str, Any], *,
                       device: str | None = None) -> Path:
    """Write a benchmark's measurements to ``path`` as strict JSON, atomically, under an
    ``environment`` key saying what produced them (:func:`environment`), so a number in the
    docs can always be traced to its machine."""
    return write_json_atomic(path, {"environment": environment(device=device), **measurements})
