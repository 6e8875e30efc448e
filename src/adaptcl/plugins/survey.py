"""The classic contrastive losses surveyed in "Effect of Contrastive Loss on Unsupervised
Representation Learning" (EECS 442 project report; see ``002_748363f490ab5580.txt``).

* spring-like margin contrastive loss (Hadsell, Chopra & LeCun, CVPR 2006);
* triplet loss (Schroff et al., FaceNet, CVPR 2015);
* NCE (Wu et al., "Unsupervised Feature Learning via Non-Parametric Instance
  Discrimination", CVPR 2018), with a uniform noise distribution ``P_n = 1/n``.

All take two views ``(z0, z1)`` (normalised inside) and use in-batch cross-view negatives by
default, so they slot into the same pipelines as the InfoNCE family.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._validation import check_choice, check_positive
from .base import ContrastiveLoss, Stats
from .candidates import rows_logits


class MarginContrastiveLoss(ContrastiveLoss):
    """Spring-like contrastive loss: pull positives together, push negatives beyond a margin.

    Per pair with Euclidean distance ``d``: ``1/2 d^2`` for positives and
    ``1/2 max(0, m - d)^2`` for negatives (Hadsell et al. 2006); ``squared=False`` gives the
    survey's unsquared variant. The loss is the mean over positive pairs plus the mean over
    negative pairs.

    Examples:
        >>> loss_fn = MarginContrastiveLoss(margin=1.0)
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32))
    """

    def __init__(self, margin: float = 1.0, *, squared: bool = True, form: str = "cross_view",
                 check_finite: bool = True) -> None:
        super().__init__(form=form, check_finite=check_finite)
        self.margin = check_positive("margin", margin)
        self.squared = bool(squared)

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None) -> tuple[Tensor, Stats]:
        losses = []
        for c in self.candidates(z0, z1, negatives):
            # On the unit sphere ||a - b||^2 = 2 - 2 cos(a, b); clamp keeps sqrt differentiable.
            d_pos = (2 - 2 * c.positive_sim).clamp(min=1e-12).sqrt()
            d_neg = (2 - 2 * c.similarity()).clamp(min=1e-12).sqrt()
            hinge = (self.margin - d_neg).clamp(min=0)
            if self.squared:
                d_pos, hinge = d_pos.pow(2), hinge.pow(2)
            valid = c.positive_mask()
            neg_term = (hinge * valid).sum() / valid.sum()
            losses.append(0.5 * d_pos.mean() + 0.5 * neg_term)
        loss = torch.stack(losses).mean()
        return loss, {"loss": loss.detach()}


class TripletLoss(ContrastiveLoss):
    """Triplet loss ``max(0, d(a, p) - d(a, n) + alpha)`` over in-batch negatives.

    ``mining="all"`` averages over every (anchor, negative) triplet; ``"hardest"`` keeps the
    closest negative of each anchor.

    Examples:
        >>> loss_fn = TripletLoss(margin=0.5)
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32))
    """

    def __init__(self, margin: float = 0.5, *, mining: str = "all", form: str = "cross_view",
                 check_finite: bool = True) -> None:
        super().__init__(form=form, check_finite=check_finite)
        self.margin = check_positive("margin", margin)
        self.mining = check_choice("mining", mining, ("all", "hardest"))

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None) -> tuple[Tensor, Stats]:
        losses = []
        for c in self.candidates(z0, z1, negatives):
            d_pos = (2 - 2 * c.positive_sim).clamp(min=1e-12).sqrt()
            d_neg = (2 - 2 * c.similarity()).clamp(min=1e-12).sqrt()
            valid = c.positive_mask()
            if self.mining == "hardest":
                d_neg = d_neg.masked_fill(~valid, math.inf).min(dim=1).values
                losses.append((d_pos - d_neg + self.margin).clamp(min=0).mean())
            else:
                per = (d_pos[:, None] - d_neg + self.margin).clamp(min=0)
                losses.append((per * valid).sum() / valid.sum())
        loss = torch.stack(losses).mean()
        return loss, {"loss": loss.detach()}


class NCELoss(ContrastiveLoss):
    """Noise-contrastive estimation with a uniform noise distribution (Wu et al. 2018).

    ``P(i|x)`` is the softmax over the ``n`` candidates at temperature tau; with ``m`` noise
    samples (the negatives) and ``P_n = 1/n``,
    ``h = P / (P + m/n)`` and ``L = -log h(positive) - sum_negatives log(1 - h)``,
    computed in log space.

    Examples:
        >>> loss_fn = NCELoss(temperature=0.1)
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32))
    """

    def __init__(self, temperature: float = 0.1, *, form: str = "cross_view",
                 check_finite: bool = True) -> None:
        super().__init__(form=form, check_finite=check_finite)
        self.temperature = check_positive("temperature", temperature)

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None) -> tuple[Tensor, Stats]:
        losses = []
        for c in self.candidates(z0, z1, negatives):
            neg, pos = rows_logits(c, self.temperature)
            lse = torch.logaddexp(torch.logsumexp(neg, dim=1), pos)
            m = c.num_negatives
            log_noise = math.log(m / (m + 1))  # log(m * P_n), n = m + 1 candidates
            log_p_pos = pos - lse
            log_h_pos = log_p_pos - torch.logaddexp(log_p_pos, torch.full_like(pos, log_noise))
            log_p_neg = neg - lse[:, None]
            log_1mh = log_noise - torch.logaddexp(log_p_neg, torch.full_like(log_p_neg, log_noise))
            log_1mh = log_1mh * c.positive_mask()
            losses.append(-log_h_pos - log_1mh.sum(dim=1))
        loss = torch.cat(losses).mean()
        return loss, {"loss": loss.detach()}


__all__ = ["MarginContrastiveLoss", "TripletLoss", "NCELoss"]
