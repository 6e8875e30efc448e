"""DySTreSS: InfoNCE with a per-pair temperature from the pair's cosine similarity.

Reference:
    Manna, Chattopadhyay, Dey, Pal & Bhattacharya, "Dynamically Scaled Temperature in
    Self-Supervised Contrastive Learning", IEEE Transactions on Artificial Intelligence 2025
    (arXiv:2308.01140); code: github.com/sadimanna/DySTreSS.

DySTreSS changes the temperature of InfoNCE: the pair ``(i, j)`` with cosine ``s_ij`` gets

``tau_ij = tau_min + 1/2 (tau_max - tau_min) (1 + cos(pi (1 + s_ij)))``   (``shape="cosine"``)

which is ``tau_max`` at ``s = +-1`` (the positives and the hardest negatives) and ``tau_min``
at ``s = 0`` (the bulk of the negatives), and the logit is ``s_ij / tau_ij``.

What the authors' code does, and what this module follows:

* **the function.** The cosine form above is the paper's and the one of the authors' ImageNet
  code (``TSNTXentLoss.get_temp``, ``TSDCLLoss.get_temp``, defaults ``min_temp=0.1``,
  ``max_temp=0.2``); it is the default here, with the same ``(0.1, 0.2)``. The code also has
  a piecewise variant, ``shape="piecewise"``: ``tau_max`` above a threshold ``t`` and
  ``tau_min + 1/2 (tau_max - tau_min) (1 + cos(pi (s - t) / w))`` at or below it. The authors
  use it with different constants in different places: ``t = 0.4, w = 0.7`` in their SimCSE
  run (``get_temp2(cos, 0.04, 0.05)``, the one their sentence-embedding results use) and in
  ``TSNTXentLoss.get_temp2`` (not called), ``t = -0.2, w = 0.8`` as ``--func cosconst`` in the
  CIFAR script, ``t = -0.4, w = 0.8`` in ``TSDCLLoss.get_temp2`` (not called). The defaults
  here, ``threshold=0.4, width=0.7``, are their SimCSE run's.
* **detaching.** The temperature is computed from detached cosines in the NT-Xent code
  (``logits / get_temp(logits.detach())``), the CIFAR script and the SimCSE code: the gradient
  of ``s / tau(s)`` is ``1 / tau`` there. Their DCL variant (``TSDCLLoss``) does not detach,
  so its gradient also flows through ``tau(s)``. ``detach_temperature=True`` (default)
  follows the former, ``False`` the latter in this one respect only.
* **the DCL formula.** ``positive_in_denominator=False`` is the corrected DCL: one
  log-sum-exp over all the anchor's negatives (same-view and cross-view together), as
  Lightly's ``DCLLoss`` since 1.5.21; with equal temperatures it equals Lightly 1.6's
  ``DCLLoss`` to float64 precision (about 1e-15). It is *not* the value of the authors'
  ``TSDCLLoss``, which adds two separate log-sum-exp terms (over the same-view and over the
  cross-view negatives), the DCL formula Lightly corrected in 1.5.21: the two differ by
  50-90 % on random batches. ``DySTreSSLoss(positive_in_denominator=False,
  detach_temperature=False)`` is therefore their DCL's temperature rule and gradient path on
  the corrected DCL, not a reproduction of their DCL numbers.
* **which pairs.** Every pair, the positive included: the NT-Xent and SimCSE code divide the
  whole logit matrix (positive column too) by the per-pair temperatures, and the CIFAR script
  applies the same function to the positives and to the negatives.

With ``min_temperature == max_temperature`` it is InfoNCE at that temperature (to float64
precision: the temperature divides the cosine instead of being folded into the anchors).
The temperature enters each tile elementwise (:class:`~adaptcl.plugins.tiles._loop.TileTerm`), so
the tiled path is exact; labels (:mod:`~adaptcl.plugins.targets`), the hardness term
(:mod:`~adaptcl.plugins.hardness`) and every candidate set combine with it.
``last_stats["temperature"]`` is the mean temperature of the positive pairs.

The DySTreSS paper reports gains over MACL on CIFAR, ImageNet-100 and SimCSE; compare the two
with the same recipe: ``build_ssl_module("simclr", "dystress")`` against ``"macl"``,
``make_loss("dystress", model)`` against ``"macl"``, ``graphcl_loss("dystress")``.
"""

