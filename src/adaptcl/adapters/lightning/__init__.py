"""PyTorch Lightning training for the image methods, with Lightly's models and the adaptive losses.

Organised by job:

- :mod:`.methods` -- the methods (``"simclr"``, ``"moco"``, ``"simsiam"``, ``"barlowtwins"``,
  ``"ascl-moco"``) and the losses each accepts, by name; imports no framework, so a command
  line lists them in ``--help`` without loading Lightning;
- :mod:`.base` -- :class:`SSLModule`, what the methods' modules share: the optimiser and its
  schedule, logging the loss's statistics, the online kNN monitor, checkpoints and gradient
  caching;
- :mod:`.modules` -- the ``LightningModule`` of each method on it (:class:`SimCLRModule`,
  :class:`MoCoV2Module`, :class:`SimSiamModule`, :class:`BarlowTwinsModule`,
  :class:`ASCLMoCoModule`);
- :mod:`.backbones` -- the encoders: Lightly's CIFAR ResNet (:func:`cifar_resnet`) and
  :func:`small_cnn`;
- :mod:`.features` -- a frozen encoder's features (:func:`extract_features`) and Lightly's
  weighted kNN on them (:func:`knn_correct`), shared by the kNN monitor and the evaluation;
- :mod:`.resume` -- what a module carries across a resume, two framework-free mixins (the graph
  adapter's module takes them too): :class:`CheckpointedHistory`, its per-step lists in the
  checkpoint, and :class:`ResumeRecord`, where its training was resumed;
- :mod:`.caching` -- :class:`GradientCaching`, a module's encoders through exact gradient
  caching (``mini_batch_size=``; a mixin);
- :mod:`.settings` -- :class:`SSLModuleSettings`, the settings of a module as one typed,
  frozen object (no framework imported);
- :mod:`.factory` -- :func:`build_ssl_module` (a method and a loss by name, its settings),
  :func:`ssl_transforms`;
- :mod:`.trainer` -- :func:`build_trainer`, atomic checkpoints, the random states of a run, its
  clock and what a step costs (:class:`StepMeter`).

The names below are imported from their module on first use (``pip install 'adaptcl[vision]'``
for the Lightning ones).

References: MACL (Huang et al., ICML 2023, App. B.2-B.3); AMCL (Wang et al., ECCV 2024); ASCL
(Feng & Patras, ICPR 2022).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from adaptcl.adapters import lazy_exports
from adaptcl.adapters.lightning.methods import METHOD_LOSSES, METHODS, check_method_loss

if TYPE_CHECKING:  # pragma: no cover - for type checkers; at run time __getattr__ imports them
    from adaptcl.adapters.lightning.backbones import cifar_resnet, small_cnn
    from adaptcl.adapters.lightning.base import SSLModule
    from adaptcl.adapters.lightning.caching import GradientCaching
    from adaptcl.adapters.lightning.factory import build_ssl_module, ssl_transforms
    from adaptcl.adapters.lightning.features import extract_features, knn_correct
    from adaptcl.adapters.lightning.modules import (
        ASCLMoCoModule,
        BarlowTwinsModule,
        MoCoV2Module,
        SimCLRModule,
        SimSiamModule,
    )
    from adaptcl.adapters.lightning.resume import CheckpointedHistory, ResumeRecord
    from adaptcl.adapters.lightning.settings import SSLModuleSettings
    from adaptcl.adapters.lightning.trainer import (
        AtomicCheckpointIO,
        RandomStates,
        StepMeter,
        TrainingClock,
        build_trainer,
    )

_EXPORTS = {
    "SSLModule": "base",
    **dict.fromkeys(("SimCLRModule", "MoCoV2Module", "SimSiamModule", "BarlowTwinsModule",
                     "ASCLMoCoModule"), "modules"),
    "cifar_resnet": "backbones", "small_cnn": "backbones",
    "extract_features": "features", "knn_correct": "features",
    **dict.fromkeys(("build_ssl_module", "ssl_transforms"), "factory"),
    "SSLModuleSettings": "settings", "ResumeRecord": "resume", "CheckpointedHistory": "resume",
    **dict.fromkeys(("AtomicCheckpointIO", "RandomStates", "StepMeter", "TrainingClock",
                    "build_trainer"), "trainer"),
    "GradientCaching": "caching",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

__all__ = [
    "METHODS", "METHOD_LOSSES", "check_method_loss", "AtomicCheckpointIO", "SSLModule",
    "SimCLRModule", "MoCoV2Module", "SimSiamModule", "BarlowTwinsModule", "ASCLMoCoModule",
    "cifar_resnet", "small_cnn", "extract_features", "knn_correct", "RandomStates", "TrainingClock",
    "build_ssl_module", "build_trainer", "ssl_transforms", "SSLModuleSettings", "ResumeRecord",
    "StepMeter", "GradientCaching", "CheckpointedHistory",
]
