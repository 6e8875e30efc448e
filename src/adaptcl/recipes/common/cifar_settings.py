"""The settings that choose the CIFAR-10 ``.npz`` copies and their class-stratified subsets
(:mod:`adaptcl.recipes.common.cifar`), declared once for the configs that read them (``images``,
``clip``). Imports no numpy, so a command line's ``--help`` stays light."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adaptcl.recipes.engine.settings import positive, setting

#: the copies of :data:`adaptcl.recipes.common.cifar.NPZ_PATTERNS`, best first
NPZ_VARIANTS = ("lossless", "jpeg")


def npz_variant_setting() -> Any:
    """The ``npz_variant`` setting (``auto``: the exact pixels if they cover the limits)."""
    return setting("auto", choices=("auto", *NPZ_VARIANTS),
                   help="CIFAR-10 npz copy (auto: lossless if it covers the limits)")


def limit_setting(split: str, default: int, use: str = "") -> Any:
    """A ``train_limit`` / ``test_limit`` setting: the class-stratified subset of ``split``,
    ``use`` saying what it is for."""
    return setting(default, check=positive,
                   help=f"class-stratified {split} subset{use} (none: every image)")


def apply_limits(config: Any, sizes: Mapping[str, int], where: str) -> str | None:
    """Set each limit of ``config`` that asks for more items than there are (``sizes``: ``{
    "train_limit": the training images loaded, ...}``) to the number applied, so that the run's
    identity, its records and ``compare --by`` hold what determined the numbers, and two limits
    that resolve to the same images are one run. Returns the note saying so (``None`` when every
    limit was applied as asked); ``where``: the images' source, for the note."""
    applied = []
    for name, size in sizes.items():
        asked = getattr(config, name)
        if asked is not None and asked > size:
            setattr(config, name, size)
            applied.append(f"--{name.replace('_', '-')} {asked} applies as {size}")
    if not applied:
        return None
    return f"{'; '.join(applied)}: the images loaded from {where} (recorded as applied)"

