"""What produced a result: stable hashes, the code version and the environment."""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import importlib
import json
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from adaptcl.io import fingerprint_files  # noqa: F401  (the one content fingerprint, re-exported)
from adaptcl.recipes.engine.files import write_json_atomic


def stable_hash(obj: Any, length: int = 16) -> str:
    """SHA-256 (hex, first ``length`` characters) of ``obj`` as canonical JSON."""
    blob = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def same_data(a: Any, b: Any) -> bool:
    """Whether two data fingerprints agree on the data both results used: per-dataset ones
    (``{name: fingerprint}``, as ``tu`` and ``moleculenet`` write) on the datasets both hold,
    single ones exactly."""
    def per_dataset(fp: Any) -> bool:
        return isinstance(fp, dict) and bool(fp) and all(isinstance(v, dict) for v in fp.values())

    if per_dataset(a) and per_dataset(b):
        return all(a[name] == b[name] for name in set(a) & set(b))
    return a == b


def code_version(*modules: str) -> dict[str, Any]:
    """adaptcl's version and a hash of ``modules``' sources (a package: every module in it)."""
    digest = hashlib.sha256()
    for name in sorted(modules):
        source = Path(getattr(importlib.import_module(name), "__file__", "") or "")
        if source.name == "__init__.py":
            parts = sorted(source.parent.rglob("*.py"))
        else:
            parts = [source] if source.is_file() else []
        for part in parts:
            digest.update(part.name.encode() + b"\0" + part.read_bytes())
    return {"adaptcl": package_version(), "sources": digest.hexdigest()[:16],
            "modules": sorted(modules)}


def package_version(name: str = "adaptcl") -> str | None:
    """The installed version of ``name`` (``None`` if absent; adaptcl's own falls back to
    ``adaptcl.__version__`` in a bare checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        if name != "adaptcl":
            return None
        import adaptcl  # pragma: no cover - running from a bare checkout

        return adaptcl.__version__


def package_versions(names: Sequence[str]) -> dict[str, str | None]:
    return {name: package_version(name) for name in names}


def cpu_capability() -> str | None:
    """The kernel path PyTorch dispatches to on this CPU (``default``, ``avx2``, ``avx512``;
    ``ATEN_CPU_CAPABILITY`` overrides it): training is bit-exact only on the same path."""
    import torch

    getter = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return getter() if getter is not None else None


# Variables that make ATen, oneDNN or MKL take another kernel path than the CPU's own: a result
# computed under one of them is bit-exact only under the same setting.
KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
                    "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")


def kernel_overrides() -> dict[str, str]:
    """The kernel-choosing variables set in this process (see :data:`KERNEL_VARIABLES`)."""
    return {name: os.environ[name] for name in KERNEL_VARIABLES if os.environ.get(name)}


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
    package), read once per process: the grid reads it before computing, so a result names
    the commit its runs started from."""
    here = Path(__file__).resolve().parents[1]
    try:
        out, dirty = (subprocess.run(["git", "-C", str(here), *args], capture_output=True,
                                     text=True, timeout=5, check=False)
                      for args in (["rev-parse", "HEAD"], ["status", "--porcelain", "--", "."]))
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def environment(*, frameworks: Sequence[str] = (), device: str | None = None,
                data_root: str | os.PathLike | None = None,
                data_fingerprint: Any = None) -> dict[str, Any]:
    """What a reader needs to reproduce a result: versions, host, threads, time, commit, data."""
    import torch

    cuda = torch.cuda.is_available()
    return {
        "adaptcl": package_version(), "python": platform.python_version(),
        "torch": torch.__version__, "frameworks": package_versions(frameworks),
        "platform": platform.platform(), "cpu": _cpu_model(), "cpu_count": os.cpu_count(),
        "cpu_capability": cpu_capability(), "kernel_overrides": kernel_overrides(),
        "torch_threads": torch.get_num_threads(), "device": device,
        "cuda": torch.version.cuda if cuda else None,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "data_root": str(Path(data_root).resolve()) if data_root is not None else None,
        "data_fingerprint": data_fingerprint,
    }


def write_measurements(path: str | os.PathLike, measurements: Mapping[str, Any], *,
                       device: str | None = None) -> Path:
    """A benchmark's measurements as strict JSON under an ``environment`` key
    (:func:`environment`), so a number in the docs can be traced to its machine."""
    return write_json_atomic(path, {"environment": environment(device=device), **measurements})
