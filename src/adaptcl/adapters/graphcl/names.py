"""The losses :func:`~adaptcl.adapters.graphcl.graphcl_loss` builds, by name, and GraphCL's own
name for its loss. Imports no framework, so a command line lists them (``--help``) without
loading torch-geometric.

>>> LOSS_ALIASES
{'graphcl': 'dcl'}
"""

from __future__ import annotations

__all__ = ["LOSS_ALIASES", "LOSS_NAMES"]

#: the canonical loss names :func:`~adaptcl.adapters.graphcl.graphcl_loss` builds
#: (:mod:`adaptcl.registry`)
LOSS_NAMES = ("dcl", "infonce", "macl", "dystress", "temperature_schedule",
              "learnable_temperature")
#: GraphCL's own name for its loss: DCL in the cross-view form
LOSS_ALIASES = {"graphcl": "dcl"}
