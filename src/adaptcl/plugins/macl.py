"""Model-Aware Contrastive Learning (MACL).

References:
    - Huang et al., "Model-Aware Contrastive Learning: Towards Escaping the Dilemmas",
      ICML 2023 (linear temperature, Eq. 7; reweighting, Eq. 11; Algorithm 1).
    - Huang et al., "Model-Aware Contrastive Learning: Towards Escaping Uniformity-Tolerance
      Dilemma in Training", 2022 (exponential temperature tau0 * alpha**A, MACL-a; the
      W' = 2 - f.g reweighting variant, MACL-w).

MACL changes two parts of InfoNCE:

* the temperature: one scalar per batch from the alignment magnitude
  ``A = mean_i cos(f_i, g_i)`` (detached, averaged over ranks when distributed),
  ``tau_a = tau0 * (1 + alpha * (A - A0))`` (linear) or ``tau0 * alpha ** A`` (exp);
* the anchor weight: ``V_i = sg(1 / W_i)`` with ``W_i = 1 - P_pos`` (Eq. 11), or
  ``sg(W'_i / W_i)`` with ``W'_i = 2 - f_i . g_i``.

``tau_a`` is clamped to ``min_temperature`` (default ``temperature / 10``): the linear form
reaches zero or below whenever ``1 + alpha (A - A0) <= 0``, e.g. for the SimCSE setting
alpha = 2, A0 = 0.8 as soon as A < 0.3. alpha is not capped at 1.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from .base import (
    ContrastiveLoss,
    Reduction,
    Stats,
    labelled_candidates,
    per_anchor_losses,
    reduce,
)
from .candidates import Candidates, Form, alignment_magnitude
from .distributed import GatherFn
from .execution import TilePlan
from .hardness import HardnessMode, check_hardness, hardness_spec
from .validation import (
    TileSize,
    check_choice,
    check_finite_number,
    check_non_negative,
    check_positive,
)

#: MACL's temperature rule: linear in A (the paper) or exponential (its earlier version)
TemperatureForm = Literal["linear", "exp"]
TEMPERATURE_FORMS: tuple[TemperatureForm, ...] = get_args(TemperatureForm)
#: MACL's reweighting: ``1 / W`` (Eq. 11) or ``W' / W`` (MACL-w)
WeightForm = Literal["inverse", "w_prime"]
WEIGHT_FORMS: tuple[WeightForm, ...] = get_args(WeightForm)


def macl_temperature(alignment: Tensor, temperature: float | Tensor, alpha: float,
                     a0: float = 0.0, *, temperature_form: TemperatureForm = "linear",
                     min_temperature: float | Tensor | None = None) -> Tensor:
    """MACL's alignment-adaptive temperature, clamped below at ``min_temperature``.

    Args:
        alignment: the alignment magnitude A (mean positive cosine), 0-d tensor.
        temperature: tau0; a python number, or a 0-d tensor that keeps its gradient (CLIP's
            ``1 / logit_scale``: the adaptive factor is detached, tau0 is not).
        alpha: scaling factor (linear) or base (exp, > 0).
        a0: initial alignment threshold A0 (linear form only).
        temperature_form: ``"linear"`` (ICML 2023 Eq. 7) or ``"exp"`` (tau0 * alpha**A).
        min_temperature: positive floor (a number or a 0-d tensor); default
            ``temperature / 10``.
    """
    floor = temperature / 10 if min_temperature is None else min_temperature
    a = alignment.detach()
    if temperature_form == "linear":
        tau = temperature * (1 + alpha * (a - a0))
    else:
        tau = temperature * torch.pow(alpha, a)
    return tau.clamp(min=floor)


def _macl_options(temperature: float, alpha: float, a0: float, reweight: bool, adaptive: bool,
                  temperature_form: TemperatureForm, weight_form: WeightForm,
                  min_temperature: float | None,
                  positive_in_denominator: bool, hardness_mode: HardnessMode | None = None,
                  hardness_strength: float = 0.0) -> dict:
    """MACL's hyper-parameters checked once for the module and the functional form."""
    temperature = check_positive("temperature", temperature)
    check_choice("temperature_form", temperature_form, TEMPERATURE_FORMS)
    alpha = (check_positive("alpha", alpha) if temperature_form == "exp" and adaptive
             else check_non_negative("alpha", alpha))
    if reweight and not positive_in_denominator:
        raise ValueError(
            "reweight=True needs positive_in_denominator=True: with the positive out of the "
            "denominator (DCL/GraphCL) the gradient carries no W to undo; pass reweight=False"
        )
    return {
        "temperature": temperature, "alpha": alpha, "a0": check_finite_number("a0", a0),
        "reweight": bool(reweight), "adaptive": bool(adaptive),
        "temperature_form": temperature_form,
        "weight_form": check_choice("weight_form", weight_form, WEIGHT_FORMS),
        "min_temperature": (temperature / 10 if min_temperature is None
                            else check_positive("min_temperature", min_temperature)),
        "positive_in_denominator": bool(positive_in_denominator),
        **dict(zip(("hardness_mode", "hardness_strength"),
                   check_hardness(hardness_mode, hardness_strength), strict=True)),
    }


