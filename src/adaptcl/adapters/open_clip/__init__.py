"""open_clip adapter: adaptive losses as drop-ins for open_clip's ``ClipLoss``.

Each loss takes ``ClipLoss``'s constructor arguments (``local_loss``, ``gather_with_grad``,
``cache_labels``, ``rank``, ``world_size``, ``use_horovod``) with the same meaning and is called
as ``ClipLoss`` is, ``loss(image_features, text_features, logit_scale, logit_bias=None,
output_dict=False)`` (plus ``labels=`` for multi-positive targets), so open_clip's training
loop switches loss with one import:

- :class:`InfoNCEClipLoss` -- CLIP's loss (``tau = 1 / logit_scale``), equal to ``ClipLoss``
  in value and gradients, with a tiled path (``tile_size``) and ``labels``;
- :class:`MACLClipLoss` -- MACL: ``tau0 = 1 / logit_scale`` times the alignment-adaptive
  factor, optionally reweighted;
- :class:`DCLClipLoss` -- the positive out of the denominator;
- :class:`DySTreSSClipLoss`, :class:`TemperatureScheduleClipLoss` -- per-pair temperatures
  and a cosine schedule of the step, in place of the learned temperature (``logit_scale`` is
  ignored, with a warning);
- :func:`build_clip_loss` -- any of them by loss name (:data:`LOSS_NAMES`).

AMCL is not offered: it needs several projection heads per modality and a temperature
network, i.e. a different model, not a different loss on open_clip's features.

The names are imported from their module on first use (``pip install 'adaptcl[clip]'``);
:data:`LOSS_NAMES` imports no framework. The guide: ``docs/guides/open_clip.md``.

Example::

    from adaptcl.adapters.open_clip import MACLClipLoss   # was: from open_clip import ClipLoss
    loss = MACLClipLoss(local_loss=args.local_loss, gather_with_grad=args.gather_with_grad,
                        cache_labels=True, rank=args.rank, world_size=args.world_size)
    losses = loss(**model(images, texts), output_dict=True)
"""

from typing import TYPE_CHECKING

from adaptcl.adapters import lazy_exports
from adaptcl.adapters.open_clip.names import LOSS_NAMES

if TYPE_CHECKING:  # pragma: no cover - for type checkers; at run time __getattr__ imports them
    from .base import AdaptiveClipLoss
    from .factory import CLIP_LOSSES, build_clip_loss
    from .infonce import DCLClipLoss, InfoNCEClipLoss
    from .macl import MACLClipLoss
    from .temperatures import DySTreSSClipLoss, TemperatureScheduleClipLoss

_EXPORTS = {
    "AdaptiveClipLoss": "base",
    **dict.fromkeys(("CLIP_LOSSES", "build_clip_loss"), "factory"),
    **dict.fromkeys(("DCLClipLoss", "InfoNCEClipLoss"), "infonce"),
    "MACLClipLoss": "macl",
    **dict.fromkeys(("DySTreSSClipLoss", "TemperatureScheduleClipLoss"), "temperatures"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

__all__ = [
    "InfoNCEClipLoss", "DCLClipLoss", "MACLClipLoss", "DySTreSSClipLoss",
    "TemperatureScheduleClipLoss", "AdaptiveClipLoss", "build_clip_loss", "CLIP_LOSSES",
    "LOSS_NAMES",
]
