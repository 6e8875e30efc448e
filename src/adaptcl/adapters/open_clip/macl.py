"""MACL as a drop-in for open_clip's ``ClipLoss``: CLIP's learned temperature with MACL's
alignment-adaptive factor on top.

Reference:
    Huang et al., "Model-Aware Contrastive Learning: Towards Escaping the Dilemmas", ICML 2023
    (:mod:`adaptcl.plugins.macl`).
"""

from __future__ import annotations

from torch import Tensor

from adaptcl import plugins
from adaptcl.plugins.base import Stats
from adaptcl.plugins.macl import TemperatureForm, WeightForm
from adaptcl.plugins.validation import TileSize, check_positive

from .base import AdaptiveClipLoss
from .infonce import _temperature

__all__ = ["MACLClipLoss"]


class MACLClipLoss(AdaptiveClipLoss):
    """MACL (Huang et al., ICML 2023) in CLIP's symmetric form, a drop-in for ``ClipLoss``.

    How it uses ``logit_scale``: MACL's base temperature is CLIP's learned one,
    ``tau0 = 1 / logit_scale``, and the batch's temperature is

    ``tau = tau0 * (1 + alpha * (A - A0))`` (``temperature_form="linear"``; ``"exp"``:
    ``tau0 * alpha ** A``), clamped below at ``min_temperature`` (default ``tau0 / 10``),

    with ``A`` the mean cosine of the image-text pairs, detached (and averaged over every
    rank's pairs), as MACL detaches it. Why: in MACL tau0 is the one scale of the
    temperature and the factor only moves it with the alignment; in CLIP that scale is the
    model's learned ``logit_scale``, so it stays learned (it gets InfoNCE's gradient through
    tau0, scaled by the detached factor) and open_clip's training loop keeps clamping it.
    A fixed tau0 would freeze a parameter of the model and discard what CLIP learns. With
    ``alpha=0`` and ``reweight=False`` the loss is ``ClipLoss`` exactly. ``logit_bias``
    cancels in the softmax (see ``forward``).

    Args:
        local_loss, gather_with_grad, cache_labels, rank, world_size, use_horovod: as in
            ``ClipLoss`` (``use_horovod`` with ``local_loss`` on several ranks is refused: the
            alignment is averaged with torch.distributed).
        alpha, a0, reweight, adaptive, temperature_form, weight_form, positive_in_denominator: as
            in :class:`adaptcl.plugins.MACLLoss` (reweighting by ``sg(1 / W)``, Eq. 11, is on
            by default as there).
        min_temperature: an absolute floor of tau; ``None`` (default): ``tau0 / 10``.
        tile_size, check_finite: as in
            :class:`~adaptcl.adapters.open_clip.InfoNCEClipLoss`.

    ``labels`` (multi-positive targets) need ``reweight=False``. ``last_stats`` holds
    ``loss``, ``plain_loss`` (the unweighted InfoNCE), ``alignment`` (A), ``temperature``
    (tau), ``mean_w`` and ``positive_probability``.

    Examples:
        >>> loss_fn = MACLClipLoss(alpha=0.5)            # was: ClipLoss()
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32), torch.tensor(14.3))
        >>> tau = loss_fn.last_stats["temperature"]
    """

    def __init__(self, local_loss: bool = False, gather_with_grad: bool = False,
                 cache_labels: bool = False, rank: int = 0, world_size: int = 1,
                 use_horovod: bool = False, *, alpha: float = 0.5, a0: float = 0.0,
                 reweight: bool = True, adaptive: bool = True, temperature_form: TemperatureForm = "linear",
                 weight_form: WeightForm = "inverse", min_temperature: float | None = None,
                 positive_in_denominator: bool = True, tile_size: TileSize = "auto",
                 check_finite: bool = True) -> None:
        if min_temperature is not None:
            check_positive("min_temperature", min_temperature)
        if use_horovod and local_loss and world_size > 1:
            raise ValueError("MACLClipLoss with use_horovod=True needs local_loss=False: the "
                             "alignment of the local pairs is averaged with torch.distributed")
        # tau0 (here 1.0) is replaced at every call by 1 / logit_scale
        core = plugins.MACLLoss(1.0, alpha, a0, reweight=reweight, adaptive=adaptive,
                                temperature_form=temperature_form, weight_form=weight_form,
                                min_temperature=min_temperature,
                                positive_in_denominator=positive_in_denominator,
                                form="cross_view_symmetric",
                                gather_distributed=bool(local_loss) and world_size > 1,
                                tile_size=tile_size, check_finite=check_finite)
        super().__init__(local_loss, gather_with_grad, cache_labels, rank, world_size,
                         use_horovod, criterion=core)
        #: the floor of tau given by the user (``None``: tau0 / 10)
        self.min_temperature = min_temperature

    def _check_call(self, image_features: Tensor, text_features: Tensor,
                    labels: Tensor | None) -> Tensor | None:
        if labels is not None and self.criterion.reweight:
            raise ValueError("labels need reweight=False: MACL's W = 1 - P_pos scales the "
                             "whole gradient only when an anchor has one positive")
        if labels is not None and not self.criterion.positive_in_denominator:
            raise ValueError("labels need positive_in_denominator=True (SupCon's L_out)")
        return super()._check_call(image_features, text_features, labels)

    def compute(self, cands: list, logit_scale: Tensor | float) -> tuple[Tensor, Stats]:
        return self.criterion.compute_from_candidates(
            cands, temperature=_temperature(logit_scale, cands),
            min_temperature=self.min_temperature)
