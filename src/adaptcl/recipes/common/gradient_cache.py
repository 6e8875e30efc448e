"""``--mini-batch-size`` as the Lightning recipes (``images``, ``clip``) take it: gradient
caching (:func:`adaptcl.plugins.cached_forward`, Gao et al. 2021), declared, checked and put
in a run's identity once. No framework import: the configs check it.
"""

from __future__ import annotations

from typing import Any

from adaptcl.recipes.engine.settings import positive, setting


def mini_batch_size(numbers: str) -> Any:
    """The ``--mini-batch-size`` setting; ``numbers`` says what it does to the recipe's numbers.

    Declared ``identity=False``: :func:`caching_identity` adds it to a run's identity where it
    changes the numbers (a recipe whose encoder has BatchNorm). One value per run."""
    return setting(None, check=positive, identity=False, sweep=False, help="gradient caching "
                   "(Gao et al. 2021): each encoder takes this many of a batch at a time, the "
                   "step exact for the whole batch's loss at the activation memory of one "
                   f"chunk, one extra forward pass; {numbers}; a divisor of --batch-size (none "
                   "or --batch-size itself: no caching)")


def check_mini_batch_fits(cfg: Any) -> None:
    """Refuse a ``mini_batch_size`` larger than ``batch_size`` or not dividing it
    (``ValueError`` naming both; every chunk has the same size, so BatchNorm normalises each
    with as many images).

    >>> check_mini_batch_fits(type("C", (), {"mini_batch_size": 48, "batch_size": 128})())
    Traceback (most recent call last):
    ...
    ValueError: mini_batch_size (48) must divide batch_size (128) into chunks of one size, e.g. 32 or 64
    """
    size, batch = cfg.mini_batch_size, cfg.batch_size
    if size is None:
        return
    if size > batch:
        raise ValueError(f"mini_batch_size ({size}) must be at most batch_size ({batch})")
    if batch % size:
        below = max(d for d in range(1, size) if batch % d == 0)
        above = min(d for d in range(size + 1, batch + 1) if batch % d == 0)
        raise ValueError(f"mini_batch_size ({size}) must divide batch_size ({batch}) into "
                         f"chunks of one size, e.g. {below} or {above}")


def caching(cfg: Any) -> bool:
    """Whether ``cfg``'s steps are cached (a mini-batch below the batch)."""
    return cfg.mini_batch_size is not None and cfg.mini_batch_size < cfg.batch_size


def caching_identity(cfg: Any) -> dict[str, Any]:
    """What gradient caching adds to the identity of a run whose encoder has BatchNorm (its
    statistics are the chunk's): the mini-batch where the steps are cached, else nothing, so a
    run without caching keeps the identity it had before the setting existed."""
    return {"mini_batch_size": cfg.mini_batch_size} if caching(cfg) else {}
