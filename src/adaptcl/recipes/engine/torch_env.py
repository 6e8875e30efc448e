"""How a recipe sets torch up: threads, device, seeding, loader options (precision names:
:mod:`adaptcl.precision`)."""

from __future__ import annotations

import os
import random
from typing import Any

from adaptcl.recipes.engine.errors import RecipeError


def apply_thread_policy(threads: int | None) -> int:
    """Set torch's intra-op threads (``None``: torch's default); return the count in use.

    Recipes default to one thread: their models are small, so a second thread costs more in
    synchronisation than it saves. Every result records the count: it changes summation order.
    """
    import torch

    if threads is not None:
        if int(threads) < 1:
            raise RecipeError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(int(threads))
    return torch.get_num_threads()


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when available else ``cpu``; validate ``cpu`` / ``cuda[:N]``."""
    import torch

    name = str(device).lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return name
    if name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        if not torch.cuda.is_available():
            raise RecipeError(f"--device {device}: CUDA is not available on this machine")
        return name
    raise RecipeError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")


def device_type(device: str) -> str:
    """``cuda:1`` -> ``cuda``."""
    return str(device).split(":", 1)[0]


def device_identity(device: str) -> str:
    """What of ``--device`` enters a run's identity: the type it resolves to."""
    return device_type(resolve_device(device))


def check_lightning_precision(device: str, precision: str) -> None:
    """Refuse ``16-mixed`` on the CPU: Lightning would train in bfloat16 under that label."""
    if precision == "16-mixed" and device_identity(device) == "cpu":
        raise RecipeError("--precision 16-mixed needs CUDA (on the CPU Lightning trains in "
                          "bfloat16 instead); use --precision bf16-mixed or 32")


def grad_scaler(device: str, precision: str) -> Any:
    """fp16's gradient scaler (``16-mixed``); a disabled pass-through otherwise."""
    import torch

    return torch.amp.GradScaler(device_type(device), enabled=precision == "16-mixed")


#: the most DataLoader workers :func:`loader_workers` picks for one process
MAX_AUTO_WORKERS = 16


def loader_workers(device: str, workers: int | None, devices: int = 1) -> int:
    """The DataLoader workers of a run: ``workers`` when given; ``None`` (auto) picks 0 on the
    CPU (the model and the loader share its cores, as ever) and, on CUDA, the CPUs this
    process may run on (``os.sched_getaffinity``) shared among the ``devices`` processes, one
    left to each for itself (Lightning's ``suggested_max_num_workers``), at most
    :data:`MAX_AUTO_WORKERS`."""
    if workers is not None:
        return workers
    if device_type(device) != "cuda":
        return 0
    cpus = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1)
    return max(1, min(MAX_AUTO_WORKERS, cpus // max(1, devices) - 1))


def loader_options(device: str, workers: int = 0) -> dict[str, Any]:
    """``DataLoader`` keywords: ``workers`` processes, kept alive across epochs when there are
    any; pinned memory on CUDA (faster, asynchronous copies to the device)."""
    return {"num_workers": workers, "pin_memory": device_type(device) == "cuda",
            "persistent_workers": workers > 0}


def seed_everything(seed: int) -> None:
    """Seed python, numpy (if installed) and torch."""
    import torch

    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # numpy is optional for the core
        pass
    torch.manual_seed(seed)
