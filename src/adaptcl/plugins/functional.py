"""Every loss as a function, like ``torch.nn.functional``.

Each function takes the embeddings, the method's hyper-parameters and the keywords every loss
shares (``negatives``, ``form``, ``gather_distributed``, ``gather_fn``, ``check_finite``,
``tile_size``, ``reduction="mean" | "sum" | "none"``), validates them exactly as the module of
the same method does and runs the same code; ``reduction="none"`` returns per-anchor losses.
The modules (``InfoNCELoss``, ``MACLLoss``, ...) are thin wrappers that validate once and keep
``last_stats``.

Examples:
    >>> import torch
    >>> from adaptcl.plugins import functional as CF
    >>> z0, z1 = torch.randn(8, 32), torch.randn(8, 32)
    >>> loss = CF.macl(z0, z1, 0.1, alpha=0.5)
    >>> per_anchor = CF.info_nce(z0, z1, 0.5, reduction="none")  # [16]: 2N anchors
"""

from .amcl import amcl
from .amcl_noncontrastive import amcl_barlow_twins, amcl_simsiam
from .ascl import ascl, ascl_byol
from .dystress import dystress
from .infonce import dcl, dual_temperature, flat_nce, info_nce
from .logit_scale import learnable_temperature
from .macl import macl
from .schedule import temperature_schedule
from .survey import margin_contrastive, nce, triplet

__all__ = ["info_nce", "dcl", "flat_nce", "dual_temperature", "macl", "dystress",
           "temperature_schedule", "learnable_temperature", "ascl", "ascl_byol",
           "amcl", "amcl_simsiam", "amcl_barlow_twins", "margin_contrastive", "triplet", "nce"]
