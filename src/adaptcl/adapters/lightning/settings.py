"""The settings of a self-supervised image module as one typed, frozen object.

:class:`SSLModuleSettings` holds what
:func:`~adaptcl.adapters.lightning.factory.build_ssl_module` needs besides the method and the
loss: the backbone and heads, every loss's hyper-parameters, the optimiser and the kNN
monitor. It is checked when it is made (a bad value is one ``ValueError``/``TypeError`` naming
its field), so a settings object that exists is valid whichever loss it is given to. Imports no
framework (the optimiser's names are checked against
:mod:`~adaptcl.adapters.lightning.base` when one is given).

The same idea as solo-learn's one ``cfg`` per method and LightningCLI's typed init arguments,
kept to a flat dataclass: a script builds it once from keywords (or from its own config) and
sweeps with :func:`dataclasses.replace`.

Example:
    >>> settings = SSLModuleSettings(width=0.125, temperature=0.2, alpha=1.0)
    >>> settings.alpha, settings.macl_temperature
    (1.0, None)
    >>> SSLModuleSettings(kappa=0)
    Traceback (most recent call last):
    ...
    ValueError: kappa must be >= 1, got 0
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from adaptcl.adapters.lightning.caching import check_mini_batch_size
from adaptcl.adapters.lightning.methods import BACKBONES, Backbone
from adaptcl.plugins.amcl import NEGATIVE_TERMS, OBJECTIVES, NegativeTerm, Objective
from adaptcl.plugins.validation import (
    TileSize,
    check_bool,
    check_choice,
    check_finite_number,
    check_int,
    check_non_negative,
    check_positive,
    check_tile_size,
)

if TYPE_CHECKING:  # pragma: no cover - the Literal lives beside the module that uses it
    from adaptcl.adapters.lightning.base import OptimizerName

__all__ = ["SSLModuleSettings"]

#: the fields checked as ``(check, names)``; ``None`` passes where the field allows it
_POSITIVE = ("width", "temperature", "sharpen_temperature", "max_temperature", "knn_t")
_POSITIVE_OR_NONE = ("macl_temperature", "dystress_max_temperature", "lr")
_NON_NEGATIVE = ("alpha", "beta")
_INTS = {"hidden_dim": 1, "output_dim": 1, "num_heads": 1, "kappa": 1, "queue_size": 1,
         "num_neighbors": 0, "period": 1, "num_classes": 2, "knn_k": 1}


@dataclass(frozen=True, kw_only=True)
class SSLModuleSettings:
    """Everything :func:`~adaptcl.adapters.lightning.factory.build_ssl_module` takes besides
    the method and the loss; each loss reads the fields it needs and ignores the others.

    Architecture: ``backbone`` and ``width`` (Lightly's CIFAR ResNet,
    :func:`~adaptcl.adapters.lightning.backbones.cifar_resnet`), the heads' ``hidden_dim`` and
    ``output_dim``.

    Losses: ``temperature`` is tau of the fixed-temperature losses (and ASCL-MoCo's);
    ``macl_temperature`` MACL's tau0 (``None``: ``temperature``), ``alpha``/``a0`` MACL's;
    ``num_heads``/``beta``/``kappa``/``negative_term``/``amcl_objective`` AMCL's;
    ``num_neighbors``/``sharpen_temperature`` ASCL's; ``dystress_max_temperature`` DySTreSS's
    tau_max (``None``: ``2 * temperature``; tau_min is ``temperature``); ``max_temperature``
    and ``period`` (optimisation steps) the temperature schedule's tau_max and period (tau_min:
    ``temperature``); ``queue_size`` MoCo's queue; ``gather_distributed`` gathers negatives
    across DDP ranks; ``tile_size`` how the contrastive losses compute their logits
    (:mod:`adaptcl.plugins.execution`).

    Optimisation and monitor: ``optimizer``, ``lr`` and ``weight_decay`` (``None``: the
    method's own defaults, e.g. Adam 1e-3 for SimCLR, SGD 0.06 for MoCo), ``mini_batch_size``
    (gradient caching, ``None``: none; see
    :class:`~adaptcl.adapters.lightning.caching.GradientCaching`), ``num_classes``, ``knn_k``
    and ``knn_t`` of the online kNN monitor.

    >>> from dataclasses import replace
    >>> replace(SSLModuleSettings(), temperature=0.5).temperature
    0.5
    """

    # the backbone and the heads
    backbone: Backbone = "resnet-18"
    width: float = 1.0
    hidden_dim: int = 512
    output_dim: int = 128
    # the losses: the fixed temperature (tau_min of DySTreSS and the schedule), MACL's
    temperature: float = 0.1
    macl_temperature: float | None = None
    alpha: float = 0.5
    a0: float = 0.0
    # AMCL's
    num_heads: int = 2
    beta: float = 1e-3
    kappa: int = 1
    negative_term: NegativeTerm = "softmax"
    amcl_objective: Objective = "nt_xent"
    # MoCo's queue, ASCL's neighbours
    queue_size: int = 4096
    num_neighbors: int = 1
    sharpen_temperature: float = 0.05
    # DySTreSS's and the temperature schedule's tau_max, the schedule's period
    dystress_max_temperature: float | None = None
    max_temperature: float = 1.0
    period: int = 400
    gather_distributed: bool = False
    tile_size: TileSize = "auto"
    # the optimiser (None: the method's own) and the kNN monitor
    optimizer: OptimizerName | None = None
    lr: float | None = None
    weight_decay: float | None = None
    mini_batch_size: int | None = None
    num_classes: int = 10
    knn_k: int = 200
    knn_t: float = 0.1

    def __post_init__(self) -> None:
        check_choice("backbone", self.backbone, BACKBONES)
        for name in _POSITIVE:
            check_positive(name, getattr(self, name))
        for name in _POSITIVE_OR_NONE:
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        for name in _NON_NEGATIVE:
            check_non_negative(name, getattr(self, name))
        check_finite_number("a0", self.a0)
        for name, minimum in _INTS.items():
            check_int(name, getattr(self, name), minimum)
        check_choice("negative_term", self.negative_term, NEGATIVE_TERMS)
        check_choice("amcl_objective", self.amcl_objective, OBJECTIVES)
        check_bool("gather_distributed", self.gather_distributed)
        check_tile_size(self.tile_size)
        if self.weight_decay is not None:
            check_non_negative("weight_decay", self.weight_decay)
        check_mini_batch_size(self.mini_batch_size)
        if self.optimizer is not None:
            from adaptcl.adapters.lightning.base import OPTIMIZERS

            check_choice("optimizer", self.optimizer, OPTIMIZERS)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The names of the settings, in declaration order."""
        return tuple(f.name for f in fields(cls))

    def training_options(self) -> dict[str, object]:
        """The keywords of the method's module for the optimiser, gradient caching and the kNN
        monitor (the optimiser's left ``None`` are left to the module's defaults)."""
        given = {"optimizer": self.optimizer, "lr": self.lr, "weight_decay": self.weight_decay}
        return {**{k: v for k, v in given.items() if v is not None},
                "mini_batch_size": self.mini_batch_size, "num_classes": self.num_classes,
                "knn_k": self.knn_k, "knn_t": self.knn_t}
