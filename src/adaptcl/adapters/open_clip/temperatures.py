"""The temperature rules that replace CLIP's learned temperature, as drop-ins for open_clip's
``ClipLoss``: DySTreSS's per-pair temperatures and a cosine schedule of the training step.

Both ignore the model's ``logit_scale`` (their temperatures are the method: a function of
each pair's cosine, a function of the step); it gets an exact zero gradient, so DDP without
``find_unused_parameters`` still works, and each instance warns once.

References:
    - Manna et al., "Dynamically Scaled Temperature in Self-Supervised Contrastive Learning",
      IEEE TAI 2025 (:mod:`adaptcl.plugins.dystress`).
    - Kukleva et al., "Temperature Schedules for self-supervised contrastive methods on
      long-tail data", ICLR 2023 (:mod:`adaptcl.plugins.schedule`).
"""

from __future__ import annotations

from torch import Tensor

from adaptcl import plugins
from adaptcl.plugins.base import Stats
from adaptcl.plugins.dystress import Shape
from adaptcl.plugins.schedule import SCHEDULE_PAPER, ScheduleControls
from adaptcl.plugins.validation import TileSize

from .base import AdaptiveClipLoss

__all__ = ["DySTreSSClipLoss", "TemperatureScheduleClipLoss"]


class DySTreSSClipLoss(AdaptiveClipLoss):
    """DySTreSS (Manna et al., IEEE TAI 2025) in CLIP's symmetric form: each image-text pair
    ``(i, j)`` gets the temperature ``tau(cos_ij)`` between ``min_temperature`` and
    ``max_temperature`` (:class:`adaptcl.plugins.DySTreSSLoss`).

    How it uses ``logit_scale``: not at all. DySTreSS's temperature is a fixed function of
    each pair's cosine; a learned global scale on top is not the method (and would undo its
    shape as it learns), so ``logit_scale`` is ignored, with one warning per instance, and
    gets a zero gradient. ``logit_bias`` cancels in the softmax (see ``forward``). With
    ``min_temperature == max_temperature == 1 / s`` it is ``ClipLoss`` at ``logit_scale = s``.

    Args:
        local_loss, gather_with_grad, cache_labels, rank, world_size, use_horovod: as in
            ``ClipLoss``.
        min_temperature, max_temperature: tau_min and tau_max (the authors' SimCLR defaults, 0.1
            and 0.2; CLIP's learned tau ends near 0.01, so consider lower values).
        shape, threshold, width, detach_temperature, positive_in_denominator: as in
            :class:`adaptcl.plugins.DySTreSSLoss`.
        tile_size, check_finite: as in
            :class:`~adaptcl.adapters.open_clip.InfoNCEClipLoss`.

    ``labels`` give multi-positive targets. ``last_stats["temperature"]`` is the mean
    temperature of the positive pairs.

    Examples:
        >>> loss_fn = DySTreSSClipLoss(min_temperature=0.05, max_temperature=0.1)
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32), torch.tensor(14.3))
    """

    uses_logit_scale = False
    ignored_scale = "each pair's temperature is DySTreSS's function of its cosine"

    def __init__(self, local_loss: bool = False, gather_with_grad: bool = False,
                 cache_labels: bool = False, rank: int = 0, world_size: int = 1,
                 use_horovod: bool = False, *, min_temperature: float = 0.1,
                 max_temperature: float = 0.2, shape: Shape = "cosine", threshold: float = 0.4,
                 width: float = 0.7, detach_temperature: bool = True,
                 positive_in_denominator: bool = True, tile_size: TileSize = "auto",
                 check_finite: bool = True) -> None:
        core = plugins.DySTreSSLoss(min_temperature, max_temperature, shape=shape,
                                    threshold=threshold, width=width,
                                    detach_temperature=detach_temperature,
                                    positive_in_denominator=positive_in_denominator,
                                    form="cross_view_symmetric", tile_size=tile_size,
                                    check_finite=check_finite)
        super().__init__(local_loss, gather_with_grad, cache_labels, rank, world_size,
                         use_horovod, criterion=core)

    def _check_call(self, image_features: Tensor, text_features: Tensor,
                    labels: Tensor | None) -> Tensor | None:
        if labels is not None and not self.criterion.positive_in_denominator:
            raise ValueError("labels need positive_in_denominator=True (SupCon's L_out)")
        return super()._check_call(image_features, text_features, labels)

    def compute(self, cands: list, logit_scale: Tensor | float) -> tuple[Tensor, Stats]:
        return self.criterion.compute_from_candidates(cands)


class TemperatureScheduleClipLoss(ScheduleControls, AdaptiveClipLoss):
    """CLIP's symmetric InfoNCE at Kukleva et al.'s cosine schedule of the training step,
    ``tau(step) = tau_min + (tau_max - tau_min) (1 + cos(2 pi step / period)) / 2``
    (:class:`adaptcl.plugins.TemperatureScheduleLoss`).

    How it uses ``logit_scale``: not at all; the schedule is the temperature (in place of the
    learned one), so ``logit_scale`` is ignored, with one warning per instance, and gets a
    zero gradient. ``logit_bias`` cancels in the softmax (see ``forward``).

    Who sets the step: open_clip's training loop knows nothing of it. Set ``loss.step = step``
    before the forward pass (open_clip's ``train_one_epoch`` has ``step``), or call
    :meth:`advance` after ``optimizer.step()``; until then the loss counts its own steps, one
    per forward pass with gradients enabled (with ``--accum-freq k`` that counts ``k`` per
    optimiser step: set the step there). The step is saved in ``state_dict``.

    Args:
        local_loss, gather_with_grad, cache_labels, rank, world_size, use_horovod: as in
            ``ClipLoss``.
        min_temperature, max_temperature, period, step: the schedule (the authors': 0.1,
            1.0, 400 steps; CLIP's learned tau ends near 0.01, so consider lower values).
        positive_in_denominator: ``False`` gives DCL at the scheduled temperature.
        tile_size, check_finite: as in
            :class:`~adaptcl.adapters.open_clip.InfoNCEClipLoss`.

    Examples:
        >>> loss_fn = TemperatureScheduleClipLoss(min_temperature=0.01, max_temperature=0.1,
        ...                                       period=1000)
        >>> loss_fn.step = 250
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32), torch.tensor(14.3))
        >>> round(loss_fn.temperature, 3)
        0.055
    """

    takes_labels = False
    uses_logit_scale = False
    ignored_scale = "the temperature follows the schedule of the training step"

    def __init__(self, local_loss: bool = False, gather_with_grad: bool = False,
                 cache_labels: bool = False, rank: int = 0, world_size: int = 1,
                 use_horovod: bool = False, *,
                 min_temperature: float = SCHEDULE_PAPER["min_temperature"],
                 max_temperature: float = SCHEDULE_PAPER["max_temperature"],
                 period: int = SCHEDULE_PAPER["period"], step: int = 0,
                 positive_in_denominator: bool = True, tile_size: TileSize = "auto",
                 check_finite: bool = True) -> None:
        core = plugins.TemperatureScheduleLoss(min_temperature, max_temperature, period,
                                               step=step,
                                               positive_in_denominator=positive_in_denominator,
                                               form="cross_view_symmetric", tile_size=tile_size,
                                               check_finite=check_finite)
        super().__init__(local_loss, gather_with_grad, cache_labels, rank, world_size,
                         use_horovod, criterion=core)

    def compute(self, cands: list, logit_scale: Tensor | float) -> tuple[Tensor, Stats]:
        out = self.criterion.compute_from_candidates(cands)
        self.count_training_step()  # nothing drives the schedule: count the training steps
        return out
