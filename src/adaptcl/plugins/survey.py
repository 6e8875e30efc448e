"""The classic contrastive losses surveyed in "Effect of Contrastive Loss on Unsupervised
Representation Learning" (EECS 442 project report; see ``002_748363f490ab5580.txt``).

* spring-like margin contrastive loss (Hadsell, Chopra & LeCun, CVPR 2006);
* triplet loss (Schroff et al., FaceNet, CVPR 2015);
* NCE (Wu et al., "Unsupervised Feature Learning via Non-Parametric Instance
  Discrimination", CVPR 2018), with a uniform noise distribution ``P_n = 1/n``.

All take two views ``(z0, z1)`` (normalised inside) and use in-batch cross-view negatives by
default, so they slot into the same pipelines as the InfoNCE family; they share its keywords
(``gather_distributed``, ``gather_fn``, ``check_finite``, ``tile_size``: with a tile size the
anchors are processed that many at a time under activation checkpointing; ``"auto"`` does so,
in blocks that fit, where the materialised rows exceed the logits budget). They have no kernel
path: under ``tiling(backend="triton")`` every call is refused. An anchor with no
negatives (a batch of one pair) contributes only its positive term: the margin loss keeps
``1/2 d(a, p)^2``, the triplet and NCE losses give 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, get_args

import torch
from torch import Tensor

from .base import (
    ContrastiveLoss,
    Reduction,
    Stats,
    functional_candidates,
    in_row_blocks,
    loss_stats,
    reduce,
)
from .candidates import Candidates, Form, rows_logits
from .distributed import GatherFn
from .tiles import _dispatch as dispatch
from .validation import TileSize, check_choice, check_positive

#: the triplets kept: every (anchor, negative), or each anchor's closest negative
Mining = Literal["all", "hardest"]
MINING: tuple[Mining, ...] = get_args(Mining)
#: ``[A, C]`` matrices of the materialised path at its peak (measured, 6.4 to 8.2:
#: :mod:`~adaptcl.plugins.tiles._budget`)
SURVEY_COPIES = 9


def _survey(cands: list[Candidates], per_anchor: Callable[[Candidates], Tensor],
            tile_size: TileSize) -> tuple[Tensor, Stats]:
    """A loss defined per anchor on the cosine matrix, over every direction (``tile_size``
    rows at a time under checkpointing: a budget picks row blocks of the whole width; no
    kernel path)."""
    plan = dispatch.plan(dispatch.describe("survey loss", cands, op="row_blocks",
                                           copies=SURVEY_COPIES), tile_size)
    losses = torch.cat([in_row_blocks(lambda r0, r1, c=c: per_anchor(c.rows(r0, r1)),
                                      c.num_anchors, plan.tile) for c in cands])
    return losses, loss_stats(losses, cands, plan=plan)


def _functional(per_anchor: Callable[[Candidates], Tensor], z0: Tensor, z1: Tensor,
                negatives: Tensor | None, *, form: Form, gather_distributed: bool,
                gather_fn: GatherFn | None, check_finite: bool, tile_size: TileSize,
                reduction: Reduction) -> Tensor:
    cands = functional_candidates(z0, z1, negatives, form=form,
                                  gather_distributed=gather_distributed, gather_fn=gather_fn,
                                  check_finite=check_finite, tile_size=tile_size,
                                  reduction=reduction)
    return reduce(_survey(cands, per_anchor, tile_size)[0], reduction)


def _distances(c: Candidates) -> tuple[Tensor, Tensor]:
    """Euclidean distances of unit vectors to the positive ``[A]`` and every key ``[A, C]``.

    On the unit sphere ``||a - b||^2 = 2 - 2 cos(a, b)``; the clamp keeps sqrt differentiable.
    """
    d_pos = (2 - 2 * c.positive_sim).clamp(min=1e-12).sqrt()
    d_all = (2 - 2 * c.similarity()).clamp(min=1e-12).sqrt()
    return d_pos, d_all


def _margin_rows(c: Candidates, margin: float, squared: bool) -> Tensor:
    d_pos, d_neg = _distances(c)
    hinge = (margin - d_neg).clamp(min=0)
    if squared:
        d_pos, hinge = d_pos.pow(2), hinge.pow(2)
    # mean over anchors of (row sum / negatives per row) = mean over all negative pairs
    neg_term = (hinge * c.positive_mask()).sum(dim=1) / max(c.num_negatives, 1)
    return 0.5 * d_pos + 0.5 * neg_term


def _triplet_rows(c: Candidates, margin: float, mining: Mining) -> Tensor:
    if c.num_negatives == 0:
        return c.positive_sim * 0.0
    d_pos, d_neg = _distances(c)
    valid = c.positive_mask()
    if mining == "hardest":
        d_neg = d_neg.masked_fill(~valid, math.inf).min(dim=1).values
        return (d_pos - d_neg + margin).clamp(min=0)
    per = (d_pos[:, None] - d_neg + margin).clamp(min=0)
    return (per * valid).sum(dim=1) / c.num_negatives


def _nce_rows(c: Candidates, temperature: float) -> Tensor:
    m = c.num_negatives
    if m == 0:
        return c.positive_sim * 0.0
    neg, pos = rows_logits(c, temperature)
    lse = torch.logaddexp(torch.logsumexp(neg, dim=1), pos)
    log_noise = math.log(m / (m + 1))  # log(m * P_n), n = m + 1 candidates
    log_p_pos = pos - lse
    log_h_pos = log_p_pos - torch.logaddexp(log_p_pos, torch.full_like(pos, log_noise))
    log_p_neg = neg - lse[:, None]
    log_1mh = log_noise - torch.logaddexp(log_p_neg, torch.full_like(log_p_neg, log_noise))
    log_1mh = log_1mh * c.positive_mask()
    return -log_h_pos - log_1mh.sum(dim=1)


def margin_contrastive(z0: Tensor, z1: Tensor, margin: float = 1.0, *, squared: bool = True,
                       negatives: Tensor | None = None, form: Form = "cross_view",
                       gather_distributed: bool = False, gather_fn: GatherFn | None = None,
                       check_finite: bool = True, tile_size: TileSize = "auto",
                       reduction: Reduction = "mean") -> Tensor:
    """Functional margin contrastive loss; arguments as :class:`MarginContrastiveLoss`."""
    margin = check_positive("margin", margin)
    return _functional(lambda c: _margin_rows(c, margin, bool(squared)), z0, z1, negatives,
                       form=form, gather_distributed=gather_distributed, gather_fn=gather_fn,
                       check_finite=check_finite, tile_size=tile_size, reduction=reduction)


def triplet(z0: Tensor, z1: Tensor, margin: float = 0.5, *, mining: Mining = "all",
            negatives: Tensor | None = None, form: Form = "cross_view",
            gather_distributed: bool = False, gather_fn: GatherFn | None = None,
            check_finite: bool = True, tile_size: TileSize = "auto",
            reduction: Reduction = "mean") -> Tensor:
    """Functional triplet loss; arguments as :class:`TripletLoss`."""
    margin = check_positive("margin", margin)
    mining = check_choice("mining", mining, MINING)
    return _functional(lambda c: _triplet_rows(c, margin, mining), z0, z1, negatives, form=form,
                       gather_distributed=gather_distributed, gather_fn=gather_fn,
                       check_finite=check_finite, tile_size=tile_size, reduction=reduction)


def nce(z0: Tensor, z1: Tensor, temperature: float = 0.1, *, negatives: Tensor | None = None,
        form: Form = "cross_view", gather_distributed: bool = False,
        gather_fn: GatherFn | None = None, check_finite: bool = True,
        tile_size: TileSize = "auto",
        reduction: Reduction = "mean") -> Tensor:
    """Functional NCE; arguments as :class:`NCELoss`."""
    temperature = check_positive("temperature", temperature)
    return _functional(lambda c: _nce_rows(c, temperature), z0, z1, negatives, form=form,
                       gather_distributed=gather_distributed, gather_fn=gather_fn,
                       check_finite=check_finite, tile_size=tile_size, reduction=reduction)



class MarginContrastiveLoss(ContrastiveLoss):
    """Spring-like contrastive loss: pull positives together, push negatives beyond a margin.

    Per pair with Euclidean distance ``d``: ``1/2 d^2`` for positives and
    ``1/2 max(0, m - d)^2`` for negatives (Hadsell et al. 2006); ``squared=False`` gives the
    survey's unsquared variant. The loss is the mean over positive pairs plus the mean over
    negative pairs (0 when there are none). The functional form is :func:`margin_contrastive`.

    Examples:
        >>> loss_fn = MarginContrastiveLoss(margin=1.0)
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32))
    """

    def __init__(self, margin: float = 1.0, *, squared: bool = True, form: Form = "cross_view",
                 gather_distributed: bool = False, gather_fn: GatherFn | None = None,
                 check_finite: bool = True, tile_size: TileSize = "auto",
                 reduction: Reduction = "mean") -> None:
        super().__init__(form=form, gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size, reduction=reduction)
        self.margin = check_positive("margin", margin)
        self.squared = bool(squared)

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None) -> tuple[Tensor, Stats]:
        return _survey(self.candidates(z0, z1, negatives),
                       lambda c: _margin_rows(c, self.margin, self.squared), self.tile_size)


class TripletLoss(ContrastiveLoss):
    """Triplet loss ``max(0, d(a, p) - d(a, n) + alpha)`` over in-batch negatives.

    ``mining="all"`` averages over every (anchor, negative) triplet; ``"hardest"`` keeps the
    closest negative of each anchor. Without negatives there is no triplet: 0. The functional
    form is :func:`triplet`.

    Examples:
        >>> loss_fn = TripletLoss(margin=0.5)
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32))
    """

    def __init__(self, margin: float = 0.5, *, mining: Mining = "all", form: Form = "cross_view",
                 gather_distributed: bool = False, gather_fn: GatherFn | None = None,
                 check_finite: bool = True, tile_size: TileSize = "auto",
                 reduction: Reduction = "mean") -> None:
        super().__init__(form=form, gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size, reduction=reduction)
        self.margin = check_positive("margin", margin)
        self.mining = check_choice("mining", mining, MINING)

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None) -> tuple[Tensor, Stats]:
        return _survey(self.candidates(z0, z1, negatives),
                       lambda c: _triplet_rows(c, self.margin, self.mining), self.tile_size)


class NCELoss(ContrastiveLoss):
    """Noise-contrastive estimation with a uniform noise distribution (Wu et al. 2018).

    ``P(i|x)`` is the softmax over the ``n`` candidates at temperature tau; with ``m`` noise
    samples (the negatives) and ``P_n = 1/n``,
    ``h = P / (P + m/n)`` and ``L = -log h(positive) - sum_negatives log(1 - h)``,
    computed in log space. With no noise samples ``h = 1`` and the loss is 0. The functional
    form is :func:`nce`.

    Examples:
        >>> loss_fn = NCELoss(temperature=0.1)
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32))
    """

    def __init__(self, temperature: float = 0.1, *, form: Form = "cross_view",
                 gather_distributed: bool = False, gather_fn: GatherFn | None = None,
                 check_finite: bool = True, tile_size: TileSize = "auto",
                 reduction: Reduction = "mean") -> None:
        super().__init__(form=form, gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size, reduction=reduction)
        self.temperature = check_positive("temperature", temperature)

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None) -> tuple[Tensor, Stats]:
        return _survey(self.candidates(z0, z1, negatives),
                       lambda c: _nce_rows(c, self.temperature), self.tile_size)


__all__ = ["Mining", "MINING", "MarginContrastiveLoss", "TripletLoss", "NCELoss",
           "margin_contrastive", "triplet",
           "nce"]
