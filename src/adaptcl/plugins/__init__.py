"""The adaptive-contrastive-loss core, in plain PyTorch (imports no framework).

Every method is InfoNCE with one part changed: the candidate set
(:mod:`~adaptcl.plugins.candidates`), the temperature (MACL, AMCL), the target distribution
(ASCL) or the anchor weight (MACL, Dual temperature). One similarity step and one numerically
stable kernel (:mod:`~adaptcl.plugins.kernel`) serve all of them.

Two-view modules are called like Lightly's losses, ``loss(z0, z1)``, plus an optional
``negatives=`` tensor, and keep what they last computed in ``loss.last_stats``.
"""

from .amcl import (
    AMCLBarlowTwinsLoss,
    AMCLLoss,
    AMCLSimSiamLoss,
    ConstantTemperature,
    MultiHeadProjection,
    PairTemperature,
    omega,
)
from .ascl import ASCLBYOLLoss, ASCLLoss, soft_labels
from .base import ContrastiveLoss
from .candidates import FORMS, Candidates, build_candidates
from .infonce import DCLLoss, DualTemperatureLoss, FlatNCELoss, InfoNCELoss, dcl, info_nce
from .kernel import KernelOutput, contrastive_kernel
from .macl import MACLLoss, macl, macl_temperature
from .metrics import (
    alignment,
    alignment_magnitude,
    gradient_scaling_factor,
    semantic_sensitivity,
    tolerance,
    uniformity,
    w_statistics,
)
from .survey import MarginContrastiveLoss, NCELoss, TripletLoss

__all__ = [
    "FORMS", "Candidates", "build_candidates", "KernelOutput", "contrastive_kernel",
    "ContrastiveLoss",
    "InfoNCELoss", "DCLLoss", "FlatNCELoss", "DualTemperatureLoss", "info_nce", "dcl",
    "MACLLoss", "macl", "macl_temperature",
    "ASCLLoss", "ASCLBYOLLoss", "soft_labels",
    "AMCLLoss", "AMCLSimSiamLoss", "AMCLBarlowTwinsLoss", "PairTemperature",
    "ConstantTemperature", "MultiHeadProjection", "omega",
    "MarginContrastiveLoss", "TripletLoss", "NCELoss",
    "alignment", "uniformity", "alignment_magnitude", "tolerance", "semantic_sensitivity",
    "gradient_scaling_factor", "w_statistics",
]
