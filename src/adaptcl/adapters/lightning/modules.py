"""The ``LightningModule`` of each self-supervised image method: SimCLR, MoCo v2, SimSiam,
Barlow Twins and ASCL-MoCo, built from Lightly's heads and helpers on
:class:`~adaptcl.adapters.lightning.base.SSLModule` (the optimiser, logging, the online kNN
monitor, checkpoints and gradient caching they share).

Each is parameterised by its loss: pass any loss with Lightly's call signature
(``lightly.loss.NTXentLoss``, or the drop-in :mod:`adaptcl.adapters.lightly` losses such as
``MACLLoss``) as ``criterion``; each method's own loss is the default. The encoders are those
of :mod:`~adaptcl.adapters.lightning.backbones`.

Examples:
    >>> from lightly.transforms import SimCLRTransform
    >>> from adaptcl.adapters.lightly import MACLLoss
    >>> from adaptcl.adapters.lightning.backbones import cifar_resnet
    >>> from adaptcl.adapters.lightning.modules import SimCLRModule
    >>> backbone, dim = cifar_resnet("resnet-18")
    >>> model = SimCLRModule(backbone, dim, criterion=MACLLoss(temperature=0.1, alpha=0.5))
    >>> trainer = pl.Trainer(max_epochs=200, accelerator="gpu", devices=4, strategy="ddp",
    ...                      sync_batchnorm=True)
    >>> trainer.fit(model, train_dataloader)
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from adaptcl.adapters import require
from adaptcl.plugins.ascl import ASCLMode

require("lightly", "vision")

from lightly.loss import BarlowTwinsLoss, NegativeCosineSimilarity  # noqa: E402
from lightly.models import utils as lightly_utils  # noqa: E402
from lightly.models.modules.heads import (  # noqa: E402
    BarlowTwinsProjectionHead,
    MoCoProjectionHead,
    SimCLRProjectionHead,
    SimSiamPredictionHead,
    SimSiamProjectionHead,
)
from lightly.utils.scheduler import cosine_schedule  # noqa: E402

from adaptcl.adapters.lightly import ASCLMoCo, NTXentLoss  # noqa: E402
from adaptcl.adapters.lightning.base import SSLModule  # noqa: E402
from adaptcl.plugins import AMCLSimSiamLoss  # noqa: E402
from adaptcl.plugins.validation import TileSize  # noqa: E402

__all__ = ["SimCLRModule", "MoCoV2Module", "SimSiamModule", "BarlowTwinsModule", "ASCLMoCoModule"]


class SimCLRModule(SSLModule):
    """SimCLR [0] with any ``NTXentLoss``-compatible criterion.

    - [0] SimCLR, 2020, https://arxiv.org/abs/2002.05709

    Args:
        backbone, feature_dim: encoder and its output dimension.
        criterion: defaults to ``adaptcl.adapters.lightly.NTXentLoss(temperature=0.1)``
            (MACL's CIFAR setting); pass ``MACLLoss(...)`` etc.
        hidden_dim, output_dim: Lightly's ``SimCLRProjectionHead`` (2 layers, 128-d output).
        projection_head: replace the head, e.g. an AMCL multi-head; it must map
            ``[B, feature_dim]`` to what the criterion takes.
        **kwargs: :class:`SSLModule` options (optimizer, lr, kNN monitor, ...).

    Examples:
        >>> model = SimCLRModule(backbone, 512, criterion=MACLLoss(0.1, alpha=0.5))
    """

    def __init__(self, backbone: nn.Module, feature_dim: int, criterion: nn.Module | None = None,
                 *, hidden_dim: int = 2048, output_dim: int = 128,
                 projection_head: nn.Module | None = None, **kwargs: Any) -> None:
        super().__init__(backbone, feature_dim,
                         NTXentLoss(temperature=0.1) if criterion is None else criterion, **kwargs)
        self.projection_head = (SimCLRProjectionHead(feature_dim, hidden_dim, output_dim)
                                if projection_head is None else projection_head)

    def training_loss(self, views: list[Tensor]) -> Tensor:
        return self.criterion(*self.project_views(views))


class MoCoV2Module(SSLModule):
    """MoCo v2 [0] with any ``NTXentLoss``-compatible criterion (queue = its memory bank).

    The key encoder is a momentum copy updated with Lightly's ``update_momentum``; the momentum
    follows a cosine schedule from ``momentum`` to 1 over training (set
    ``momentum_schedule=False`` for a constant one). ``loss = criterion(query, key)``: the
    criterion's memory bank is MoCo's queue, e.g. ``MACLLoss(0.15, 0.5, 0.2,
    memory_bank_size=(4096, 128))`` (MACL App. B.2.1).

    - [0] MoCo v2, 2020, https://arxiv.org/abs/2003.04297

    Examples:
        >>> model = MoCoV2Module(backbone, 512,
        ...                      criterion=MACLLoss(0.15, 0.5, 0.2, memory_bank_size=(4096, 128)))
    """

    def __init__(self, backbone: nn.Module, feature_dim: int, criterion: nn.Module | None = None,
                 *, hidden_dim: int = 2048, output_dim: int = 128, momentum: float = 0.99,
                 momentum_schedule: bool = True, projection_head: nn.Module | None = None,
                 **kwargs: Any) -> None:
        if criterion is None:
            criterion = NTXentLoss(temperature=0.2, memory_bank_size=(4096, output_dim))
        kwargs.setdefault("optimizer", "sgd")
        kwargs.setdefault("lr", 0.06)
        kwargs.setdefault("weight_decay", 5e-4)
        super().__init__(backbone, feature_dim, criterion, **kwargs)
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must be in [0, 1], got {momentum}")
        self.projection_head = (MoCoProjectionHead(feature_dim, hidden_dim, output_dim)
                                if projection_head is None else projection_head)
        self.backbone_momentum = copy.deepcopy(self.backbone)
        self.projection_head_momentum = copy.deepcopy(self.projection_head)
        lightly_utils.deactivate_requires_grad(self.backbone_momentum)
        lightly_utils.deactivate_requires_grad(self.projection_head_momentum)
        self.base_momentum = float(momentum)
        self.momentum_schedule = bool(momentum_schedule)

    def current_momentum(self) -> float:
        if not self.momentum_schedule or self._trainer is None:  # not fitting: no schedule
            return self.base_momentum
        total = max(1, int(self.trainer.estimated_stepping_batches))
        return cosine_schedule(self.global_step, total, self.base_momentum, 1.0)

    def training_loss(self, views: list[Tensor]) -> Tensor:
        m = self.current_momentum()
        lightly_utils.update_momentum(self.backbone, self.backbone_momentum, m=m)
        lightly_utils.update_momentum(self.projection_head, self.projection_head_momentum, m=m)
        rows = self.rows_dim()
        query = self.embed(self.project, views[0], rows)
        with torch.no_grad():
            key = self.embed(self.project_momentum, views[1], rows).detach()
        return self.criterion(query, key)

    def project_momentum(self, x: Tensor) -> Tensor:
        """The momentum key encoder: backbone and projection head."""
        return self.projection_head_momentum(self.backbone_momentum(x).flatten(start_dim=1))


class SimSiamModule(SSLModule):
    """SimSiam [0]: ``0.5 * (criterion(p0, sg(z1)) + criterion(p1, sg(z0)))``.

    The default criterion is Lightly's ``NegativeCosineSimilarity``; SGD (lr 0.06, momentum
    0.9, weight decay 5e-4) as in Lightly's CIFAR benchmarks. For AMCL pass multi-heads
    (:class:`~adaptcl.adapters.lightly.AMCLProjectionHead` of ``SimSiamProjectionHead`` and of
    ``SimSiamPredictionHead``) and ``adaptcl.plugins.AMCLSimSiamLoss``, which is called
    as ``criterion(p0, p1, sg(z0), sg(z1))``.

    - [0] SimSiam, 2020, https://arxiv.org/abs/2011.10566

    Examples:
        >>> model = SimSiamModule(backbone, 512)
    """

    def __init__(self, backbone: nn.Module, feature_dim: int, criterion: nn.Module | None = None,
                 *, hidden_dim: int = 2048, output_dim: int = 2048, prediction_dim: int = 512,
                 projection_head: nn.Module | None = None,
                 prediction_head: nn.Module | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("optimizer", "sgd")
        kwargs.setdefault("lr", 0.06)
        kwargs.setdefault("weight_decay", 5e-4)
        super().__init__(backbone, feature_dim,
                         NegativeCosineSimilarity() if criterion is None else criterion, **kwargs)
        self.projection_head = (SimSiamProjectionHead(feature_dim, hidden_dim, output_dim)
                                if projection_head is None else projection_head)
        self.prediction_head = (SimSiamPredictionHead(output_dim, prediction_dim, output_dim)
                                if prediction_head is None else prediction_head)

    def project_predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(z, p)``: the projection and its prediction (one cached encoder)."""
        z = self.project(x)
        return z, self.prediction_head(z)

    def training_loss(self, views: list[Tensor]) -> Tensor:
        rows = self.rows_dim()
        (z0, p0), (z1, p1) = (self.embed(self.project_predict, v, rows) for v in views[:2])
        if isinstance(self.criterion, AMCLSimSiamLoss):  # Table 2.2: both views at once
            return self.criterion(p0, p1, z0.detach(), z1.detach())
        return 0.5 * (self.criterion(p0, z1.detach()) + self.criterion(p1, z0.detach()))


