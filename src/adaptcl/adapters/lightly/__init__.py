"""Lightly adapter: drop-in losses, AMCL heads, an ASCL MoCo model and ASCL's transforms.

Organised like Lightly itself:

- :mod:`.loss` -- ``NTXentLoss``, ``DCLLoss``, ``DCLWLoss``, ``FlatNCELoss``,
  ``DualTemperatureLoss``, ``MACLLoss``, ``ASCLLoss``, ``AMCLLoss`` with the constructor order
  and call signature of ``lightly.loss`` (``loss = loss_fn(out0, out1)``), so a working
  Lightly pipeline switches to MACL (or DCL, ASCL, ...) by changing one import;
- :mod:`.dystress` -- ``DySTreSSLoss`` (per-pair temperatures), in the argument order of the
  authors' own Lightly loss;
- :mod:`.temperature` -- ``TemperatureScheduleLoss`` (a cosine schedule of the training step)
  and ``LearnableTemperatureLoss`` (CLIP's learned temperature), with the same signature;
- labels: ``loss_fn(out0, out1, labels)`` with the class of each pair (``[N]`` integers or
  one-hot rows) makes every same-class candidate a positive (SupCon) for ``NTXentLoss``,
  ``MACLLoss`` and ``DySTreSSLoss``; with a memory bank pass ``memory_bank_labels=True``;
- :mod:`.memory_bank` -- the one place where Lightly's ``MemoryBankModule`` and
  ``lightly.utils.dist.gather`` are wired to a core loss (and the persistent bank);
- :mod:`.heads` -- AMCL's multi-head projection built from any Lightly head;
- :mod:`.ascl_moco` -- the ASCL MoCo model (momentum encoder, weak keys, persistent queue);
- :mod:`.transforms` -- ASCL's strong/weak views.

The maths lives in :mod:`adaptcl.plugins`; every loss here keeps its core loss as
``criterion``. Lightly's bank buffer is ``persistent=False``: it is not saved in checkpoints.
Pass ``persistent_memory_bank=True`` (what :class:`ASCLMoCo` does) to save and restore it.

References:
    - MACL: Huang et al., "Model-Aware Contrastive Learning: Towards Escaping the Dilemmas",
      ICML 2023.
    - ASCL: Feng & Patras, "Adaptive Soft Contrastive Learning", ICPR 2022.
    - AMCL: Wang et al., "Adaptive Multi-head Contrastive Learning", ECCV 2024.
    - DCL: Yeh et al., "Decoupled Contrastive Learning", ECCV 2022.
    - DySTreSS: Manna et al., "Dynamically Scaled Temperature in Self-Supervised Contrastive
      Learning", IEEE TAI 2025.
    - SupCon: Khosla et al., "Supervised Contrastive Learning", NeurIPS 2020.
    - Temperature schedules: Kukleva et al., "Temperature Schedules for self-supervised
      contrastive methods on long-tail data", ICLR 2023.
    - Learned temperature: Radford et al., "Learning Transferable Visual Models From Natural
      Language Supervision" (CLIP), ICML 2021.
"""

from adaptcl.adapters import require

require("lightly", "vision")

from .ascl_moco import ASCLMoCo  # noqa: E402
from .dystress import DySTreSSLoss  # noqa: E402
from .heads import AMCLProjectionHead, PairTemperature  # noqa: E402
from .loss import (  # noqa: E402
    AMCLLoss,
    ASCLLoss,
    DCLLoss,
    DCLWLoss,
    DualTemperatureLoss,
    FlatNCELoss,
    MACLLoss,
    NTXentLoss,
)
from .memory_bank import (  # noqa: E402
    MemoryBankLoss,
    MultiHeadBankLoss,
    PersistentMemoryBankModule,
    lightly_gather,
)
from .temperature import LearnableTemperatureLoss, TemperatureScheduleLoss  # noqa: E402
from .transforms import CIFAR10_NORMALIZE, ASCLTransform, WeakViewTransform  # noqa: E402

__all__ = [
    "NTXentLoss", "DCLLoss", "DCLWLoss", "FlatNCELoss", "DualTemperatureLoss", "MACLLoss",
    "ASCLLoss", "AMCLLoss", "DySTreSSLoss", "TemperatureScheduleLoss",
    "LearnableTemperatureLoss", "AMCLProjectionHead", "PairTemperature",
    "MemoryBankLoss", "MultiHeadBankLoss", "PersistentMemoryBankModule", "lightly_gather",
    "ASCLMoCo", "ASCLTransform", "WeakViewTransform", "CIFAR10_NORMALIZE",
]
