"""Adaptive Soft Contrastive Learning (ASCL).

Reference:
    Feng & Patras, "Adaptive Soft Contrastive Learning", ICPR 2022 (arXiv:2207.11163).

ASCL changes the target distribution of InfoNCE. For the query ``q_i`` contrasted with its key
``k_i`` and the negatives ``{z_j}`` (a queue, or the other keys of the batch):

* ``d_ij = cos(k_i, z_j)``: how close each negative is to the query's own positive key;
* ``q_ij = softmax_j(d_ij / tau')``, sharpened with ``tau' < tau`` (Eq. 7);
* confidence ``c_i = 1 - H(q_i) / log(n)`` with ``n`` the number of negatives (Eq. 8);
* targets: the positive keeps label 1; negatives get ``1`` for the top-K neighbours (Hard, Eq. 6),
  ``c_i`` for them (AHCL, Eq. 9) or ``min(1, c_i K q_ij)`` for all (ASCL, Eq. 10); each row is
  then normalised (Eq. 11).

The whole label path (key, negatives, ``q``, ``c``) is detached. ``num_neighbors=0`` gives back
InfoNCE (MoCo) exactly. Negatives and soft targets come from the queue only in the queue form;
the in-batch form (``form="cross_view"``) uses the other keys of the batch and ``n = N - 1``.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
from torch import Tensor

from ._products import ProductPrecision, gathered_product, product
from .base import (
    ContrastiveLoss,
    Reduction,
    Stats,
    functional_candidates,
    in_row_blocks,
    loss_stats,
    reduce,
)
from .candidates import (
    MASKED,
    Candidates,
    autocast_off,
    rows_logits,
    scaled_anchors,
)
from .distributed import GatherFn
from .execution import TilePlan
from .hardness import HardnessBias, HardnessMode, check_hardness, hardness_spec
from .kernel import (
    KernelOutput,
    contrastive_kernel,
    kernel_from_lse,
    no_negatives_output,
    row_logsumexp,
)
from .tiles import _dispatch as dispatch
from .tiles._loop import Masks, mask_tile
from .validation import TileSize, check_choice, check_int, check_positive

#: the soft-label rule: ASCL, AHCL (hard top-K labels) or hard (one-hot: InfoNCE)
ASCLMode = Literal["ascl", "ahcl", "hard"]
MODES: tuple[ASCLMode, ...] = get_args(ASCLMode)
#: the candidate sets ASCL defines: the queue, or in-batch cross-view
ASCLForm = Literal["queue", "cross_view"]
ASCL_FORMS: tuple[ASCLForm, ...] = get_args(ASCLForm)
#: the materialised path's ``[A, C]`` matrices at its peak (measured,
#: :mod:`~adaptcl.plugins.tiles._budget`): InfoNCE's, the key similarities and the soft targets
ASCL_COPIES = 7
#: ASCL's soft targets as the dispatcher's problem names them (no kernel has them)
_SOFT_TARGETS = "ASCL soft targets (mode='ascl'; 'hard' and 'ahcl' it has)"


# --------------------------------------------------------------------------------------------
# The label formulas, once for the materialised and the tiled paths
# --------------------------------------------------------------------------------------------


def _check_neighbours(num_neighbors: int, negatives: int | Tensor) -> None:
    fewest = negatives if isinstance(negatives, int) else int(negatives.min())
    if fewest < num_neighbors:
        raise ValueError(
            f"num_neighbors={num_neighbors} is larger than the {fewest} negatives available")


def _confidence(entropy: Tensor, negatives: int | Tensor) -> Tensor:
    """``c = 1 - H(q) / log(n)`` (Eq. 8), in ``[0, 1]``. ``log(1) = 0``: a single negative
    carries no uncertainty, c = 1."""
    tiny = torch.finfo(entropy.dtype).tiny
    if isinstance(negatives, int):
        log_n = max(math.log(negatives), tiny)
    else:
        log_n = torch.log(negatives.to(entropy.dtype)).clamp(min=tiny)
    return (1 - entropy / log_n).clamp(0.0, 1.0)


def _capped(q: Tensor, scale: Tensor) -> Tensor:
    """ASCL's un-normalised soft targets ``min(1, c K q_ij)`` (Eq. 10); ``scale = c K``."""
    return (q * scale[:, None]).clamp(max=1.0)


