"""Build a drop-in for open_clip's ``ClipLoss`` by loss name."""

from __future__ import annotations

from typing import Any

from adaptcl.registry import canonical_loss_name

from .base import AdaptiveClipLoss
from .infonce import DCLClipLoss, InfoNCEClipLoss
from .macl import MACLClipLoss
from .names import LOSS_NAMES
from .temperatures import DySTreSSClipLoss, TemperatureScheduleClipLoss

__all__ = ["build_clip_loss", "CLIP_LOSSES"]

#: the class of each name of :data:`~adaptcl.adapters.open_clip.names.LOSS_NAMES`
CLIP_LOSSES: dict[str, type[AdaptiveClipLoss]] = {
    "infonce": InfoNCEClipLoss, "dcl": DCLClipLoss, "macl": MACLClipLoss,
    "dystress": DySTreSSClipLoss, "temperature_schedule": TemperatureScheduleClipLoss,
}


def build_clip_loss(name: str, **options: Any) -> AdaptiveClipLoss:
    """The drop-in for ``ClipLoss`` named ``name`` (:data:`LOSS_NAMES`, the names of
    :mod:`adaptcl.registry`, case-insensitive), built with ``options`` (``ClipLoss``'s
    ``local_loss``, ``gather_with_grad``, ``cache_labels``, ``rank``, ``world_size``,
    ``use_horovod`` and the method's keywords).

    Examples:
        >>> build_clip_loss("macl", alpha=0.5, world_size=1)
        MACLClipLoss(
          local_loss=False, gather_with_grad=False
          (criterion): MACLLoss(...)
        )
    """
    key = canonical_loss_name(name, allowed=LOSS_NAMES)
    return CLIP_LOSSES[key](**options)
