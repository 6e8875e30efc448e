"""A recipe's dataclass config: which fields make a run's identity, and the checks every config gets."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from adaptcl.recipes.template.loggers import LOGGERS
from adaptcl.recipes.template.torch_env import PRECISIONS, torch_device_type

BOOKKEEPING = ("datasets", "losses", "inits", "seeds", "data_root", "output_dir", "work_dir",
               "cache_dir", "threads", "progress", "plot", "logger", "device", "devices",
               "strategy", "num_workers", "download")


def result_settings(cfg: Any, exclude: Sequence[str] = ()) -> dict[str, Any]:
    """Every field of the dataclass ``cfg`` that can change a result (part of a run's identity):
    all but :data:`BOOKKEEPING` and ``exclude``; the device enters as its type (cpu / cuda)."""
    skip = set(BOOKKEEPING) | set(exclude)
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in skip}
    if hasattr(cfg, "device"):
        settings["device_type"] = torch_device_type(cfg.device)
    return settings


def validate_config(cfg: Any, *, positive: Sequence[str] = (),
                    choices: Mapping[str, Sequence[Any]] | None = None,
                    non_empty: Sequence[str] = ()) -> None:
    """Check a recipe's dataclass config; ``ValueError`` naming the field and the bad value.

    ``positive``: numbers > 0; ``choices``: field -> allowed values; ``non_empty``: lists.
    ``precision`` and ``logger`` are always checked when the config has them.
    """
    allowed_all = dict(choices or {})
    for name, allowed in (("precision", PRECISIONS), ("logger", LOGGERS)):
        if hasattr(cfg, name):
            allowed_all.setdefault(name, allowed)
    for name in positive:
        value = getattr(cfg, name)
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value <= 0):
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    for name, allowed in allowed_all.items():
        if getattr(cfg, name) not in allowed:
            raise ValueError(f"{name} must be one of {tuple(allowed)}, got {getattr(cfg, name)!r}")
    for name in non_empty:
        if not getattr(cfg, name):
            raise ValueError(f"{name} must not be empty")