def _fill(mode: ASCLMode, confidence: Tensor) -> Tensor:
    """The label of each top-K neighbour: 1 (Hard, Eq. 6) or the confidence (AHCL, Eq. 9)."""
    return torch.ones_like(confidence) if mode == "hard" else confidence


def _soft_targets(key_sim: Tensor, valid: Tensor, negatives: int | Tensor, *, mode: ASCLMode,
                  num_neighbors: int, sharpen_temperature: float) -> tuple[Tensor, Tensor, Tensor]:
    a = key_sim.shape[0]
    if num_neighbors == 0:
        return (torch.ones(a, dtype=key_sim.dtype, device=key_sim.device),
                torch.zeros_like(key_sim), torch.zeros(a, dtype=key_sim.dtype, device=key_sim.device))
    _check_neighbours(num_neighbors, negatives)
    d = key_sim.masked_fill(~valid, MASKED)
    log_q = torch.log_softmax(d / sharpen_temperature, dim=1)
    q = log_q.exp()
    entropy = -(q * log_q.masked_fill(~valid, 0.0)).sum(dim=1)
    confidence = _confidence(entropy, negatives)
    if mode == "ascl":
        y_neg = _capped(q, confidence * num_neighbors).masked_fill(~valid, 0.0)
    else:
        columns = torch.arange(d.shape[1], device=d.device).expand_as(d)
        top = dispatch.top_columns(d, columns, num_neighbors)[1]
        y_neg = torch.zeros_like(q).scatter_(
            1, top, _fill(mode, confidence)[:, None].expand(-1, num_neighbors))
    total = 1 + y_neg.sum(dim=1)
    return 1 / total, y_neg / total[:, None], confidence


@torch.no_grad()
def soft_labels(key_sim: Tensor, valid: Tensor, *, mode: ASCLMode = "ascl", num_neighbors: int = 1,
                sharpen_temperature: float = 0.05) -> tuple[Tensor, Tensor, Tensor]:
    """ASCL pseudo-labels from the key-to-negative cosine matrix.

    Args:
        key_sim: ``[A, C]`` cosine of each anchor's positive key with every candidate column.
        valid: ``[A, C]`` bool, True where the column is a negative of that row.
        mode: ``"ascl"``, ``"ahcl"`` or ``"hard"``.
        num_neighbors: K, the number of neighbours treated as extra positives.
        sharpen_temperature: tau' of Eq. 7.

    Returns:
        ``(y_pos [A], y_neg [A, C], confidence [A])`` with each row of targets summing to 1.
        Among neighbours tied exactly, the lowest columns are the top-K.
    """
    return _soft_targets(key_sim, valid, valid.sum(dim=1), mode=mode, num_neighbors=num_neighbors,
                         sharpen_temperature=sharpen_temperature)


class _TileTargets:
    """ASCL's un-normalised targets on a tile, ``min(1, s_i q_ij)`` with
    ``q_ij = exp(<k_i, k_j> / tau' - log_norm_i)`` over the valid columns (detached); the
    :class:`~adaptcl.plugins.tiles._loop.TileWeights` of the streamed soft-target sum (the
    products ``<k_i, k_j>`` at ``precision``)."""

    def __init__(self, positive_keys: Tensor, sharpen_temperature: float, log_norm: Tensor,
                 scale: Tensor, precision: ProductPrecision = "ieee") -> None:
        self.positive_keys, self.sharpen_temperature = positive_keys, sharpen_temperature
        self.log_norm, self.scale, self.precision = log_norm, scale, precision

    def tile(self, r0: int, r1: int, keys: Tensor, masks: Masks, c0: int, c1: int) -> Tensor:
        x = product(self.positive_keys[r0:r1], keys.T, self.precision).div_(
            self.sharpen_temperature)
        q = mask_tile(x, masks, c0, c1).sub_(self.log_norm[r0:r1, None]).exp_()
        return _capped(q, self.scale[r0:r1])