def _batch_temperature(alignment: Tensor, *, temperature: float | Tensor, alpha: float,
                       a0: float, adaptive: bool, temperature_form: TemperatureForm,
                       min_temperature: float | Tensor) -> Tensor:
    if not adaptive:
        if isinstance(temperature, Tensor):  # a tau0 that keeps its gradient
            return temperature.to(alignment.dtype)
        return torch.full_like(alignment, temperature)
    return macl_temperature(alignment, temperature, alpha, a0, temperature_form=temperature_form,
                            min_temperature=min_temperature)


def _macl(cands: list[Candidates], *, temperature: float | Tensor, alpha: float, a0: float,
          reweight: bool, adaptive: bool, temperature_form: TemperatureForm,
          weight_form: WeightForm,
          min_temperature: float | Tensor, positive_in_denominator: bool,
          hardness_mode: HardnessMode | None,
          hardness_strength: float, tile_size: TileSize,
          all_reduce: bool) -> tuple[Tensor, Stats]:
    """MACL's per-anchor losses and statistics on prepared candidates."""
    a = alignment_magnitude(cands, all_reduce=all_reduce)
    tau = _batch_temperature(a, temperature=temperature, alpha=alpha, a0=a0, adaptive=adaptive,
                             temperature_form=temperature_form, min_temperature=min_temperature)

    def log_weights(c: Candidates, log_w: Tensor, plan: TilePlan) -> Tensor:
        if weight_form == "inverse":
            return -log_w
        return torch.log(2 - c.positive_sim.detach()) - log_w

    per_anchor, stats = per_anchor_losses(
        cands, tau, method="MACL", tile_size=tile_size,
        positive_in_denominator=positive_in_denominator,
        log_weights=log_weights if reweight else None,
        hardness=hardness_spec(hardness_mode, hardness_strength))
    stats["alignment"] = a
    return per_anchor, stats


