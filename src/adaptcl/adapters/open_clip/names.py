"""The losses :func:`~adaptcl.adapters.open_clip.build_clip_loss` builds, by name. Imports no
framework, so a command line lists them (``--help``) without loading open_clip.

>>> LOSS_NAMES
('infonce', 'dcl', 'macl', 'dystress', 'temperature_schedule')
"""

from __future__ import annotations

__all__ = ["LOSS_NAMES"]

#: the canonical loss names (:mod:`adaptcl.registry`) with a drop-in for open_clip's
#: ``ClipLoss``. ``"learnable_temperature"`` is not among them: in open_clip the model learns
#: the temperature (its ``logit_scale``), so CLIP's own loss is ``"infonce"``.
LOSS_NAMES = ("infonce", "dcl", "macl", "dystress", "temperature_schedule")