def _tiled_ascl(c: Candidates, temperature: float, plan: TilePlan, *, mode: ASCLMode,
                num_neighbors: int, sharpen_temperature: float,
                bias: HardnessBias | None) -> tuple[KernelOutput, Tensor]:
    """Streamed: a first gradient-free pass gathers the normaliser and entropy of the sharpened
    distribution (and the top-K columns for ``"hard"`` / ``"ahcl"``), the second streams
    ``lse_neg`` and, for ``"ascl"``, ``sum_j u_ij l_ij`` and ``sum_j u_ij``."""
    a, pos = scaled_anchors(c, temperature)
    n, precision = c.num_negatives, c.product_precision
    if num_neighbors == 0:
        lse = dispatch.row_stats(plan, a, c.keys, c.excluded, bias=bias)[0]
        out = kernel_from_lse(lse, pos, soft_targets=(torch.ones_like(pos), torch.zeros_like(pos)))
        return out, torch.zeros_like(pos).detach()
    _check_neighbours(num_neighbors, n)
    pk = c.positive_keys.detach()
    log_norm, entropy, top = dispatch.softmax_stats(
        plan, pk, c.keys.detach(), sharpen_temperature, c.excluded,
        top=num_neighbors if mode != "ascl" else 0)
    confidence = _confidence(entropy, n)
    if mode == "ascl":
        targets = _TileTargets(pk, sharpen_temperature, log_norm, confidence * num_neighbors,
                               precision)
        lse, sum_ul, sum_u = dispatch.row_stats(plan, a, c.keys, c.excluded, targets, bias=bias)
        total = 1 + sum_u
        weighted = sum_ul / total
    else:
        fill = _fill(mode, confidence)
        total = 1 + fill * num_neighbors
        lse = dispatch.row_stats(plan, a, c.keys, c.excluded, bias=bias)[0]
        with autocast_off(a):
            top_logits = gathered_product(a, c.keys[top], precision)
        weighted = (fill / total) * top_logits.sum(dim=1)
    return kernel_from_lse(lse, pos, soft_targets=(1 / total, weighted)), confidence


def _ascl(c: Candidates, *, temperature: float, sharpen_temperature: float, num_neighbors: int,
          mode: ASCLMode, tile_size: TileSize,
          hardness: tuple[str, float] | None = None) -> tuple[Tensor, Stats]:
    """ASCL's per-anchor losses and statistics on one direction's candidates."""
    bias = None if hardness is None else HardnessBias(c, *hardness)

    soft = mode == "ascl" and num_neighbors > 0
    plan = dispatch.plan(dispatch.describe(
        "ASCL", [c], weights=_SOFT_TARGETS if soft else None, bias=bias, copies=ASCL_COPIES),
        tile_size)
    if c.num_negatives == 0:
        # nothing to contrast against and no neighbour to label: 0, as InfoNCE
        out, confidence = no_negatives_output(c.positive_sim), torch.zeros_like(c.positive_sim)
    elif plan.tiled:
        out, confidence = _tiled_ascl(c, temperature, plan, mode=mode,
                                      num_neighbors=num_neighbors,
                                      sharpen_temperature=sharpen_temperature, bias=bias)
    else:
        with torch.no_grad(), autocast_off(c.anchors):
            y_pos, y_neg, confidence = _soft_targets(
                product(c.positive_keys.detach(), c.keys.detach().T, c.product_precision),
                c.positive_mask(), c.num_negatives,
                mode=mode, num_neighbors=num_neighbors, sharpen_temperature=sharpen_temperature)
        neg, pos = rows_logits(c, temperature)
        if bias is None:
            out = contrastive_kernel(neg, pos, soft_targets=(y_pos, y_neg))
        else:  # the hardness term enters the denominator only, the targets see the plain logits
            with autocast_off(c.anchors):
                weighted = (y_neg * neg).sum(dim=1)
                biased = neg + bias.tile(0, neg.shape[0], c.keys, c.excluded, 0, neg.shape[1])
                lse = row_logsumexp(c.mask_(biased), inplace=True)
            out = kernel_from_lse(lse, pos, soft_targets=(y_pos, weighted))
    return out.loss, loss_stats(out.loss, [c], outputs=[out], temperature=temperature,
                                confidence=confidence, plan=plan)