class MACLLoss(ContrastiveLoss):
    """MACL loss (Huang et al., ICML 2023) with every switch of its ablations.

    ``MACLLoss(temperature=t, alpha=0, reweight=False)`` is exactly InfoNCE / NT-Xent and
    equals ``lightly.loss.NTXentLoss(t)`` in the default ``form="nt_xent"``.

    Args:
        temperature: tau0, the base temperature (> 0).
        alpha: scaling factor of the adaptive temperature (>= 0; the exp form needs > 0).
            Papers' settings: vision 0.5 (A0 0), MoCo 0.5 (tau0 0.15, A0 0.2), SimCSE 2 (tau0
            0.05, A0 0.8, no reweighting), GraphCL 0.5 (tau0 0.2 or 0.1, A0 0).
        a0: initial alignment threshold A0.
        reweight: multiply each anchor's loss by ``sg(1/W)`` (Eq. 11).
        adaptive: use the adaptive temperature; False keeps tau0 fixed.
        temperature_form: ``"linear"`` (Eq. 7) or ``"exp"`` (earlier version, MACL-a).
        weight_form: ``"inverse"`` (sg(1/W)) or ``"w_prime"`` (sg(W'/W), W' = 2 - f.g, MACL-w).
        min_temperature: floor of the adaptive temperature, default ``temperature / 10``.
        form: candidate set (``"nt_xent"``, ``"cross_view"``, ``"cross_view_symmetric"``,
            ``"queue"``).
        positive_in_denominator: False gives MACL on the DCL/GraphCL loss; reweighting is then
            meaningless (the DCL gradient has no W) and must be off.
        hardness_mode, hardness_strength: the hardness term of
            :mod:`adaptcl.plugins.hardness` (sentence-transformers' semantics; off by default).
        gather_distributed / gather_fn: as in :class:`~adaptcl.plugins.InfoNCELoss`; the
            alignment is all-reduced so every rank uses the same temperature.
        tile_size: ``"auto"`` (default), ``None`` (materialise) or an int (stream the
            similarity matrix in tiles: Inf-CL, Cheng et al. 2024), as in
            :class:`~adaptcl.plugins.InfoNCELoss`. Tiles are exact: A is a mean over the
            row-wise positives, the detached temperature is folded into the anchors and
            ``V = exp(lse_all - lse_neg)`` needs only ``lse_neg`` and the positive logit.

    ``forward(z0, z1, negatives=None, *, labels=None, negative_labels=None,
    negative_owners=None)``: ``labels`` give multi-positive (SupCon) targets with MACL's
    temperature (:mod:`adaptcl.plugins.targets`; needs ``reweight=False``).

    After each call ``last_stats`` holds ``loss``, ``plain_loss`` (the unweighted InfoNCE),
    ``alignment``, ``temperature``, ``mean_w`` and ``positive_probability``.

    Examples:
        >>> loss_fn = MACLLoss(temperature=0.1, alpha=0.5, a0=0.0)
        >>> z0, z1 = torch.randn(8, 32), torch.randn(8, 32)
        >>> loss = loss_fn(z0, z1)
        >>> tau = loss_fn.last_stats["temperature"]
        >>> huge = MACLLoss(0.1, 0.5, tile_size=4096)  # batch 65,536 in a few GiB
    """

    takes_labels = True
    takes_owners = True

    def __init__(self, temperature: float = 0.1, alpha: float = 0.5, a0: float = 0.0, *,
                 reweight: bool = True, adaptive: bool = True,
                 temperature_form: TemperatureForm = "linear",
                 weight_form: WeightForm = "inverse", min_temperature: float | None = None,
                 form: Form = "nt_xent", positive_in_denominator: bool = True,
                 hardness_mode: HardnessMode | None = None, hardness_strength: float = 0.0,
                 gather_distributed: bool = False, gather_fn: GatherFn | None = None,
                 check_finite: bool = True, tile_size: TileSize = "auto",
                 reduction: Reduction = "mean") -> None:
        super().__init__(form=form, gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size, reduction=reduction)
        options = _macl_options(temperature, alpha, a0, reweight, adaptive, temperature_form,
                                weight_form, min_temperature, positive_in_denominator,
                                hardness_mode, hardness_strength)
        for name, value in options.items():
            setattr(self, name, value)

    def _options(self) -> dict:
        return {name: getattr(self, name) for name in (
            "temperature", "alpha", "a0", "reweight", "adaptive", "temperature_form",
            "weight_form", "min_temperature", "positive_in_denominator", "hardness_mode",
            "hardness_strength")}

    def current_temperature(self, alignment: Tensor) -> Tensor:
        """The temperature this loss uses for a batch of alignment ``alignment``."""
        options = self._options()
        for name in ("reweight", "weight_form", "positive_in_denominator", "hardness_mode",
                     "hardness_strength"):
            del options[name]
        return _batch_temperature(alignment, **options)

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None,
                **pairs: Tensor) -> tuple[Tensor, Stats]:
        return self.compute_from_candidates(self.candidates(z0, z1, negatives, **pairs))

    def compute_from_candidates(self, cands: list[Candidates], *,
                                temperature: Tensor | None = None,
                                min_temperature: Tensor | float | None = None
                                ) -> tuple[Tensor, Stats]:
        """MACL's per-anchor losses on prepared candidates (adapters that build their own).

        ``temperature`` replaces tau0 for this call: a 0-d tensor whose gradient is kept (the
        open_clip adapter's ``1 / logit_scale``); its floor is then ``min_temperature``, by
        default ``temperature / 10``.
        """
        options = self._options()
        if temperature is not None:
            options["temperature"] = temperature
            options["min_temperature"] = (temperature / 10 if min_temperature is None
                                          else min_temperature)
        return _macl(cands, **options, tile_size=self.tile_size, all_reduce=self.gathers)

    def extra_repr(self) -> str:
        return (f"temperature={self.temperature}, alpha={self.alpha}, a0={self.a0}, "
                f"reweight={self.reweight}, adaptive={self.adaptive}, "
                f"temperature_form={self.temperature_form!r}, weight_form={self.weight_form!r}, "
                f"{super().extra_repr()}")


def macl(z0: Tensor, z1: Tensor, temperature: float = 0.1, alpha: float = 0.5, a0: float = 0.0,
         *, negatives: Tensor | None = None, reweight: bool = True, adaptive: bool = True,
         temperature_form: TemperatureForm = "linear", weight_form: WeightForm = "inverse",
         min_temperature: float | None = None, form: Form = "nt_xent",
         positive_in_denominator: bool = True, hardness_mode: HardnessMode | None = None,
         hardness_strength: float = 0.0, labels: Tensor | None = None,
         negative_labels: Tensor | None = None, negative_owners: Tensor | None = None,
         gather_distributed: bool = False, gather_fn: GatherFn | None = None,
         check_finite: bool = True, tile_size: TileSize = "auto",
         reduction: Reduction = "mean") -> Tensor:
    """Functional MACL; arguments as :class:`MACLLoss` (and its ``forward``).

    Examples:
        >>> loss = macl(torch.randn(8, 32), torch.randn(8, 32), 0.1, alpha=0.5)
    """
    options = _macl_options(temperature, alpha, a0, reweight, adaptive, temperature_form,
                            weight_form, min_temperature, positive_in_denominator,
                            hardness_mode, hardness_strength)
    cands = labelled_candidates(z0, z1, negatives, labels, negative_labels, negative_owners,
                                form=form, gather_distributed=gather_distributed,
                                gather_fn=gather_fn, check_finite=check_finite,
                                tile_size=tile_size, reduction=reduction)
    per_anchor, _ = _macl(cands, **options, tile_size=tile_size,
                          all_reduce=gather_distributed or gather_fn is not None)
    return reduce(per_anchor, reduction)


__all__ = ["TemperatureForm", "TEMPERATURE_FORMS", "WeightForm", "WEIGHT_FORMS", "MACLLoss",
           "macl", "macl_temperature"]