from __future__ import annotations

import math
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
from .candidates import Candidates, Form
from .distributed import GatherFn
from .hardness import HardnessMode, check_hardness, hardness_spec
from .tiles._budget import LOGIT_COPIES
from .tiles._terms import SimilarityTemperature
from .validation import TileSize, check_bool, check_choice, check_finite_number, check_positive

__all__ = ["Shape", "DySTreSSLoss", "dystress", "dystress_temperature", "SHAPES"]

#: the temperature functions: the paper's cosine, the authors' piecewise variant
Shape = Literal["cosine", "piecewise"]
SHAPES: tuple[Shape, ...] = get_args(Shape)


def dystress_temperature(s: Tensor, min_temperature: float = 0.1, max_temperature: float = 0.2,
                         *, shape: Shape = "cosine", threshold: float = 0.4,
                         width: float = 0.7) -> Tensor:
    """DySTreSS's temperature of the pairs with cosines ``s`` (elementwise, differentiable).

    Args:
        s: cosine similarities, any shape.
        min_temperature, max_temperature: tau_min and tau_max.
        shape: ``"cosine"`` (the paper's function) or ``"piecewise"`` (the authors' variant:
            ``max_temperature`` above ``threshold``, a cosine ramp of half-period ``width``
            below it).

    Examples:
        >>> dystress_temperature(torch.tensor([-1.0, 0.0, 1.0]))
        tensor([0.2000, 0.1000, 0.2000])
    """
    half_span = 0.5 * (max_temperature - min_temperature)
    if shape == "cosine":
        return min_temperature + half_span * (1 + torch.cos(math.pi * (1 + s)))
    ramp = min_temperature + half_span * (1 + torch.cos(math.pi * (s - threshold) / width))
    return torch.where(s > threshold, torch.full_like(s, max_temperature), ramp)


class _PairTemperatureTerm:
    """``s / tau(s)`` elementwise (a :class:`~adaptcl.plugins.tiles._loop.TileTerm`), with its
    derivative written out for the recomputing backward."""

    def __init__(self, min_temperature: float, max_temperature: float, shape: Shape,
                 threshold: float, width: float, detach: bool) -> None:
        self.min, self.max, self.shape = min_temperature, max_temperature, shape
        self.threshold, self.width, self.detach = threshold, width, detach

    def temperature(self, s: Tensor) -> Tensor:
        return dystress_temperature(s, self.min, self.max, shape=self.shape,
                                    threshold=self.threshold, width=self.width)

    def logits(self, s: Tensor) -> Tensor:
        tau = self.temperature(s)
        return s / (tau.detach() if self.detach else tau)

    def slope(self, s: Tensor) -> Tensor:
        tau = self.temperature(s)
        if self.detach:
            return 1.0 / tau
        half_span = 0.5 * (self.max - self.min)
        if self.shape == "cosine":
            d_tau = -half_span * math.pi * torch.sin(math.pi * (1 + s))
        else:
            rate = math.pi / self.width
            d_tau = (-half_span * rate) * torch.sin(rate * (s - self.threshold))
            d_tau = torch.where(s > self.threshold, torch.zeros_like(d_tau), d_tau)
        # d(s / tau(s)) / ds = 1 / tau - s tau'(s) / tau^2
        return (tau - s * d_tau) / (tau * tau)

    def describe(self) -> SimilarityTemperature:
        """This term as the tiles' typed description (the fused kernel computes it)."""
        return SimilarityTemperature(self.shape, self.min, self.max, self.threshold, self.width,
                                     self.detach)