def _check_ascl(temperature: float, sharpen_temperature: float, num_neighbors: int,
                mode: ASCLMode, hardness_mode: HardnessMode | None = None,
                hardness_strength: float = 0.0) -> dict:
    hardness_mode, hardness_strength = check_hardness(hardness_mode, hardness_strength)
    return {"temperature": check_positive("temperature", temperature),
            "sharpen_temperature": check_positive("sharpen_temperature", sharpen_temperature),
            "num_neighbors": check_int("num_neighbors", num_neighbors, minimum=0),
            "mode": check_choice("mode", mode, MODES), "hardness_mode": hardness_mode,
            "hardness_strength": hardness_strength}


def ascl(z0: Tensor, z1: Tensor, temperature: float = 0.1, sharpen_temperature: float = 0.05,
         num_neighbors: int = 1, mode: ASCLMode = "ascl", *, negatives: Tensor | None = None,
         form: ASCLForm = "queue", hardness_mode: HardnessMode | None = None,
         hardness_strength: float = 0.0,
         negative_owners: Tensor | None = None, gather_distributed: bool = False,
         gather_fn: GatherFn | None = None, check_finite: bool = True,
         tile_size: TileSize = "auto",
         reduction: Reduction = "mean") -> Tensor:
    """Functional ASCL; arguments as :class:`ASCLLoss`.

    Examples:
        >>> q, k, queue = torch.randn(8, 32), torch.randn(8, 32), torch.randn(64, 32)
        >>> loss = ascl(q, k, negatives=queue)
    """
    options = _check_ascl(temperature, sharpen_temperature, num_neighbors, mode, hardness_mode,
                          hardness_strength)
    (c,) = functional_candidates(z0, z1, negatives, form=form,
                                 gather_distributed=gather_distributed, gather_fn=gather_fn,
                                 check_finite=check_finite, tile_size=tile_size, reduction=reduction,
                                 forms=ASCL_FORMS, negative_owners=negative_owners)
    hardness = hardness_spec(options.pop("hardness_mode"), options.pop("hardness_strength"))
    return reduce(_ascl(c, **options, tile_size=tile_size, hardness=hardness)[0], reduction)



