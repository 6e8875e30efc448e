"""Hardness weighting: a detached term on the negatives' logits inside the softmax.

References:
    - Lan et al., "LLaVE: Large Language and Vision Embedding Models with Hardness-Weighted
      Contrastive Learning", 2025 (arXiv:2503.04812), Eq. 5 (in-batch negatives).
    - Schechter Vera et al., "EmbeddingGemma", 2025 (arXiv:2509.20354) (hard negatives).
    - sentence-transformers 6.2, ``MultipleNegativesRankingLoss(hardness_mode=...,
      hardness_strength=...)``, whose semantics this module follows exactly.

For a negative ``j`` of anchor ``i`` the logit in the denominator becomes

``l_ij + alpha * sg(cos(f_i, k_j))``

(the term is not divided by the temperature, and carries no gradient): harder negatives weigh
more in the softmax, so they get more of the gradient. ``alpha`` is ``hardness_strength``
(LLaVE uses 9, EmbeddingGemma 5). ``hardness_mode`` chooses the negatives it touches, as in
sentence-transformers:

``"in_batch_negatives"``
    the other pairs' candidates: every in-batch negative, and the extra negatives that are not
    the anchor's own (another pair's hard negatives, a queue);
``"hard_negatives"``
    only the anchor's own extra negatives (``negative_owners`` says whose each is; without
    owners there are none and the term is off);
``"all_negatives"``
    every negative.

The positive is never touched, and neither is a same-class candidate when ``labels`` make it a
positive (:mod:`~adaptcl.plugins.targets`). The term enters the log-sum-exp only: the target
term of a soft-target loss (ASCL, labels) uses the plain logits, which changes its value by a
constant but not its gradient. ``hardness_mode=None`` or ``hardness_strength=0`` is exactly the
loss without it (the same code path, the same bits).

Examples:
    >>> import torch
    >>> from adaptcl.plugins import InfoNCELoss
    >>> loss_fn = InfoNCELoss(0.05, form="cross_view", hardness_mode="in_batch_negatives",
    ...                       hardness_strength=9.0)
    >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32))
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from ._products import product
from .candidates import Candidates, autocast_off
from .targets import same_class
from .tiles._loop import Masks
from .validation import check_choice, check_non_negative

__all__ = ["HardnessMode", "HARDNESS_MODES", "HardnessBias", "check_hardness"]

#: sentence-transformers' ``hardness_mode`` values (``None`` turns the term off)
HardnessMode = Literal["in_batch_negatives", "hard_negatives", "all_negatives"]
HARDNESS_MODES: tuple[HardnessMode, ...] = get_args(HardnessMode)


def check_hardness(hardness_mode: HardnessMode | None,
                   hardness_strength: float) -> tuple[str | None, float]:
    """``(hardness_mode, hardness_strength)`` validated; the strength is ignored (but checked)
    without a mode, as in sentence-transformers."""
    if hardness_mode is not None:
        check_choice("hardness_mode", hardness_mode, HARDNESS_MODES)
    return hardness_mode, check_non_negative("hardness_strength", hardness_strength)


def hardness_spec(hardness_mode: HardnessMode | None,
                  hardness_strength: float) -> tuple[str, float] | None:
    """``(mode, strength)`` when the term is on, ``None`` when it is exactly off."""
    if hardness_mode is None or hardness_strength == 0.0:
        return None
    return hardness_mode, hardness_strength


class HardnessBias:
    """The hardness term of one direction, a :class:`~adaptcl.plugins.tiles._loop.TileBias`:
    ``alpha * cos(f_i, k_j)`` on the negatives ``hardness_mode`` selects, 0 elsewhere.

    The cosines come from the unit anchors and keys (detached), not from the scaled logits, so
    the term is ``alpha * sg(cos)`` as in sentence-transformers whatever the temperature rule.
    One :meth:`tile` serves the materialised path (one tile) and the streamed one.
    """

    def __init__(self, c: Candidates, mode: str, strength: float) -> None:
        self.c, self.mode, self.strength = c, mode, strength
        self.anchors = c.anchors.detach()

    def _selected(self, r0: int, r1: int, c0: int, c1: int, device: torch.device) -> Tensor | None:
        """Boolean ``[rows, cols]`` of the columns the mode touches (``None``: all of them)."""
        c = self.c
        if self.mode == "all_negatives":
            selected = None
        else:
            cols = torch.arange(c0, c1, device=device)
            if c.negative_owners is None or not len(c.negative_owners):
                own = torch.zeros(r1 - r0, c1 - c0, dtype=torch.bool, device=device)
            else:  # the extra negatives' columns (more blocks may follow them)
                k = c.negative_owners.shape[0]
                extra = (cols >= c.num_batch_keys) & (cols < c.num_batch_keys + k)
                owner = c.negative_owners[(cols - c.num_batch_keys).clamp(0, k - 1)]
                own = extra[None, :] & (owner[None, :] == c.sample_index[r0:r1, None])
            selected = own if self.mode == "hard_negatives" else ~own
        if c.hardness_columns is not None and c1 > c.hardness_columns:
            inside = torch.arange(c0, c1, device=device) < c.hardness_columns
            selected = inside if selected is None else selected & inside
        if c.labels is not None:  # a same-class candidate is a positive: never penalised
            other = ~same_class(c, r0, r1, c0, c1)
            selected = other if selected is None else selected & other
        return selected

    def tile(self, r0: int, r1: int, keys: Tensor, masks: Masks, c0: int, c1: int) -> Tensor:
        with autocast_off(self.anchors):
            term = product(self.anchors[r0:r1], keys.detach().T,
                           self.c.product_precision).mul_(self.strength)
        selected = self._selected(r0, r1, c0, c1, term.device)
        return term if selected is None else term.mul_(selected)
