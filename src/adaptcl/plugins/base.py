"""Shared plumbing of every loss: the per-direction loop, the statistics, the reduction and the
validation of the keywords all losses share. Knows no concrete method."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .candidates import FORMS, Candidates, Form, build_candidates
from .distributed import GatherFn
from .execution import TilePlan
from .hardness import HardnessBias
from .kernel import (
    KernelOutput,
    kernel_from_lse,
    negative_lse,
    no_negatives_output,
    row_statistics,
)
from .targets import LabelTargets
from .tiles import _dispatch as dispatch
from .tiles._budget import LOGIT_COPIES
from .tiles._loop import TileTerm
from .validation import TileSize, check_choice, check_shared


class Stats(dict):
    """What a loss call computed, by name (detached 0-d tensors: ``loss``, ``alignment``,
    ``temperature``, ...), and how: :attr:`plan`. A ``dict``, so a logger that walks its items
    sees numbers only.

    Example:
        >>> import torch
        >>> from adaptcl.plugins import InfoNCELoss
        >>> loss_fn = InfoNCELoss(0.1, tile_size=4)
        >>> loss = loss_fn(torch.randn(8, 16), torch.randn(8, 16))
        >>> loss_fn.last_stats.plan.path, loss_fn.last_stats.plan.tile
        ('torch', 4)
    """

    plan: TilePlan | None = None
    """the path, tile and precision the call ran with, and why each backend that did not run
    did not (:class:`~adaptcl.plugins.execution.TilePlan`; ``str()`` says it in one line);
    ``None`` for a loss without logits to tile (AMCL's SimSiam and Barlow Twins forms)"""


#: how per-anchor losses are reduced (as ``torch.nn.functional``'s ``reduction``)
Reduction = Literal["mean", "sum", "none"]
REDUCTIONS: tuple[Reduction, ...] = get_args(Reduction)


def reduce(per_anchor: Tensor, reduction: Reduction) -> Tensor:
    """``"mean"`` / ``"sum"`` over anchors, or the ``[A]`` per-anchor losses (``"none"``)."""
    if reduction == "mean":
        return per_anchor.mean()
    if reduction == "sum":
        return per_anchor.sum()
    return per_anchor


def loss_stats(per_anchor: Tensor, cands: list[Candidates] | None = None, *,
               outputs: list[KernelOutput] | None = None, temperature: Tensor | float | None = None,
               plan: TilePlan | None = None, **extra: Tensor | float) -> Stats:
    """The one builder of ``last_stats``: detached 0-d tensors (in the computation's dtype;
    python numbers as float32).

    ``loss`` is the mean per-anchor loss; ``alignment`` the mean positive cosine of the first
    direction; from kernel ``outputs`` the unweighted ``plain_loss``, ``mean_w`` (MACL's W) and
    ``positive_probability``; ``temperature`` (its mean) and any ``extra`` value as given;
    ``auto_tile_size`` (float32) when the logits budget switched the call to its tiled path
    (``plan.chosen``, :mod:`~adaptcl.plugins.tiles._dispatch`); ``plan`` itself as
    :attr:`Stats.plan`.
    """
    def scalar(x: Tensor | float) -> Tensor:
        if not isinstance(x, Tensor):  # on the inputs' device, with no host-to-device copy
            return torch.full((), float(x), dtype=torch.float32, device=per_anchor.device)
        return x.detach().mean()

    stats = Stats(loss=scalar(per_anchor))
    stats.plan = plan
    if outputs:
        stats["plain_loss"] = scalar(torch.cat([o.plain for o in outputs]))
    if cands:
        stats["alignment"] = scalar(cands[0].positive_sim)
    if temperature is not None:
        stats["temperature"] = scalar(temperature)
    if outputs:
        stats["mean_w"] = scalar(torch.cat([o.log_w for o in outputs]).exp())
        stats["positive_probability"] = scalar(torch.cat([o.positive_probability for o in outputs]))
    stats.update({k: scalar(v) for k, v in extra.items()})
    if plan is not None and plan.chosen is not None:
        stats["auto_tile_size"] = scalar(plan.chosen)
    return stats


#: ``log_weights(cands, log W, plan)``: per-anchor log weights of a direction (see
#: :func:`per_anchor_losses`)
LogWeights = Callable[[Candidates, Tensor, TilePlan], Tensor]


def per_anchor_losses(
    cands: list[Candidates],
    temperature: Tensor | float,
    *,
    method: str,
    tile_size: TileSize,
    positive_in_denominator: bool = True,
    log_weights: LogWeights | None = None,
    term: TileTerm | None = None,
    hardness: tuple[str, float] | None = None,
    copies: int = LOGIT_COPIES,
    heads: int = 1,
) -> tuple[Tensor, Stats]:
    """The per-anchor losses of every direction, from their logits under one temperature
    rule: ``([A] losses, stats)``. The InfoNCE family's one path (InfoNCE, DCL, Dual
    temperature, MACL, DySTreSS, the schedule, the learned temperature).

    The call is described and planned once (:mod:`~adaptcl.plugins.tiles._dispatch`, as
    ``method`` with ``tile_size``; ``copies`` ``[A, C]`` matrices at the materialised peak,
    ``heads`` such calls alive until the backward): materialised, or streamed by a backend
    (the tile loop, or the fused kernel where it covers the case). ``log_weights(c, log_w,
    plan)`` may return per-anchor log weights from the direction's candidates, its detached
    ``log W`` and the plan (they are detached anyway). Anchors without negatives give 0
    (:func:`~adaptcl.plugins.kernel.no_negatives_output`).

    The per-pair parts: ``term`` maps cosines to logits (a per-pair temperature; ``temperature``
    then only feeds ``last_stats``), candidates built with ``labels`` get multi-positive
    targets (:mod:`~adaptcl.plugins.targets`) and ``hardness`` (``(mode, strength)``, see
    :mod:`~adaptcl.plugins.hardness`) adds its term to the negatives in the denominator.
    Without any of them each direction takes the plain InfoNCE path, unchanged.
    """
    parts = {}
    for i, c in enumerate(cands):
        if c.num_negatives == 0:
            continue
        targets = None
        if c.labels is not None:
            _check_labelled(positive_in_denominator, log_weights)
            targets = LabelTargets(c)
        parts[i] = (targets, None if hardness is None else HardnessBias(c, *hardness))

    # every direction's parts are of one kind: the first stands for them
    targets, bias = next(iter(parts.values()), (None, None))
    plan = dispatch.plan(dispatch.describe(method, cands, weights=targets, bias=bias, term=term,
                                           copies=copies, heads=heads), tile_size)
    outputs = []
    for i, c in enumerate(cands):
        if i not in parts:
            outputs.append(no_negatives_output(c.positive_sim))
            continue
        targets, bias = parts[i]
        weight_fn = None if log_weights is None else (lambda lw, c=c: log_weights(c, lw, plan))
        soft = None
        if targets is None and bias is None and term is None:
            lse, pos = negative_lse(c, temperature, plan)
        else:
            lse, pos, sums = row_statistics(c, temperature, plan, term=term, weights=targets,
                                            bias=bias)
            if sums is not None:
                total = 1 + sums[1]
                soft = (1 / total, sums[0] / total)
        outputs.append(kernel_from_lse(lse, pos, positive_in_denominator=positive_in_denominator,
                                       soft_targets=soft, log_weights=weight_fn))
    per_anchor = torch.cat([o.loss for o in outputs])
    return per_anchor, loss_stats(per_anchor, cands, outputs=outputs, temperature=temperature,
                                  plan=plan)


def _check_labelled(positive_in_denominator: bool, log_weights: object) -> None:
    """What multi-positive targets cannot be combined with (see :mod:`~adaptcl.plugins.targets`)."""
    if not positive_in_denominator:
        raise ValueError("labels need positive_in_denominator=True: SupCon's L_out keeps the "
                         "positives in the denominator; a decoupled (DCL) multi-positive loss is "
                         "not defined here")
    if log_weights is not None:
        raise ValueError("labels cannot be combined with a per-anchor reweighting (MACL's "
                         "reweight=True): W = 1 - P_pos scales the whole gradient only when an "
                         "anchor has one positive; pass reweight=False (MACL's temperature works "
                         "with labels)")


def in_row_blocks(rows_fn: Callable[[int, int], Tensor], num_rows: int,
                  tile_size: int | None) -> Tensor:
    """``rows_fn(0, num_rows)``, computed ``tile_size`` rows at a time and concatenated on the
    last dimension (``rows_fn(r0, r1)`` returns ``[..., r1 - r0]``).

    For the losses without a streaming path (the survey losses, ASCL-BYOL): each block runs
    under activation checkpointing, so only one ``[tile_size, C]`` block of the similarity
    matrix is alive at a time, in forward and in the recomputing backward.
    """
    if tile_size is None or tile_size >= num_rows:
        return rows_fn(0, num_rows)
    return torch.cat([checkpoint(rows_fn, r0, min(r0 + tile_size, num_rows), use_reentrant=False)
                      for r0 in range(0, num_rows, tile_size)], dim=-1)


def functional_candidates(z0: Tensor, z1: Tensor, negatives: Tensor | None, *, form: Form,
                          gather_distributed: bool, gather_fn: GatherFn | None,
                          check_finite: bool, tile_size: TileSize, reduction: Reduction,
                          forms: tuple[str, ...] = FORMS,
                          **pairs: Tensor | None) -> list[Candidates]:
    """What a functional form does before its formula: check the shared keywords exactly as
    :class:`ContrastiveLoss` does, then build the candidates (``pairs``: ``labels``,
    ``negative_labels``, ``negative_owners`` of :func:`~adaptcl.plugins.build_candidates`)."""
    check_choice("form", form, forms)
    check_choice("reduction", reduction, REDUCTIONS)
    check_shared(gather_distributed=gather_distributed, gather_fn=gather_fn,
                 check_finite=check_finite, tile_size=tile_size)
    return build_candidates(z0, z1, form, negatives, gather_distributed=gather_distributed,
                            gather_fn=gather_fn, check_finite=check_finite, **pairs)


def labelled_candidates(z0: Tensor, z1: Tensor, negatives: Tensor | None,
                        labels: Tensor | None, negative_labels: Tensor | None,
                        negative_owners: Tensor | None, /, **shared) -> list[Candidates]:
    """:func:`functional_candidates` with the pair data of the functional forms that take
    multi-positive labels and negative owners (``info_nce``, ``macl``, ``dystress``)."""
    return functional_candidates(z0, z1, negatives, labels=labels,
                                 negative_labels=negative_labels,
                                 negative_owners=negative_owners, **shared)


class Loss(nn.Module):
    """Base of every loss module: ``reduction`` and ``last_stats``.

    Subclasses implement :meth:`compute`, returning ``(losses, stats)`` from the inputs of
    ``forward``, usually by calling the same private function as their functional form;
    ``forward`` keeps ``stats`` in ``loss.last_stats`` (see :func:`loss_stats`) and reduces
    ``losses`` with ``reduction``: ``"mean"``, ``"sum"`` or ``"none"`` (the per-sample losses),
    as in ``torch.nn``. A subclass restricts ``reductions`` to those it defines (AMCL's Barlow
    Twins form, a sum over feature pairs, has only ``"sum"``).
    """

    def __init__(self, *, reduction: Reduction = "mean",
                 reductions: tuple[str, ...] = REDUCTIONS) -> None:
        super().__init__()
        self.reduction = check_choice("reduction", reduction, reductions)
        self.last_stats: Stats = {}

    def compute(self, *inputs: Tensor, **options: Tensor) -> tuple[Tensor, Stats]:
        raise NotImplementedError  # pragma: no cover - abstract

    def forward(self, *inputs: Tensor, **options: Tensor) -> Tensor:
        losses, stats = self.compute(*inputs, **options)
        self.last_stats = stats
        return reduce(losses, self.reduction)


class ContrastiveLoss(Loss):
    """Base of the two-view loss modules: validation of the shared arguments (reduction and
    ``last_stats`` come from :class:`Loss`).

    Every loss (InfoNCE, DCL, FlatNCE, Dual temperature, MACL, ASCL, ASCL-BYOL, AMCL, the
    survey losses) takes the same keywords, checked here by one function:
    ``gather_distributed`` (a bool), ``gather_fn`` (a gradient-carrying gather such as
    ``lightly.utils.dist.gather``, or None), ``check_finite`` (a bool), ``tile_size``
    (``"auto"``, the default, ``None`` or an int >= 1: how the ``[A, C]`` logits are computed,
    :mod:`~adaptcl.plugins.tiles._dispatch`; ``None`` materialises them, an int streams them on
    the PyTorch tile loop in tiles of that size on every device, ``"auto"`` takes the fastest
    exact path that fits, which on the CPU without a budget is the materialised one) and
    ``reduction`` (``"mean"``, ``"sum"`` or ``"none"`` for per-anchor losses, as in
    ``torch.nn``). Every other execution choice (what computes the tiles, the logits budget, the
    kernels' backward, ...) is a field of one scoped setting, :class:`~adaptcl.plugins.tiling`,
    not a keyword; ``last_stats.plan`` says which path a call took.
    Inputs of mixed float32/float64 dtypes are computed in float64.
    Anchors with no negatives (a batch of one pair, an empty queue) contribute 0 with a zero
    gradient, as in Lightly and sentence-transformers.

    Subclasses implement :meth:`compute` returning ``(per-anchor losses, stats)``, usually by
    calling the same private function as their functional form; ``forward(z0, z1,
    negatives=None)`` is called like Lightly's losses.
    """

    #: the ``negatives`` given to ``forward`` are unit rows already (a memory bank of
    #: normalised keys): used as given, not normalised again (see
    #: :func:`~adaptcl.plugins.candidates.build_candidates`); the Lightly adapter sets it
    unit_negatives: bool = False
    #: ``forward`` takes ``labels`` / ``negative_labels`` (multi-positive targets)
    takes_labels: bool = False
    #: ``forward`` takes ``negative_owners`` (read by the hardness term)
    takes_owners: bool = False

    def __init__(self, *, form: Form, gather_distributed: bool = False,
                 gather_fn: GatherFn | None = None, check_finite: bool = True,
                 tile_size: TileSize = "auto", reduction: Reduction = "mean",
                 forms: tuple[str, ...] = FORMS) -> None:
        # One validation path for the keywords every loss shares (a subclass restricts
        # ``forms`` to those it defines).
        form = check_choice("form", form, forms)
        super().__init__(reduction=reduction)
        self.form = form
        (self.gather_distributed, self.gather_fn, self.check_finite,
         self.tile_size) = check_shared(gather_distributed=gather_distributed,
                                        gather_fn=gather_fn, check_finite=check_finite,
                                        tile_size=tile_size)

    @property
    def gathers(self) -> bool:
        """Whether candidates are gathered across ranks (a flag or a custom gather)."""
        return self.gather_distributed or self.gather_fn is not None

    def candidates(self, z0: Tensor, z1: Tensor, negatives: Tensor | None,
                   **pairs: Tensor) -> list[Candidates]:
        return build_candidates(z0, z1, self.form, negatives,
                                gather_distributed=self.gather_distributed,
                                gather_fn=self.gather_fn, check_finite=self.check_finite,
                                unit_negatives=self.unit_negatives, **pairs)

    def forward(self, z0: Tensor, z1: Tensor, negatives: Tensor | None = None, *,
                labels: Tensor | None = None, negative_labels: Tensor | None = None,
                negative_owners: Tensor | None = None) -> Tensor:
        """Loss of the positive pairs ``(z0[i], z1[i])``.

        Args:
            z0, z1: ``[N, D]`` embeddings of two views (normalised inside).
            negatives: optional ``[K, D]`` extra negatives, required for ``form="queue"``.
            labels: optional ``[N]`` integer class of each pair: every candidate of the
                anchor's class is a positive (SupCon's ``L_out``,
                :mod:`~adaptcl.plugins.targets`); for the losses whose ``takes_labels`` is set
                (InfoNCE, MACL, DySTreSS), a ``TypeError`` for the others.
            negative_labels: optional ``[K]`` class of each extra negative (``-1``: none).
            negative_owners: optional ``[K]`` the pair each extra negative belongs to, for the
                hardness term (:mod:`~adaptcl.plugins.hardness`; ``takes_owners``).
        """
        pairs = {}
        for name, value, takes in (("labels", labels, self.takes_labels),
                                   ("negative_labels", negative_labels, self.takes_labels),
                                   ("negative_owners", negative_owners, self.takes_owners)):
            if value is None:
                continue
            if not takes:
                raise TypeError(f"{type(self).__name__} takes no {name}: multi-positive labels "
                                f"are for InfoNCELoss, MACLLoss and DySTreSSLoss, negative owners "
                                f"for the losses with a hardness term")
            pairs[name] = value
        return super().forward(z0, z1, negatives, **pairs)

    def extra_repr(self) -> str:
        tiled = "" if self.tile_size == "auto" else f", tile_size={self.tile_size}"
        reduction = "" if self.reduction == "mean" else f", reduction={self.reduction!r}"
        return f"form={self.form!r}, gather_distributed={self.gather_distributed}{tiled}{reduction}"