class BarlowTwinsModule(SSLModule):
    """Barlow Twins [0]: ``criterion(z0, z1)``, Lightly's ``BarlowTwinsLoss`` by default.

    - [0] Barlow Twins, 2021, https://arxiv.org/abs/2103.03230

    Examples:
        >>> model = BarlowTwinsModule(backbone, 512, hidden_dim=2048, output_dim=2048)
    """

    def __init__(self, backbone: nn.Module, feature_dim: int, criterion: nn.Module | None = None,
                 *, hidden_dim: int = 2048, output_dim: int = 2048,
                 projection_head: nn.Module | None = None, **kwargs: Any) -> None:
        super().__init__(backbone, feature_dim,
                         BarlowTwinsLoss(lambda_param=5e-3) if criterion is None else criterion,
                         **kwargs)
        self.projection_head = (BarlowTwinsProjectionHead(feature_dim, hidden_dim, output_dim)
                                if projection_head is None else projection_head)

    def training_loss(self, views: list[Tensor]) -> Tensor:
        return self.criterion(*self.project_views(views))


class ASCLMoCoModule(SSLModule):
    """ASCL [0] on MoCo: strong query view, weak key view (:class:`ASCLTransform`), queue.

    Wraps :class:`~adaptcl.adapters.lightly.ASCLMoCo`; its queue is a persistent buffer, so
    Lightning checkpoints restore it. SGD lr 0.06 x batch/256, momentum 0.9, weight decay 1e-4
    and a cosine schedule are the paper's settings (the defaults here).

    - [0] Feng & Patras, Adaptive Soft Contrastive Learning, ICPR 2022

    Examples:
        >>> model = ASCLMoCoModule(backbone, 512, queue_size=4096, num_neighbors=1)
        >>> loader = DataLoader(dataset_with(ASCLTransform(32, gaussian_blur=0.0)), ...)
    """

    def __init__(self, backbone: nn.Module, feature_dim: int, *, hidden_dim: int = 2048,
                 output_dim: int = 128, queue_size: int = 4096, momentum: float = 0.99,
                 temperature: float = 0.1, sharpen_temperature: float = 0.05,
                 num_neighbors: int = 1, mode: ASCLMode = "ascl", gather_distributed: bool = False,
                 tile_size: TileSize = "auto", **kwargs: Any) -> None:
        kwargs.setdefault("optimizer", "sgd")
        kwargs.setdefault("lr", 0.06)
        kwargs.setdefault("weight_decay", 1e-4)
        model = ASCLMoCo(backbone, feature_dim, hidden_dim=hidden_dim, output_dim=output_dim,
                         queue_size=queue_size, momentum=momentum, temperature=temperature,
                         sharpen_temperature=sharpen_temperature, num_neighbors=num_neighbors,
                         mode=mode, gather_distributed=gather_distributed, tile_size=tile_size)
        super().__init__(backbone, feature_dim, model.criterion, **kwargs)
        # The backbone and the criterion belong to ``self.model``: drop the second registration
        # SSLModule made, so the state dict holds each weight and the queue once (the
        # properties below serve SSLModule's uses of them).
        del self._modules["backbone"], self._modules["criterion"]
        self.model = model

    @property
    def backbone(self) -> nn.Module:
        """The online backbone, ``model.backbone``."""
        return self.model.backbone

    @property
    def criterion(self) -> nn.Module:
        """The ASCL loss with its queue, ``model.criterion``."""
        return self.model.criterion

    def training_loss(self, views: list[Tensor]) -> Tensor:
        self.model.update_momentum()
        # ASCLMoCo.training_loss's three lines, each encoder through self.embed
        query = self.embed(self.model.forward_query, views[0])
        key = self.embed(self.model.forward_key, views[1])
        return self.model.criterion(query, key)