def _dystress_options(min_temperature: float, max_temperature: float, shape: Shape,
                      threshold: float, width: float, detach_temperature: bool,
                      positive_in_denominator: bool, hardness_mode: HardnessMode | None,
                      hardness_strength: float) -> dict:
    """DySTreSS's hyper-parameters checked once for the module and the functional form."""
    low = check_positive("min_temperature", min_temperature)
    high = check_positive("max_temperature", max_temperature)
    if low > high:
        raise ValueError(f"min_temperature must be <= max_temperature, got {low} > {high}")
    mode, strength = check_hardness(hardness_mode, hardness_strength)
    return {"min_temperature": low, "max_temperature": high,
            "shape": check_choice("shape", shape, SHAPES),
            "threshold": check_finite_number("threshold", threshold),
            "width": check_positive("width", width),
            "detach_temperature": check_bool("detach_temperature", detach_temperature),
            "positive_in_denominator": check_bool("positive_in_denominator",
                                                  positive_in_denominator),
            "hardness_mode": mode, "hardness_strength": strength}


def _dystress(cands: list[Candidates], *, min_temperature: float, max_temperature: float,
              shape: Shape, threshold: float, width: float, detach_temperature: bool,
              positive_in_denominator: bool, hardness_mode: HardnessMode | None,
              hardness_strength: float,
              tile_size: TileSize) -> tuple[Tensor, Stats]:
    """DySTreSS's per-anchor losses and statistics on prepared candidates."""
    term = _PairTemperatureTerm(min_temperature, max_temperature, shape, threshold, width,
                                detach_temperature)
    tau_positive = term.temperature(cands[0].positive_sim.detach())
    # the per-pair temperatures add a fourth [A, C] matrix to the materialised peak
    return per_anchor_losses(cands, tau_positive, method="DySTreSS", tile_size=tile_size,
                             positive_in_denominator=positive_in_denominator, term=term,
                             hardness=hardness_spec(hardness_mode, hardness_strength),
                             copies=LOGIT_COPIES + 1)


