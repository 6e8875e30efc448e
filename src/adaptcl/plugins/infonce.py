"""InfoNCE / NT-Xent and the baselines that change one part of it: DCL, FlatNCE, Dual temperature.

References:
    - InfoNCE: van den Oord et al., "Representation Learning with Contrastive Predictive
      Coding", 2018. NT-Xent: Chen et al., "A Simple Framework for Contrastive Learning of
      Visual Representations" (SimCLR), ICML 2020.
    - DCL: Yeh et al., "Decoupled Contrastive Learning", ECCV 2022.
    - FlatNCE: Chen et al., "Simpler, Faster, Stronger: Breaking The log-K Curse On
      Contrastive Learners With FlatNCE", 2021.
    - Dual temperature: Zhang et al., "Dual Temperature Helps Contrastive Learning Without
      Many Negative Samples", CVPR 2022.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import (
    ContrastiveLoss,
    Reduction,
    Stats,
    functional_candidates,
    labelled_candidates,
    loss_stats,
    per_anchor_losses,
    reduce,
)
from .candidates import Candidates, Form
from .distributed import GatherFn
from .execution import TilePlan
from .hardness import HardnessMode, check_hardness, hardness_spec
from .kernel import negative_lse, no_negatives_output
from .tiles import _dispatch as dispatch
from .validation import TileSize, check_positive


def _info_nce(cands: list[Candidates], temperature: float | Tensor, positive_in_denominator: bool,
              tile_size: TileSize, hardness: tuple[str, float] | None = None
              ) -> tuple[Tensor, Stats]:
    return per_anchor_losses(cands, temperature,
                             method="InfoNCE" if positive_in_denominator else "DCL",
                             tile_size=tile_size, positive_in_denominator=positive_in_denominator,
                             hardness=hardness)


def info_nce(z0: Tensor, z1: Tensor, temperature: float = 0.1, *, negatives: Tensor | None = None,
             form: Form = "nt_xent", positive_in_denominator: bool = True,
             hardness_mode: HardnessMode | None = None, hardness_strength: float = 0.0,
             labels: Tensor | None = None, negative_labels: Tensor | None = None,
             negative_owners: Tensor | None = None, gather_distributed: bool = False,
             gather_fn: GatherFn | None = None, check_finite: bool = True,
             tile_size: TileSize = "auto", reduction: Reduction = "mean") -> Tensor:
    """InfoNCE / NT-Xent of the pairs ``(z0[i], z1[i])``; arguments as :class:`InfoNCELoss`
    (and its ``forward``: ``labels`` give SupCon's multi-positive targets).

    ``reduction="none"`` gives the per-anchor losses (``2N`` for ``"nt_xent"`` and
    ``"cross_view_symmetric"``: the anchors of ``z0`` then those of ``z1``).

    Examples:
        >>> loss = info_nce(torch.randn(8, 32), torch.randn(8, 32), 0.5)
        >>> supcon = info_nce(torch.randn(8, 32), torch.randn(8, 32), 0.1,
        ...                   labels=torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
    """
    check_positive("temperature", temperature)
    hardness = hardness_spec(*check_hardness(hardness_mode, hardness_strength))
    cands = labelled_candidates(z0, z1, negatives, labels, negative_labels, negative_owners,
                                form=form, gather_distributed=gather_distributed,
                                gather_fn=gather_fn, check_finite=check_finite,
                                tile_size=tile_size, reduction=reduction)
    return reduce(_info_nce(cands, temperature, bool(positive_in_denominator), tile_size,
                            hardness)[0], reduction)


def dcl(z0: Tensor, z1: Tensor, temperature: float = 0.1, *, negatives: Tensor | None = None,
        form: Form = "nt_xent", hardness_mode: HardnessMode | None = None,
        hardness_strength: float = 0.0,
        negative_owners: Tensor | None = None, gather_distributed: bool = False,
        gather_fn: GatherFn | None = None, check_finite: bool = True,
        tile_size: TileSize = "auto", reduction: Reduction = "mean") -> Tensor:
    """Decoupled contrastive loss: InfoNCE with the positive removed from the denominator."""
    return info_nce(z0, z1, temperature, negatives=negatives, form=form,
                    positive_in_denominator=False, hardness_mode=hardness_mode,
                    hardness_strength=hardness_strength, negative_owners=negative_owners,
                    gather_distributed=gather_distributed, gather_fn=gather_fn,
                    check_finite=check_finite, tile_size=tile_size, reduction=reduction)


class InfoNCELoss(ContrastiveLoss):
    """InfoNCE / NT-Xent loss.

    With the default ``form="nt_xent"`` this is exactly ``lightly.loss.NTXentLoss`` (symmetric,
    2N anchors, 2N - 2 negatives each). ``form="cross_view"`` is the one-direction form of
    SimCSE and sentence-transformers' ``MultipleNegativesRankingLoss``; ``form="queue"`` is MoCo.
    The functional form is :func:`info_nce`.

    Args:
        temperature: softmax temperature tau > 0.
        form: candidate set, see :mod:`adaptcl.plugins.candidates`.
        positive_in_denominator: False gives DCL (see :class:`DCLLoss`).
        hardness_mode, hardness_strength: add ``hardness_strength * sg(cos)`` to the logits of
            the negatives ``hardness_mode`` selects (``"in_batch_negatives"``,
            ``"hard_negatives"``, ``"all_negatives"``), as sentence-transformers'
            ``MultipleNegativesRankingLoss``; see :mod:`adaptcl.plugins.hardness`. Off by default.
        gather_distributed: gather candidates from every rank before the loss.
        gather_fn: custom gradient-carrying gather (e.g. ``lightly.utils.dist.gather``).
        check_finite: look for NaN/inf embeddings (one cheap reduction,
            :func:`~adaptcl.plugins.validation.check_all_finite`): on the CPU a
            :class:`~adaptcl.plugins.validation.NonFiniteError` (a ``ValueError``) at once; on
            an accelerator nothing is raised or waited for: the loss comes out NaN (under AMP,
            ``GradScaler`` skips the step) and a ``NonFiniteWarning`` follows. Nothing else in
            any loss synchronises host and device.
        tile_size: how the ``[A, C]`` logits are computed: ``"auto"`` (default) the fastest
            exact path that fits (on CUDA the fused kernel where it covers the case and its
            products run on tensor cores; else the materialised logits within the memory
            budget, and the tiled path beyond it, said once by a
            :class:`~adaptcl.plugins.LogitsBudgetWarning` and in
            ``last_stats["auto_tile_size"]``; on the CPU without a budget, materialised);
            ``None`` materialises; an int streams them on the PyTorch tile loop in ``tile_size
            x tile_size`` tiles with an exact recomputing backward (Inf-CL, Cheng et al. 2024),
            on every device and dtype: memory linear in the batch. What computes the tiles, the
            budget and every other execution choice: :class:`~adaptcl.plugins.tiling`;
            ``last_stats.plan`` says which path ran.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (per-anchor losses).

    ``forward(z0, z1, negatives=None, *, labels=None, negative_labels=None,
    negative_owners=None)``: with ``labels`` it is supervised contrastive learning (SupCon's
    ``L_out``, :mod:`adaptcl.plugins.targets`).

    Examples:
        >>> loss_fn = InfoNCELoss(temperature=0.5)
        >>> z0, z1 = torch.randn(8, 32), torch.randn(8, 32)
        >>> loss = loss_fn(z0, z1)
        >>> supcon = loss_fn(z0, z1, labels=torch.tensor([0, 1, 0, 1, 2, 2, 3, 0]))
        >>> big = InfoNCELoss(temperature=0.1, tile_size=4096)  # batches far beyond memory
        >>> from adaptcl.plugins import tiling
        >>> with tiling(max_logits_bytes=2**30):   # "auto": materialised up to 1 GiB of logits
        ...     loss = InfoNCELoss(temperature=0.1)(z0, z1)
    """

    takes_labels = True
    takes_owners = True

    def __init__(self, temperature: float = 0.1, *, form: Form = "nt_xent",
                 positive_in_denominator: bool = True, hardness_mode: HardnessMode | None = None,
                 hardness_strength: float = 0.0, gather_distributed: bool = False,
                 gather_fn: GatherFn | None = None, check_finite: bool = True,
                 tile_size: TileSize = "auto", reduction: Reduction = "mean") -> None:
        super().__init__(form=form, gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size, reduction=reduction)
        self.temperature = check_positive("temperature", temperature)
        self.positive_in_denominator = bool(positive_in_denominator)
        self.hardness_mode, self.hardness_strength = check_hardness(hardness_mode,
                                                                    hardness_strength)

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None,
                **pairs: Tensor) -> tuple[Tensor, Stats]:
        return self.compute_from_candidates(self.candidates(z0, z1, negatives, **pairs))

    def compute_from_candidates(self, cands: list[Candidates], *,
                                temperature: Tensor | None = None) -> tuple[Tensor, Stats]:
        """InfoNCE's per-anchor losses on prepared candidates (adapters that build their own);
        ``temperature`` replaces :attr:`temperature` for this call (a 0-d tensor keeps its
        gradient: the open_clip adapter's ``1 / logit_scale``)."""
        return _info_nce(cands, self.temperature if temperature is None else temperature,
                         self.positive_in_denominator, self.tile_size,
                         hardness_spec(self.hardness_mode, self.hardness_strength))

    def extra_repr(self) -> str:
        hardness = ("" if self.hardness_mode is None else
                    f"hardness_mode={self.hardness_mode!r}, "
                    f"hardness_strength={self.hardness_strength}, ")
        return (f"temperature={self.temperature}, positive_in_denominator="
                f"{self.positive_in_denominator}, {hardness}{super().extra_repr()}")


class DCLLoss(InfoNCELoss):
    """Decoupled contrastive loss (Yeh et al., ECCV 2022): the positive leaves the denominator.

    GraphCL's loss is this loss in ``form="cross_view"``. The gradient no longer carries MACL's
    scaling factor W (Huang et al. 2023, Sec. 5.2). It takes no ``labels`` (a decoupled
    multi-positive loss is not defined here). The functional form is :func:`dcl`.

    Examples:
        >>> loss_fn = DCLLoss(temperature=0.1)
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32))
    """

    takes_labels = False

    def __init__(self, temperature: float = 0.1, *, form: Form = "nt_xent",
                 hardness_mode: HardnessMode | None = None, hardness_strength: float = 0.0,
                 gather_distributed: bool = False, gather_fn: GatherFn | None = None,
                 check_finite: bool = True, tile_size: TileSize = "auto",
                 reduction: Reduction = "mean") -> None:
        super().__init__(temperature, form=form, positive_in_denominator=False,
                         hardness_mode=hardness_mode, hardness_strength=hardness_strength,
                         gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size, reduction=reduction)


def _flat_nce(cands: list[Candidates], temperature: float,
              tile_size: TileSize) -> tuple[Tensor, Stats]:
    plan = dispatch.plan(dispatch.describe("FlatNCE", cands), tile_size)
    losses, plains = [], []
    for c in cands:
        if c.num_negatives == 0:
            out = no_negatives_output(c.positive_sim)
            losses.append(out.loss)
            plains.append(out.plain)
            continue
        lse, pos = negative_lse(c, temperature, plan)
        r = lse - pos
        losses.append(torch.exp(r - r.detach()))
        plains.append(F.softplus(r.detach()))
    per_anchor = torch.cat(losses)
    return per_anchor, loss_stats(per_anchor, cands, temperature=temperature,
                                  plain_loss=torch.cat(plains), plan=plan)


def flat_nce(z0: Tensor, z1: Tensor, temperature: float = 0.1, *,
             negatives: Tensor | None = None, form: Form = "nt_xent",
             gather_distributed: bool = False, gather_fn: GatherFn | None = None,
             check_finite: bool = True, tile_size: TileSize = "auto",
             reduction: Reduction = "mean") -> Tensor:
    """FlatNCE of the pairs ``(z0[i], z1[i])``; arguments as :class:`FlatNCELoss`."""
    check_positive("temperature", temperature)
    cands = functional_candidates(z0, z1, negatives, form=form,
                                  gather_distributed=gather_distributed, gather_fn=gather_fn,
                                  check_finite=check_finite, tile_size=tile_size,
                                  reduction=reduction)
    return reduce(_flat_nce(cands, temperature, tile_size)[0], reduction)


class FlatNCELoss(ContrastiveLoss):
    """FlatNCE (Chen et al. 2021): ``exp(r - sg(r))`` with ``r = logsumexp_j (l_j - l_pos)``.

    Its value is always 1 (uninformative by construction) and its gradient equals DCL's;
    ``last_stats["plain_loss"]`` holds the InfoNCE value for monitoring. Anchors without
    negatives give 0 (no gradient), like every other loss here. The functional form is
    :func:`flat_nce`.

    Examples:
        >>> loss_fn = FlatNCELoss(temperature=0.1)
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32))
    """

    def __init__(self, temperature: float = 0.1, *, form: Form = "nt_xent",
                 gather_distributed: bool = False, gather_fn: GatherFn | None = None,
                 check_finite: bool = True, tile_size: TileSize = "auto",
                 reduction: Reduction = "mean") -> None:
        super().__init__(form=form, gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size, reduction=reduction)
        self.temperature = check_positive("temperature", temperature)

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None) -> tuple[Tensor, Stats]:
        return _flat_nce(self.candidates(z0, z1, negatives), self.temperature, self.tile_size)


def _dual_temperature(cands: list[Candidates], temperature: float, temperature_beta: float,
                      tile_size: TileSize) -> tuple[Tensor, Stats]:
    def log_weights(c: Candidates, log_w_alpha: Tensor, plan: TilePlan) -> Tensor:
        with torch.no_grad():
            lse, pos = negative_lse(c, temperature_beta, plan)
            log_w_beta = F.logsigmoid(lse - pos)
        return log_w_beta - log_w_alpha

    return per_anchor_losses(cands, temperature, method="DualTemperature", tile_size=tile_size,
                             log_weights=log_weights)


def dual_temperature(z0: Tensor, z1: Tensor, temperature: float = 0.1,
                     temperature_beta: float = 1.0, *, negatives: Tensor | None = None,
                     form: Form = "nt_xent", gather_distributed: bool = False,
                     gather_fn: GatherFn | None = None, check_finite: bool = True,
                     tile_size: TileSize = "auto", reduction: Reduction = "mean") -> Tensor:
    """Dual temperature InfoNCE; arguments as :class:`DualTemperatureLoss`."""
    check_positive("temperature", temperature)
    check_positive("temperature_beta", temperature_beta)
    cands = functional_candidates(z0, z1, negatives, form=form,
                                  gather_distributed=gather_distributed, gather_fn=gather_fn,
                                  check_finite=check_finite, tile_size=tile_size,
                                  reduction=reduction)
    return reduce(_dual_temperature(cands, temperature, temperature_beta, tile_size)[0],
                  reduction)


class DualTemperatureLoss(ContrastiveLoss):
    """Dual temperature InfoNCE (Zhang et al., CVPR 2022): ``sg(W_beta / W_alpha) * L_alpha``.

    ``temperature`` (tau_alpha) shapes the intra-anchor hardness; ``temperature_beta`` sets
    the inter-anchor weight through ``W_beta = 1 - P_pos(tau_beta)``. Weights are computed in log
    space, so easy positives (W_alpha -> 0) do not overflow. The functional form is
    :func:`dual_temperature`.

    Examples:
        >>> loss_fn = DualTemperatureLoss(temperature=0.1, temperature_beta=1.0)
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32))
    """

    def __init__(self, temperature: float = 0.1, temperature_beta: float = 1.0, *,
                 form: Form = "nt_xent", gather_distributed: bool = False,
                 gather_fn: GatherFn | None = None, check_finite: bool = True,
                 tile_size: TileSize = "auto", reduction: Reduction = "mean") -> None:
        super().__init__(form=form, gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size, reduction=reduction)
        self.temperature = check_positive("temperature", temperature)
        self.temperature_beta = check_positive("temperature_beta", temperature_beta)

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None) -> tuple[Tensor, Stats]:
        return _dual_temperature(self.candidates(z0, z1, negatives), self.temperature,
                                 self.temperature_beta, self.tile_size)
