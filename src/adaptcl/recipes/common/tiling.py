"""``--tile-size``: how the training recipes' losses compute their logits, declared once.

Every recipe that trains with the core's losses (``simcse``, ``tu``, ``moleculenet``,
``images``, ``clip``, ``demo``) passes it to each loss as its ``tile_size``
(:mod:`adaptcl.plugins.execution`): ``auto`` (the default) takes the fastest exact path
that fits (on the CPU without a budget, the materialised logits; on CUDA the fused kernel where
it covers the loss and the products run on tensor cores), ``none`` materialises the logits, an
integer streams them on the PyTorch tile loop in tiles of that size, on every device. The paths compute the same loss to float rounding,
so the setting enters a run's identity, except at its default: records stored before it
existed were computed as ``auto`` computes on the CPU, and keep their identities.
"""

from __future__ import annotations

from typing import Any

from adaptcl.recipes.engine.settings import setting

__all__ = ["tile_size", "parse_tile_size"]


def parse_tile_size(value: Any) -> str | int | None:
    """The loss's ``tile_size`` of a command-line or config-file value: ``"auto"``, ``None``
    (``none``) or an int >= 1 (a string of digits too); ``ValueError`` naming the setting.
    (The core's :data:`~adaptcl.plugins.validation.TileSize`, without importing torch: a
    recipe's ``--help`` imports no heavy module.)

    >>> parse_tile_size("AUTO"), parse_tile_size("none"), parse_tile_size("4096")
    ('auto', None, 4096)
    """
    if value is None:
        return None
    number = value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("auto", "none"):
            return None if text == "none" else "auto"
        number = int(text) if text.isdigit() else None
    if isinstance(number, int) and not isinstance(number, bool) and number >= 1:
        return number
    raise ValueError(f"tile_size must be auto, none or an integer >= 1, got {value!r}")


def tile_size(identity: bool | str = True) -> Any:
    """The ``--tile-size`` setting (see the module docstring); ``identity``: the part of a run
    it determines (:func:`~adaptcl.recipes.engine.settings.setting`)."""
    return setting("auto", convert=parse_tile_size, omit_default=True, identity=identity,
                   metavar="auto|none|INT",
                   help="how each loss computes its logits: auto (the fastest exact path that "
                        "fits), none (materialised) or tiles of this many rows (exact, memory "
                        "linear in the batch)")
