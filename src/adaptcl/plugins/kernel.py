"""One numerically stable kernel: ``logits -> per-anchor loss``.

Every method here reduces to the same quantities per anchor ``i``:

* ``p_i``: the positive logit (``cos(f_i, g_i) / tau``),
* ``n_i = logsumexp_j l_ij`` over the negatives only,
* ``r_i = n_i - p_i``, the log-ratio of negative to positive mass.

From them, exactly and without cancellation:

* InfoNCE with the positive in the denominator: ``L = softplus(r)``;
* DCL (positive out of the denominator): ``L = r``;
* MACL's gradient scaling factor ``W = 1 - P_pos = sigmoid(r)`` (Eq. 8), so
  ``log W = logsigmoid(r)`` and ``V = 1 / W`` never pass through ``1 / (1 - P + eps)``.

A per-anchor weight is applied in log space, ``exp(sg(log w) + log L)``. For MACL,
``V * L = softplus(r) / sigmoid(r)`` tends to 1 as the positive becomes easy; both factors
underflow or overflow in float32 long before that product does, which is why the reference
implementations return 1e8 or inf there. Everything runs in float32 (float64 if given): the
log-sum-exp, the weights and the gradients; only the products that form the logits take the
precision of :mod:`~adaptcl.plugins._products` (bf16 / fp16 operands for bf16 / fp16 inputs, or
float32 on CUDA at ``torch.set_float32_matmul_precision("high")``), accumulated in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from ._products import logits_product
from .candidates import Candidates, autocast_off, rows_logits, scaled_anchors
from .execution import TilePlan
from .tiles._dispatch import row_stats
from .tiles._loop import TileBias, TileTerm, TileWeights


@dataclass
class KernelOutput:
    """Per-anchor results of :func:`contrastive_kernel` (all ``[A]``)."""

    loss: Tensor
    """the weighted loss each anchor contributes"""
    plain: Tensor
    """the unweighted loss (InfoNCE / DCL / soft-target cross-entropy)"""
    log_w: Tensor
    """log of the gradient scaling factor W = 1 - P_pos (detached)"""
    positive_probability: Tensor
    """P_pos, the softmax probability of the positive among all candidates (detached)"""


class _RowLogSumExp(torch.autograd.Function):
    """``logsumexp`` over rows that keeps the normalised exponentials for backward.

    ``torch.logsumexp`` saves its input and rebuilds ``exp(x - lse)`` in backward with three
    N x N temporaries. Here forward turns the shifted exponentials into the one buffer it keeps
    (with ``inplace=True`` the input itself becomes that buffer; the caller must not read it
    afterwards) and backward returns one scaled copy of it, so ``retain_graph`` still works.
    """

    @staticmethod
    def forward(ctx, x: Tensor, inplace: bool) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        m = x.amax(dim=1, keepdim=True)
        if inplace:
            e = x.sub_(m).exp_()
            ctx.mark_dirty(x)
        else:
            e = (x - m).exp_()
        s = e.sum(dim=1, keepdim=True)
        ctx.save_for_backward(e, s)
        ctx.mark_non_differentiable(e)
        return (m + s.log()).squeeze(1), e

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor, _unused: Tensor | None) -> tuple[Tensor, None]:  # type: ignore[override]
        e, s = ctx.saved_tensors
        return e * (grad[:, None] / s), None


def row_logsumexp(x: Tensor, *, inplace: bool = False) -> Tensor:
    """``torch.logsumexp(x, dim=1)`` for ``[A, C]`` with a one-buffer backward (same values).

    With ``inplace=True`` ``x`` is overwritten (it becomes the backward buffer). Under
    ``torch.compile`` the copy is kept: dynamo cannot trace ``mark_dirty``, and inductor plans
    the buffers itself.
    """
    return _RowLogSumExp.apply(x, inplace and not torch.compiler.is_compiling())[0]


def log_softplus(r: Tensor) -> Tensor:
    """``log(softplus(r))`` without underflow for very negative ``r`` (where it equals ``r``)."""
    small = r < -20.0
    safe = torch.where(small, torch.zeros_like(r), r)
    return torch.where(small, r, torch.log(F.softplus(safe)))


def contrastive_kernel(
    negative_logits: Tensor,
    positive_logit: Tensor,
    *,
    positive_in_denominator: bool = True,
    soft_targets: tuple[Tensor, Tensor] | None = None,
    log_weights: Tensor | Callable[[Tensor], Tensor] | None = None,
    inplace: bool = False,
) -> KernelOutput:
    """Per-anchor contrastive loss from masked logits.

    Args:
        negative_logits: ``[A, C]`` logits with every non-negative column (the positive, the
            anchor itself) already set to the most negative float.
        positive_logit: ``[A]`` logit of each anchor's positive.
        positive_in_denominator: InfoNCE (True) or DCL (False, Yeh et al. 2022).
        soft_targets: ``(y_pos [A], y_neg [A, C])`` target mass on the positive and on each
            candidate column (zero on masked columns), rows summing to 1; detached by the
            caller. ``None`` is the one-hot target on the positive.
        log_weights: ``[A]`` log of a per-anchor weight, detached here (``sg``), or a callable
            mapping the detached ``log W`` to it (MACL: ``lambda log_w: -log_w``).
        inplace: let the kernel overwrite ``negative_logits`` (saves an N x N buffer); only
            for logits the caller owns and does not read again.

    Returns:
        :class:`KernelOutput`.
    """
    # The one-hot paths never read the logits again, so they may become the backward buffer.
    lse_neg = row_logsumexp(negative_logits, inplace=soft_targets is None and inplace)
    if soft_targets is not None:
        y_pos, y_neg = soft_targets
        soft_targets = (y_pos, (y_neg * negative_logits).sum(dim=1))
    return kernel_from_lse(lse_neg, positive_logit, positive_in_denominator=positive_in_denominator,
                           soft_targets=soft_targets, log_weights=log_weights)


def negative_lse(c: Candidates, temperature: Tensor | float,
                 plan: TilePlan | None = None) -> tuple[Tensor, Tensor]:
    """``(logsumexp over each anchor's negatives [A], positive logit [A])`` of one direction.

    The one place that runs ``plan`` (:mod:`~adaptcl.plugins.tiles._dispatch`) for the plain
    logits: materialise the ``[A, C]`` logits, or stream them in tiles (the loop or the
    kernel); same values and gradients either way, to float rounding. ``plan=None``:
    materialised.
    """
    if plan is not None and plan.tiled:
        a, pos = scaled_anchors(c, temperature)
        return row_stats(plan, a, c.keys, c.excluded)[0], pos
    neg, pos = rows_logits(c, temperature)
    return row_logsumexp(neg, inplace=True), pos


def row_statistics(c: Candidates, temperature: Tensor | float, plan: TilePlan, *,
                   term: TileTerm | None = None, weights: TileWeights | None = None,
                   bias: TileBias | None = None
                   ) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None]:
    """``(lse_neg [A], positive logit [A], (sum_j u_ij l_ij, sum_j u_ij) or None)`` of one
    direction with any of the parts a method may change per pair:

    * ``term``: the logits are ``term.logits(cos)`` (a per-pair temperature; ``temperature``
      is then unused), otherwise ``cos / temperature``;
    * ``weights``: the un-normalised soft targets ``u_ij`` (multi-positive labels);
    * ``bias``: a detached term added to the logits inside the log-sum-exp only (hardness).

    The one place where these paths run ``plan``: materialise the ``[A, C]`` logits or stream
    them (:func:`~adaptcl.plugins.tiles._dispatch.row_stats`); the weights, bias and term
    objects are the same on every path, so are the values and gradients.
    Without any of the three, :func:`negative_lse` computes the same quantities.
    """
    if term is None:
        a, pos = scaled_anchors(c, temperature)
    else:
        a = c.anchors
        with autocast_off(a):
            pos = term.logits(c.positive_sim)
    if plan.tiled:
        lse, sum_ul, sum_u = row_stats(plan, a, c.keys, c.excluded, weights, bias=bias,
                                       term=term)
        return lse, pos, None if weights is None else (sum_ul, sum_u)
    with autocast_off(a):
        logits = logits_product(a, c.keys, c.product_precision)
        if term is not None:
            logits = term.logits(logits)
        rows, cols = logits.shape
        sums = None
        if weights is not None:
            u = weights.tile(0, rows, c.keys, c.excluded, 0, cols)
            sums = ((u * logits).sum(dim=1), u.sum(dim=1))
        if bias is not None:
            logits = logits + bias.tile(0, rows, c.keys, c.excluded, 0, cols)
        lse = row_logsumexp(c.mask_(logits), inplace=True)
    return lse, pos, sums


def no_negatives_output(positive_logit: Tensor) -> KernelOutput:
    """The kernel's result for anchors with no negatives: loss 0 and gradient 0.

    With nothing to contrast against, softmax puts all mass on the positive: ``P_pos = 1``,
    InfoNCE's ``-log P_pos = 0`` and ``W = 1 - P_pos = 0``. Lightly's ``NTXentLoss`` and
    sentence-transformers' ``MultipleNegativesRankingLoss`` return exactly 0 (zero gradient)
    for a batch of one pair; every loss here does the same for such anchors instead of
    evaluating ``0 * inf`` (MACL's ``V = 1 / W``) or DCL's ``log 0``. The loss stays attached
    to the graph so ``backward()`` runs and gives zeros.
    """
    zero = positive_logit * 0.0
    return KernelOutput(loss=zero, plain=zero.detach(),
                        log_w=torch.full_like(zero, float("-inf")).detach(),
                        positive_probability=torch.ones_like(zero).detach())


def kernel_from_lse(
    lse_neg: Tensor,
    positive_logit: Tensor,
    *,
    positive_in_denominator: bool = True,
    soft_targets: tuple[Tensor, Tensor] | None = None,
    log_weights: Tensor | Callable[[Tensor], Tensor] | None = None,
) -> KernelOutput:
    """:func:`contrastive_kernel` from the row statistics (shared by the materialised and tiled paths).

    ``soft_targets`` is ``(y_pos [A], sum_j y_ij l_ij [A])`` here (the weighted sum streamed
    over tiles instead of the ``[A, C]`` targets).
    """
    r = lse_neg - positive_logit
    log_w = F.logsigmoid(r).detach()
    p_pos = torch.sigmoid(-r).detach()
    if soft_targets is not None:
        y_pos, weighted = soft_targets
        lse = torch.logaddexp(lse_neg, positive_logit) if positive_in_denominator else lse_neg
        plain = lse - y_pos * positive_logit - weighted
    elif positive_in_denominator:
        plain = F.softplus(r)
    else:
        plain = r
    if callable(log_weights):
        log_weights = log_weights(log_w)
    if log_weights is None:
        loss = plain
    elif soft_targets is None and positive_in_denominator:
        loss = torch.exp(log_weights.detach() + log_softplus(r))
    else:
        loss = torch.exp(log_weights.detach().clamp(max=80.0)) * plain
    return KernelOutput(loss=loss, plain=plain, log_w=log_w, positive_probability=p_pos)
