"""MACL's settings as the training recipes take them, declared once with their ranges: alpha
(``--alpha``) and A0 (``--a0``) of the adaptive temperature ``tau_a = tau0 * (1 + alpha * (A -
A0))`` (Huang et al., "Model-Aware Contrastive Learning", ICML 2023, Eq. 7).

alpha must be >= 0, as :class:`~adaptcl.plugins.MACLLoss` checks (the papers' alpha = 2 of the
SimCSE setting is accepted: it is not capped at 1); A0 may be any finite number. Both are read
by ``macl`` only, yet a value out of range is refused whichever losses run: it is a mistake
either way, and the run's config records it.
"""

from __future__ import annotations

from typing import Any

from adaptcl.recipes.engine.settings import finite, non_negative, setting

#: the losses that read MACL's settings
MACL_LOSSES = ("macl",)


def alpha(**declared: Any) -> Any:
    """The ``--alpha`` setting (``declared``: more of :func:`setting`'s keywords)."""
    return setting(0.5, check=non_negative, losses=MACL_LOSSES, help="MACL's alpha (>= 0)",
                   **declared)


def a0(default: float | None = 0.0, help: str = "MACL's A0", **declared: Any) -> Any:
    """The ``--a0`` setting (``None`` where the recipe fills in a method's default)."""
    return setting(default, check=finite, losses=MACL_LOSSES, help=help, **declared)
