"""The adaptive-contrastive-loss core, in plain PyTorch (imports no framework).

Every method is InfoNCE with one part changed: the candidate set
(:mod:`~adaptcl.plugins.candidates`), the temperature (MACL, AMCL, a cosine schedule in
:mod:`~adaptcl.plugins.schedule`, a learned scalar in :mod:`~adaptcl.plugins.logit_scale`), the
target distribution (ASCL) or the anchor weight (MACL, Dual temperature). One similarity step
serves every loss; one numerically stable kernel (:mod:`~adaptcl.plugins.kernel`) serves the
InfoNCE family (InfoNCE, DCL, FlatNCE, Dual temperature, MACL, the temperature schedule and the
learnable temperature, ASCL, DySTreSS); AMCL's learned pair temperatures and the survey losses
have their own per-anchor terms on the same candidates. Three per-pair parts combine with the
kernel's losses: DySTreSS's temperature from each pair's cosine
(:mod:`~adaptcl.plugins.dystress`), multi-positive targets from ``labels`` (SupCon,
:mod:`~adaptcl.plugins.targets`) and sentence-transformers' hardness term
(:mod:`~adaptcl.plugins.hardness`). Each path can be materialised or streamed in tiles by the
method-agnostic engine in :mod:`~adaptcl.plugins.tiles._loop`.

Like ``torch.nn.functional`` and ``torch.nn``, every loss has a functional form in
:mod:`adaptcl.plugins.functional` (``info_nce``, ``dcl``, ``flat_nce``, ``dual_temperature``,
``macl``, ``dystress``, ``temperature_schedule``, ``learnable_temperature``, ``ascl``,
``ascl_byol``, ``amcl``, ``amcl_simsiam``, ``amcl_barlow_twins``, ``margin_contrastive``,
``triplet``, ``nce``; all but ``ascl``, ``amcl`` and ``dystress``, whose names are those of
their modules, are also importable from here) with ``reduction="mean" | "sum" | "none"``
(per-anchor losses), and a module that validates its arguments once, calls the same code and
keeps what it last computed in ``loss.last_stats``. Two-view modules are called like Lightly's
losses, ``loss(z0, z1)``, plus an optional ``negatives=`` tensor; all share the keywords
``gather_distributed``, ``gather_fn``, ``check_finite``, ``tile_size`` (``"auto"``, ``None`` or
an int: how the logits are computed, :mod:`~adaptcl.plugins.execution`) and
``reduction``. Every other execution choice (what computes the tiles, the PyTorch loop or the
fused Triton kernel; the memory budget of ``tile_size="auto"``; the kernels' backward and
autotuning; the CPU's emulation of tensor cores; a debug switch) is a field of one scoped
setting, :class:`tiling` (a block changing only the fields it names) and :func:`set_tiling`
(the process-wide default), as ``torch.nn.attention.sdpa_kernel`` is for attention
(:mod:`~adaptcl.plugins.execution`); ``loss.last_stats.plan`` (a :class:`TilePlan`) says which
path a call took.
"""

from .amcl import AMCLLoss
from .amcl_noncontrastive import (
    AMCLBarlowTwinsLoss,
    AMCLSimSiamLoss,
    amcl_barlow_twins,
    amcl_simsiam,
)
from .amcl_temperature import ConstantTemperature, PairTemperature, omega
from .ascl import ASCLBYOLLoss, ASCLLoss, ascl_byol, soft_labels
from .base import ContrastiveLoss
from .candidates import FORMS, Candidates, build_candidates
from .dystress import DySTreSSLoss, dystress_temperature
from .execution import TilePlan, TilingSetting, current_tiling, set_tiling, tiling
from .gradient_cache import BATCH_NORM_MODES, cached_forward
from .hardness import HARDNESS_MODES
from .heads import MultiHeadProjection
from .infonce import (
    DCLLoss,
    DualTemperatureLoss,
    FlatNCELoss,
    InfoNCELoss,
    dcl,
    dual_temperature,
    flat_nce,
    info_nce,
)
from .kernel import KernelOutput, contrastive_kernel
from .logit_scale import LearnableTemperatureLoss, learnable_temperature
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
from .schedule import (
    TemperatureScheduleLoss,
    advance_schedules,
    cosine_temperature,
    set_schedule_step,
    temperature_schedule,
)
from .survey import MarginContrastiveLoss, NCELoss, TripletLoss, margin_contrastive, nce, triplet
from .tiles._budget import LogitsBudgetWarning

__all__ = [
    "FORMS", "Candidates", "build_candidates", "KernelOutput", "contrastive_kernel",
    "ContrastiveLoss", "LogitsBudgetWarning", "tiling", "set_tiling", "current_tiling",
    "TilingSetting", "TilePlan",
    "InfoNCELoss", "DCLLoss", "FlatNCELoss", "DualTemperatureLoss", "info_nce", "dcl",
    "flat_nce", "dual_temperature",
    "MACLLoss", "macl", "macl_temperature",
    "DySTreSSLoss", "dystress_temperature", "HARDNESS_MODES",
    "TemperatureScheduleLoss", "temperature_schedule", "cosine_temperature", "set_schedule_step",
    "advance_schedules", "LearnableTemperatureLoss", "learnable_temperature",
    "ASCLLoss", "ASCLBYOLLoss", "ascl_byol", "soft_labels",
    "AMCLLoss", "AMCLSimSiamLoss", "AMCLBarlowTwinsLoss", "amcl_simsiam",
    "amcl_barlow_twins", "PairTemperature", "ConstantTemperature", "MultiHeadProjection", "omega",
    "MarginContrastiveLoss", "TripletLoss", "NCELoss", "margin_contrastive", "triplet", "nce",
    "alignment", "uniformity", "alignment_magnitude", "tolerance", "semantic_sensitivity",
    "gradient_scaling_factor", "w_statistics", "cached_forward", "BATCH_NORM_MODES",
]