class ASCLLoss(ContrastiveLoss):
    """ASCL loss (Feng & Patras, ICPR 2022): InfoNCE with adaptive soft targets.

    Called as ``loss(q, k, negatives=queue)``: ``q`` the queries (strong views, online
    encoder), ``k`` their keys (weak views, momentum encoder), ``queue`` ``[K, D]`` negatives.
    With ``form="cross_view"`` the other keys of the batch serve as negatives (no queue).
    The functional form is :func:`ascl`.

    Args:
        temperature: tau of the contrastive softmax (paper: 0.1).
        sharpen_temperature: tau' of the neighbour distribution (paper: 0.05).
        num_neighbors: K (paper: 1); 0 gives InfoNCE / MoCo.
        mode: ``"ascl"`` (soft), ``"ahcl"`` (adaptive hard) or ``"hard"``.
        form: ``"queue"`` (default) or ``"cross_view"`` (in-batch).
        tile_size: ``"auto"`` (default), ``None`` (materialise) or an int: stream the logits
            and the key-to-negative similarities in tiles (Inf-CL, Cheng et al. 2024;
            :mod:`adaptcl.plugins.tiles._loop`), exact in every mode: a first gradient-free pass
            gathers the normaliser and entropy of the sharpened distribution (and merges the
            top-K across tiles for ``"hard"`` / ``"ahcl"``), the second streams ``lse`` and the
            soft-target sum ``sum_j y_ij l_ij``. As in :class:`~adaptcl.plugins.InfoNCELoss`.
        hardness_mode, hardness_strength: the hardness term of :mod:`adaptcl.plugins.hardness`
            (sentence-transformers' semantics; it enters the denominator only, the soft
            targets weigh the plain logits). Off by default.
        gather_distributed / gather_fn / check_finite / reduction: as in
            :class:`~adaptcl.plugins.InfoNCELoss`.

    ``last_stats["confidence"]`` holds the mean label confidence c.

    Examples:
        >>> loss_fn = ASCLLoss(temperature=0.1, sharpen_temperature=0.05, num_neighbors=1)
        >>> q, k, queue = torch.randn(8, 32), torch.randn(8, 32), torch.randn(64, 32)
        >>> loss = loss_fn(q, k, negatives=queue)
    """

    takes_owners = True

    def __init__(self, temperature: float = 0.1, sharpen_temperature: float = 0.05,
                 num_neighbors: int = 1, mode: ASCLMode = "ascl", *, form: ASCLForm = "queue",
                 hardness_mode: HardnessMode | None = None, hardness_strength: float = 0.0,
                 gather_distributed: bool = False, gather_fn: GatherFn | None = None,
                 check_finite: bool = True, tile_size: TileSize = "auto", reduction: Reduction = "mean") -> None:
        super().__init__(form=form, gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size, reduction=reduction, forms=ASCL_FORMS)
        for name, value in _check_ascl(temperature, sharpen_temperature, num_neighbors,
                                       mode, hardness_mode, hardness_strength).items():
            setattr(self, name, value)

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None,
                **pairs: Tensor) -> tuple[Tensor, Stats]:
        (c,) = self.candidates(z0, z1, negatives, **pairs)
        return self.compute_from_candidates(c)

    def compute_from_candidates(self, c: Candidates) -> tuple[Tensor, Stats]:
        """ASCL's per-anchor losses on prepared candidates (adapters that build their own)."""
        return _ascl(c, temperature=self.temperature,
                     sharpen_temperature=self.sharpen_temperature,
                     num_neighbors=self.num_neighbors, mode=self.mode, tile_size=self.tile_size,
                     hardness=hardness_spec(self.hardness_mode, self.hardness_strength))


def _ascl_byol(targets_view: list[Candidates], neighbours: list[Candidates], *,
               sharpen_temperature: float, num_neighbors: int, mode: ASCLMode,
               tile_size: TileSize) -> tuple[Tensor, Stats]:
    (c,), (near_all,) = targets_view, neighbours
    plan = dispatch.plan(dispatch.describe("ASCL-BYOL", [c, near_all], op="row_blocks",
                                           copies=4), tile_size)
    n = near_all.num_negatives
    k = num_neighbors if n > 0 else 0  # a batch of one has no neighbour: plain BYOL

    def rows(r0: int, r1: int) -> Tensor:
        block, near = c.rows(r0, r1), near_all.rows(r0, r1)
        with torch.no_grad(), autocast_off(block.anchors):
            y_pos, y_neg, confidence = _soft_targets(
                near.similarity(), near.positive_mask(), n, mode=mode, num_neighbors=k,
                sharpen_temperature=sharpen_temperature)
        agreement = y_pos * block.positive_sim + (y_neg * block.similarity()).sum(dim=1)
        return torch.stack([2 - 2 * agreement, confidence])

    out = in_row_blocks(rows, c.num_anchors, plan.tile)
    return out[0], loss_stats(out[0], [c], confidence=out[1], plan=plan)


def _byol_candidates(predictions: Tensor, targets: Tensor, negatives: Tensor | None,
                     build) -> tuple[list[Candidates], list[Candidates]]:
    """Anchors ``t_i`` against the (gathered) predictions ``p_j`` and the (gathered) targets."""
    if negatives is not None:
        raise ValueError("ASCLBYOLLoss takes no negatives: BYOL regresses onto its targets")
    try:
        targets_view = build(targets.detach(), predictions)
    except ValueError as e:  # name the arguments as the caller knows them
        raise ValueError(str(e).replace("z0", "targets").replace("z1", "predictions")) from None
    # the neighbour view in the dtype of both inputs (float64 if either is; bfloat16 when both
    # are, which sets the precision of its products as the batch's does)
    neighbours = targets.detach().to(torch.promote_types(predictions.dtype, targets.dtype))
    return targets_view, build(neighbours, neighbours)