class DySTreSSLoss(ContrastiveLoss):
    """DySTreSS (Manna et al., IEEE TAI 2025): InfoNCE with per-pair temperatures
    ``tau(cos)``; see :mod:`adaptcl.plugins.dystress` for what follows the authors' code.

    Args:
        min_temperature, max_temperature: tau_min and tau_max (authors' ImageNet SimCLR:
            0.1 and 0.2, the defaults; their SimCSE run: 0.04 and 0.05 with the piecewise
            shape).
        shape: ``"cosine"`` (the paper's function, default) or ``"piecewise"``.
        threshold, width: the piecewise shape's threshold ``t`` and half-period ``w``
            (defaults 0.4 and 0.7, the authors' SimCSE run); unused by ``"cosine"``.
        detach_temperature: compute tau from detached cosines (default, the authors' NT-Xent
            and SimCSE code); ``False`` lets the gradient flow through tau (as their DCL
            code, ``TSDCLLoss``, does).
        positive_in_denominator: ``False`` gives the DCL form (GraphCL's loss with per-pair
            temperatures): the corrected DCL of Lightly's ``DCLLoss`` (one log-sum-exp over
            all negatives), not ``TSDCLLoss``'s two separate log-sum-exps (module docstring).
        hardness_mode, hardness_strength: the hardness term of :mod:`adaptcl.plugins.hardness`
            (off by default).
        form, gather_distributed, gather_fn, check_finite, tile_size, reduction: as in
            :class:`~adaptcl.plugins.InfoNCELoss`.

    ``forward(z0, z1, negatives=None, *, labels=None, negative_labels=None,
    negative_owners=None)``: ``labels`` give multi-positive (SupCon) targets
    (:mod:`adaptcl.plugins.targets`). After each call ``last_stats`` holds ``loss``,
    ``plain_loss``, ``alignment``, ``temperature`` (the mean temperature of the positive
    pairs), ``mean_w`` and ``positive_probability``. The functional form is :func:`dystress`.

    Examples:
        >>> loss_fn = DySTreSSLoss(min_temperature=0.1, max_temperature=0.2)
        >>> z0, z1 = torch.randn(8, 32), torch.randn(8, 32)
        >>> loss = loss_fn(z0, z1)
        >>> tau_pos = loss_fn.last_stats["temperature"]
        >>> simcse = DySTreSSLoss(0.04, 0.05, shape="piecewise", form="cross_view")
    """

    takes_labels = True
    takes_owners = True

    def __init__(self, min_temperature: float = 0.1, max_temperature: float = 0.2, *,
                 shape: Shape = "cosine", threshold: float = 0.4, width: float = 0.7,
                 detach_temperature: bool = True, positive_in_denominator: bool = True,
                 hardness_mode: HardnessMode | None = None, hardness_strength: float = 0.0,
                 form: Form = "nt_xent", gather_distributed: bool = False,
                 gather_fn: GatherFn | None = None, check_finite: bool = True,
                 tile_size: TileSize = "auto", reduction: Reduction = "mean") -> None:
        super().__init__(form=form, gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size, reduction=reduction)
        options = _dystress_options(min_temperature, max_temperature, shape, threshold, width,
                                    detach_temperature, positive_in_denominator, hardness_mode,
                                    hardness_strength)
        for name, value in options.items():
            setattr(self, name, value)

    def _options(self) -> dict:
        return {name: getattr(self, name) for name in (
            "min_temperature", "max_temperature", "shape", "threshold", "width",
            "detach_temperature", "positive_in_denominator", "hardness_mode",
            "hardness_strength")}

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None,
                **pairs: Tensor) -> tuple[Tensor, Stats]:
        return self.compute_from_candidates(self.candidates(z0, z1, negatives, **pairs))

    def compute_from_candidates(self, cands: list[Candidates]) -> tuple[Tensor, Stats]:
        """DySTreSS's per-anchor losses on prepared candidates (adapters that build their own)."""
        return _dystress(cands, **self._options(), tile_size=self.tile_size)

    def extra_repr(self) -> str:
        shape = (f"shape='piecewise', threshold={self.threshold}, width={self.width}"
                 if self.shape == "piecewise" else "shape='cosine'")
        hardness = ("" if self.hardness_mode is None else
                    f", hardness_mode={self.hardness_mode!r}, "
                    f"hardness_strength={self.hardness_strength}")
        return (f"min_temperature={self.min_temperature}, "
                f"max_temperature={self.max_temperature}, {shape}, "
                f"detach_temperature={self.detach_temperature}, positive_in_denominator="
                f"{self.positive_in_denominator}{hardness}, {super().extra_repr()}")


def dystress(z0: Tensor, z1: Tensor, min_temperature: float = 0.1, max_temperature: float = 0.2,
             *, negatives: Tensor | None = None, shape: Shape = "cosine", threshold: float = 0.4,
             width: float = 0.7, detach_temperature: bool = True,
             positive_in_denominator: bool = True, hardness_mode: HardnessMode | None = None,
             hardness_strength: float = 0.0, labels: Tensor | None = None,
             negative_labels: Tensor | None = None, negative_owners: Tensor | None = None,
             form: Form = "nt_xent", gather_distributed: bool = False,
             gather_fn: GatherFn | None = None, check_finite: bool = True,
             tile_size: TileSize = "auto", reduction: Reduction = "mean") -> Tensor:
    """Functional DySTreSS; arguments as :class:`DySTreSSLoss` (and its ``forward``).

    Examples:
        >>> loss = dystress(torch.randn(8, 32), torch.randn(8, 32), 0.1, 0.2)
    """
    options = _dystress_options(min_temperature, max_temperature, shape, threshold, width,
                                detach_temperature, positive_in_denominator, hardness_mode,
                                hardness_strength)
    cands = labelled_candidates(z0, z1, negatives, labels, negative_labels, negative_owners,
                                form=form, gather_distributed=gather_distributed,
                                gather_fn=gather_fn, check_finite=check_finite,
                                tile_size=tile_size, reduction=reduction)
    return reduce(_dystress(cands, **options, tile_size=tile_size)[0], reduction)
