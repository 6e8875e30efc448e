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


def _numbers(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def validate_config(cfg: Any, *, positive: Sequence[str] = (),
                    choices: Mapping[str, Sequence[Any]] | None = None,
                    non_empty: Sequence[str] = (), non_negative: Sequence[str] = (),
                    at_least: Mapping[str, float] | None = None,
                    fractions: Sequence[str] = ()) -> None:
    """Check a recipe's dataclass config; ``ValueError`` naming the field and the bad value.

    Every float field (and every float of a list field) must be finite, so ``--lr nan`` is
    refused before any work. ``positive``: numbers > 0; ``non_negative``: numbers >= 0;
    ``at_least``: field -> minimum; ``fractions``: numbers in [0, 1); for a list field each
    item is checked. ``choices``: field -> allowed values; ``non_empty``: lists. ``None`` (an
    unset optional) passes every numeric check. ``precision`` and ``logger`` are always
    checked when the config has them.

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class C:
    ...     lr: float = float("nan")
    >>> validate_config(C())
    Traceback (most recent call last):
    ...
    ValueError: lr must be a finite number, got nan
    """
    allowed_all = dict(choices or {})
    for name, allowed in (("precision", PRECISIONS), ("logger", LOGGERS)):
        if hasattr(cfg, name):
            allowed_all.setdefault(name, allowed)
    for spec in dataclasses.fields(cfg):
        for value in _numbers(getattr(cfg, spec.name)):
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{spec.name} must be a finite number, got {value!r}")
    bounds = ([(name, "a positive number", lambda v: v > 0) for name in positive]
              + [(name, "a number >= 0", lambda v: v >= 0) for name in non_negative]
              + [(name, f"a number >= {low:g}", lambda v, low=low: v >= low)
                 for name, low in (at_least or {}).items()]
              + [(name, "a number in [0, 1)", lambda v: 0 <= v < 1) for name in fractions])
    for name, what, ok in bounds:
        value = getattr(cfg, name)
        for item in _numbers(value):
            if item is None:
                continue
            if (isinstance(item, bool) or not isinstance(item, (int, float))
                    or not math.isfinite(item) or not ok(item)):
                shown = value if isinstance(value, (list, tuple)) else item
                raise ValueError(f"{name} must be {what}, got {shown!r}"
                                 if shown is item else
                                 f"each value of {name} must be {what}, got {shown!r}")
    for name, allowed in allowed_all.items():
        if getattr(cfg, name) not in allowed:
            raise ValueError(f"{name} must be one of {tuple(allowed)}, got {getattr(cfg, name)!r}")
    for name in non_empty:
        if not getattr(cfg, name):
            raise ValueError(f"{name} must not be empty")