def _check_byol(sharpen_temperature: float, num_neighbors: int, mode: ASCLMode) -> dict:
    return {"sharpen_temperature": check_positive("sharpen_temperature", sharpen_temperature),
            "num_neighbors": check_int("num_neighbors", num_neighbors, minimum=0),
            "mode": check_choice("mode", mode, MODES)}


def ascl_byol(predictions: Tensor, targets: Tensor, sharpen_temperature: float = 0.05,
              num_neighbors: int = 1, mode: ASCLMode = "ascl", *, gather_distributed: bool = False,
              gather_fn: GatherFn | None = None, check_finite: bool = True,
              tile_size: TileSize = "auto",
              reduction: Reduction = "mean") -> Tensor:
    """Functional ASCL-BYOL; arguments as :class:`ASCLBYOLLoss`."""
    options = _check_byol(sharpen_temperature, num_neighbors, mode)

    def build(z0: Tensor, z1: Tensor) -> list[Candidates]:
        return functional_candidates(z0, z1, None, form="cross_view",
                                     gather_distributed=gather_distributed, gather_fn=gather_fn,
                                     check_finite=check_finite, tile_size=tile_size,
                                     reduction=reduction)

    views = _byol_candidates(predictions, targets, None, build)
    return reduce(_ascl_byol(*views, **options, tile_size=tile_size)[0], reduction)


class ASCLBYOLLoss(ContrastiveLoss):
    """ASCL without negatives (paper appendix A): BYOL's regression loss with soft targets.

    ``L_i = 2 - 2 * sum_j y_ij cos(t_i, p_j)`` where ``p`` are the online predictions and ``t``
    the target (momentum) projections; ``y`` comes from the in-batch neighbour distribution of
    ``t_i`` with ``c = 1 - H(q) / log(b - 1)`` and ``y_ij = min(1, c K q_ij)`` (the appendix's
    ``max`` is a typo: the bound keeps a neighbour below the sample's own view). A batch of one
    has no neighbour: its target is its own view, plain BYOL ``2 - 2 cos(t, p)``.

    The shared keywords work as in the contrastive losses: ``gather_distributed`` /
    ``gather_fn`` make every rank's samples neighbours (``j`` runs over the gathered batch),
    an int ``tile_size`` processes that many samples at a time under activation checkpointing
    (``"auto"``, the default, so many as fit where the rows exceed the logits budget, as in
    :class:`~adaptcl.plugins.InfoNCELoss`; it has no kernel path). The functional form is
    :func:`ascl_byol`.

    Examples:
        >>> loss_fn = ASCLBYOLLoss(sharpen_temperature=0.05, num_neighbors=1)
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32))
    """

    def __init__(self, sharpen_temperature: float = 0.05, num_neighbors: int = 1,
                 mode: ASCLMode = "ascl", *, gather_distributed: bool = False,
                 gather_fn: GatherFn | None = None, check_finite: bool = True,
                 tile_size: TileSize = "auto",
                 reduction: Reduction = "mean") -> None:
        super().__init__(form="cross_view", gather_distributed=gather_distributed,
                         gather_fn=gather_fn, check_finite=check_finite, tile_size=tile_size, reduction=reduction,
                         forms=("cross_view",))
        for name, value in _check_byol(sharpen_temperature, num_neighbors, mode).items():
            setattr(self, name, value)

    def forward(self, predictions: Tensor, targets: Tensor, negatives: None = None) -> Tensor:
        """``predictions`` (online, with gradient) and ``targets`` (momentum), both ``[B, D]``."""
        return super().forward(predictions, targets, negatives)

    def compute(self, predictions: Tensor, targets: Tensor,
                negatives: Tensor | None) -> tuple[Tensor, Stats]:
        views = _byol_candidates(predictions, targets, negatives,
                                 lambda z0, z1: self.candidates(z0, z1, None))
        return _ascl_byol(*views, sharpen_temperature=self.sharpen_temperature,
                          num_neighbors=self.num_neighbors, mode=self.mode,
                          tile_size=self.tile_size)
