"""Multi-positive targets from labels: supervised contrastive learning (SupCon).

Reference:
    Khosla et al., "Supervised Contrastive Learning", NeurIPS 2020 (arXiv:2004.11362), Eq. 2
    (``L_out``, the form the paper recommends over ``L_in``, Eq. 3).

With ``labels`` (one class per pair), every candidate of the anchor's class is a positive. For
anchor ``i`` with positive set ``P(i)`` and candidates ``A(i)`` (every candidate but the
anchor itself):

.. code-block:: text

    L_i = -1/|P(i)| sum_{p in P(i)} log( exp(l_ip) / sum_{a in A(i)} exp(l_ia) )
        = logsumexp_{a in A(i)} l_ia - mean_{p in P(i)} l_ip

which is the kernel's soft-target cross-entropy with the uniform target ``1/|P(i)|`` on
``P(i)``: InfoNCE with one part changed, the targets (as ASCL's soft labels). So it combines with
any temperature rule (InfoNCE, MACL's batch temperature, DySTreSS's pair temperatures) and runs
on the materialised and the tiled path alike (:class:`LabelTargets` is the targets' tile).

How the pairs are treated:

* the designated positive (the other view of the anchor's own pair) is always in ``P(i)``,
  with the same weight ``1/|P(i)|`` as any other same-class candidate (it has the anchor's
  class); in the ``"nt_xent"`` form both views of every same-class pair are positives, as in
  SupCon's multi-view batch;
* the anchor itself is never a candidate (masked as before), so it is neither a positive nor in
  the denominator;
* the positives stay in the denominator (``L_out``); a decoupled (DCL) multi-positive form is
  not defined here: ``positive_in_denominator=False`` with labels is a ``ValueError``;
* extra negatives (a queue, hard negatives) have no class unless ``negative_labels`` gives them
  one; without it they are negatives of every anchor;
* labels that are all different give InfoNCE exactly (the one-positive case); so do labels that
  are pair indices (solo-learn's ``indexes`` for unsupervised SimCLR).

solo-learn's supervised SimCLR (``simclr_loss_func`` with targets as ``indexes``) is ``L_in``,
``-log sum_p exp(l_ip) / sum_a exp(l_ia)``: it equals ``L_out`` where an anchor has one
positive and differs otherwise. MACL's reweighting ``V = 1/W`` assumes one positive (with
several, ``W = 1 - P_pos`` no longer scales the whole gradient), so MACL with labels needs
``reweight=False``; its alignment-adaptive temperature works unchanged.

Examples:
    >>> import torch
    >>> from adaptcl.plugins import InfoNCELoss
    >>> loss_fn = InfoNCELoss(temperature=0.1)
    >>> z0, z1 = torch.randn(8, 32), torch.randn(8, 32)
    >>> labels = torch.tensor([0, 1, 0, 2, 1, 0, 3, 3])
    >>> loss = loss_fn(z0, z1, labels=labels)   # SupCon (L_out) in SimCLR's form
"""

from __future__ import annotations

from torch import Tensor

from .candidates import Candidates
from .tiles._loop import Masks, mask_tile
from .tiles._terms import SameClassTargets

__all__ = ["LabelTargets", "same_class"]


def same_class(c: Candidates, r0: int, r1: int, c0: int, c1: int) -> Tensor:
    """Boolean ``[r1 - r0, c1 - c0]``: the key column has the anchor's class (masked columns
    included; a key without a class, ``-1``, never matches an anchor's label ``>= 0``)."""
    return c.labels[r0:r1, None] == c.key_labels[None, c0:c1]


class LabelTargets:
    """The un-normalised multi-positive targets ``u_ij = [label_i == label_j]`` over the
    unmasked columns, a :class:`~adaptcl.plugins.tiles._loop.TileWeights`: the kernel adds the
    designated positive and normalises, ``y = 1 / (1 + sum_j u_ij)`` on each positive.

    The materialised path calls :meth:`tile` once for the whole matrix, the tiled path once
    per tile, so both use the same targets.
    """

    def __init__(self, c: Candidates) -> None:
        if c.labels is None or c.key_labels is None:
            raise ValueError("LabelTargets needs candidates built with labels")
        self.c = c

    def tile(self, r0: int, r1: int, keys: Tensor, masks: Masks, c0: int, c1: int) -> Tensor:
        u = same_class(self.c, r0, r1, c0, c1).to(keys.dtype)
        return mask_tile(u, masks, c0, c1, fill=0.0)

    def describe(self) -> SameClassTargets:
        """These targets as the tiles' typed description (the fused kernel compares the labels
        per tile to build the same targets)."""
        return SameClassTargets(self.c.labels, self.c.key_labels)
