"""PyTorch Lightning modules for SimCLR, MoCo v2, SimSiam, Barlow Twins and ASCL-MoCo.

Each module is built from Lightly's backbones, heads and helpers and is parameterised by its
loss: pass any loss with Lightly's call signature (``lightly.loss.NTXentLoss``, or the drop-in
:mod:`adaptcl.adapters.lightly` losses such as ``MACLLoss``) as ``criterion``. Every module

- drives a scheduled temperature (:class:`~adaptcl.adapters.lightly.TemperatureScheduleLoss`)
  with ``global_step`` before every training step, and trains a learned one
  (:class:`~adaptcl.adapters.lightly.LearnableTemperatureLoss`: a parameter of the criterion,
  so of ``self.parameters()``, the optimiser, without weight decay, and the checkpoints);
- logs ``train_loss`` and the adaptive quantities the loss exposes in ``last_stats``
  (``train_temperature``, ``train_alignment``, ``train_mean_w``, ``train_confidence``, ...) and
  keeps them per step in ``history`` (for plots);
- runs an online kNN monitor (Lightly's ``knn_predict``, k=200, t=0.1 by default) on the
  validation dataloader against a feature bank built from ``knn_bank_loader`` at the start of
  every validation epoch, logging ``val_knn_top1``;
- scales to several GPUs/machines with Lightning's own strategies (``Trainer(strategy="ddp",
  sync_batchnorm=True)``) when the loss is built with ``gather_distributed=True``;
- resumes exactly where a checkpoint left off: ``history`` and ``knn_history`` travel in the
  checkpoint, queues are persistent buffers, and ``resumed_from`` records the checkpoint's
  epoch/step and the epoch/step training restarted at;
- trains a batch larger than memory allows with ``mini_batch_size=``: exact gradient caching
  (:class:`~adaptcl.adapters.lightning.caching.GradientCaching`) of every encoder, the momentum
  encoder chunked the same way, under Lightning's own backward, precision and clipping. :class:`~adaptcl.adapters.lightning.trainer.AtomicCheckpointIO` makes
  Lightning write checkpoints through a temporary file and ``os.replace``.

Batches follow Lightly's convention: ``(views, targets, ...)`` with ``views = [x0, x1]`` from
a ``MultiViewTransform`` (``SimCLRTransform``, ``MoCoV2Transform``, :class:`ASCLTransform`).

Examples:
    >>> from lightly.transforms import SimCLRTransform
    >>> from adaptcl.adapters.lightly import MACLLoss
    >>> from adaptcl.adapters.lightning.modules import SimCLRModule, cifar_resnet
    >>> backbone, dim = cifar_resnet("resnet-18")
    >>> model = SimCLRModule(backbone, dim, criterion=MACLLoss(temperature=0.1, alpha=0.5))
    >>> trainer = pl.Trainer(max_epochs=200, accelerator="gpu", devices=4, strategy="ddp",
    ...                      sync_batchnorm=True)
    >>> trainer.fit(model, train_dataloader)
"""

from __future__ import annotations

import copy
import math
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from adaptcl.adapters import require
from adaptcl.adapters.lightning.caching import GradientCaching
from adaptcl.adapters.lightning.methods import BACKBONES
from adaptcl.adapters.lightning.resume import CheckpointedHistory, ResumeRecord
from adaptcl.plugins.ascl import ASCLMode
from adaptcl.plugins.gradient_cache import BatchNormMode

require("lightly", "vision")
pl = require("pytorch_lightning", "vision")

from lightly.loss import BarlowTwinsLoss, NegativeCosineSimilarity  # noqa: E402
from lightly.models import utils as lightly_utils  # noqa: E402
from lightly.models.modules.heads import (  # noqa: E402
    BarlowTwinsProjectionHead,
    MoCoProjectionHead,
    SimCLRProjectionHead,
    SimSiamPredictionHead,
    SimSiamProjectionHead,
)
from lightly.utils.benchmarking import knn_predict  # noqa: E402
from lightly.utils.scheduler import cosine_schedule  # noqa: E402

from adaptcl.adapters.lightly import AMCLProjectionHead, ASCLMoCo, NTXentLoss  # noqa: E402
from adaptcl.plugins import (  # noqa: E402
    AMCLSimSiamLoss,
    LearnableTemperatureLoss,
    MultiHeadProjection,
    set_schedule_step,
)
from adaptcl.plugins.validation import (  # noqa: E402
    TileSize,
    check_choice,
    check_int,
    check_non_negative,
    check_positive,
)

__all__ = [
    "SSLModule", "SimCLRModule", "MoCoV2Module", "SimSiamModule", "BarlowTwinsModule",
    "ASCLMoCoModule", "cifar_resnet", "small_cnn", "extract_features", "knn_correct",
    "OptimizerName", "OPTIMIZERS", "LRSchedule", "LR_SCHEDULES",
]

#: the optimisers :class:`SSLModule` builds
OptimizerName = Literal["adam", "adamw", "sgd"]
OPTIMIZERS: tuple[OptimizerName, ...] = get_args(OptimizerName)
#: the learning-rate schedules of :class:`SSLModule`: cosine decay (after the warm-up) or none
LRSchedule = Literal["cosine", "constant"]
LR_SCHEDULES: tuple[LRSchedule, ...] = get_args(LRSchedule)


def cifar_resnet(name: str = "resnet-18", width: float = 1.0) -> tuple[nn.Module, int]:
    """Lightly's CIFAR ResNet (3x3 first conv, stride 1, no max-pool) without its classifier.

    ``cifar_resnet("resnet-18")`` is the encoder of MACL's CIFAR-10 experiments (App. B.3);
    ``width`` < 1 gives narrow variants for CPU runs. Returns ``(backbone, feature_dim)``.

    Examples:
        >>> backbone, dim = cifar_resnet("resnet-18", width=0.25)   # dim == 128
    """
    from lightly.models import ResNetGenerator

    if name not in BACKBONES:
        raise ValueError(f"backbone must be one of {', '.join(BACKBONES)}, got {name!r}")
    if width <= 0:
        raise ValueError(f"width must be > 0, got {width}")
    resnet = ResNetGenerator(name, width=width)
    feature_dim = resnet.linear.in_features
    resnet.linear = nn.Identity()
    return resnet, feature_dim


def small_cnn(width: int = 32) -> tuple[nn.Module, int]:
    """A 4-block CNN (conv-BN-ReLU, pooling) for quick CPU experiments and tests.

    Returns ``(backbone, feature_dim)`` with ``feature_dim = 4 * width``.
    """
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")

    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    layers = [*block(3, width), nn.MaxPool2d(2), *block(width, 2 * width), nn.MaxPool2d(2),
              *block(2 * width, 4 * width), nn.MaxPool2d(2), *block(4 * width, 4 * width),
              nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    return nn.Sequential(*layers), 4 * width


@torch.no_grad()
def extract_features(model: nn.Module, loader: Any, device: torch.device | str, *,
                     keep_on_device: bool = False, progress: bool = False,
                     desc: str = "features") -> tuple[Tensor, Tensor]:
    """Flattened float features and targets of every ``(images, targets, ...)`` batch.

    ``model`` runs in eval mode without gradients (its mode is restored afterwards), on
    ``device``; the features are gathered on the CPU unless ``keep_on_device``.
    """
    from tqdm.auto import tqdm

    was_training = model.training
    model.eval()
    features, targets = [], []
    for batch in tqdm(loader, desc=desc, disable=not progress, leave=False):
        out = model(batch[0].to(device)).flatten(start_dim=1).float()
        target = torch.as_tensor(batch[1])
        features.append(out if keep_on_device else out.cpu())
        targets.append(target.to(device) if keep_on_device else target)
    model.train(was_training)
    return torch.cat(features), torch.cat(targets).long()


def knn_correct(features: Tensor, bank: Tensor, bank_targets: Tensor, targets: Tensor,
                num_classes: int, knn_k: int = 200, knn_t: float = 0.1) -> int:
    """How many ``targets`` Lightly's weighted kNN (``knn_predict``) classifies right.

    ``features`` ``[B, D]`` and the ``bank`` ``[D, N]`` are L2-normalised; ``k`` is capped at N.
    """
    predicted = knn_predict(features, bank, bank_targets, num_classes,
                            knn_k=min(knn_k, bank.shape[1]), knn_t=knn_t)
    return int((predicted[:, 0] == targets).sum())


class SSLModule(ResumeRecord, CheckpointedHistory, GradientCaching, pl.LightningModule):
    """Base of the self-supervised modules: optimiser, online kNN monitor, loss statistics.

    Args:
        backbone: module mapping images to features (flattened to ``[B, feature_dim]``).
        feature_dim: backbone output dimension.
        criterion: the loss; its ``last_stats`` (if any) are logged after every step.
        optimizer: ``"adam"`` (MACL's CIFAR setting, lr 1e-3, weight decay 1e-6), ``"adamw"``
            or ``"sgd"`` (momentum ``momentum``).
        lr: learning rate.
        weight_decay: weight decay.
        momentum: SGD momentum.
        lr_schedule: ``"cosine"`` (per step, with ``warmup_epochs`` of linear warm-up) or
            ``"constant"``.
        warmup_epochs: epochs of linear warm-up for the cosine schedule.
        num_classes, knn_k, knn_t: online kNN monitor settings (Lightly's ``knn_predict``).
        knn_bank_loader: dataloader of ``(image, target)`` for the kNN feature bank; set it here
            or with :meth:`set_knn_bank_loader`. Without it, validation does nothing.
        mini_batch_size: gradient caching (:func:`~adaptcl.plugins.cached_forward`): each
            view's encoder runs this many images at a time and the step is exact for the
            whole batch's loss at the activation memory of one chunk. ``None``: no caching.
        cache_batch_norm: what BatchNorm computes in a cached step: ``"chunk"`` (statistics
            per chunk: the step equals an uncached one over the same chunks) or ``"frozen"``
            (eval mode); see :mod:`adaptcl.plugins.gradient_cache`.
    """

    def __init__(self, backbone: nn.Module, feature_dim: int, criterion: nn.Module, *,
                 optimizer: OptimizerName = "adam", lr: float = 1e-3, weight_decay: float = 1e-6,
                 momentum: float = 0.9, lr_schedule: LRSchedule = "cosine", warmup_epochs: int = 0,
                 num_classes: int = 10, knn_k: int = 200, knn_t: float = 0.1,
                 knn_bank_loader: Any = None, mini_batch_size: int | None = None,
                 cache_batch_norm: BatchNormMode = "chunk") -> None:
        super().__init__()
        self.set_gradient_cache(mini_batch_size, cache_batch_norm)
        self.optimizer_name = check_choice("optimizer", optimizer, OPTIMIZERS)
        self.lr_schedule = check_choice("lr_schedule", lr_schedule, LR_SCHEDULES)
        self.lr = check_positive("lr", lr)
        self.knn_t = check_positive("knn_t", knn_t)
        self.weight_decay = check_non_negative("weight_decay", weight_decay)
        self.momentum = check_non_negative("momentum", momentum)
        self.feature_dim = check_int("feature_dim", feature_dim, 1)
        self.knn_k = check_int("knn_k", knn_k, 1)
        self.num_classes = check_int("num_classes", num_classes, 2)
        self.warmup_epochs = check_int("warmup_epochs", warmup_epochs, 0)
        self.backbone = backbone
        self.criterion = criterion
        self.knn_bank_loader = knn_bank_loader
        self.history: list[dict[str, float]] = []
        self.knn_history: list[dict[str, float]] = []
        #: set when training restarts from a checkpoint: the checkpoint's epoch/global step and
        #: the epoch/global step of the first training batch after the restart
        self.resumed_from: dict[str, int] | None = None
        self._bank: Tensor | None = None
        self._bank_targets: Tensor | None = None
        self._knn_correct = 0
        self._knn_total = 0

    # --- model -------------------------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        """Backbone features ``[B, feature_dim]``."""
        return self.backbone(x).flatten(start_dim=1)

    def project(self, x: Tensor) -> Tensor:
        """The backbone and the subclass's ``projection_head``."""
        return self.projection_head(self(x))

    def project_views(self, views: list[Tensor]) -> tuple[Tensor, Tensor]:
        """``(z0, z1)``: the first two views through :meth:`project` (SimCLR and Barlow Twins
        share it across views), each cached when ``mini_batch_size`` is below the batch."""
        rows = self.rows_dim()
        return self.embed(self.project, views[0], rows), self.embed(self.project, views[1], rows)

    def rows_dim(self) -> int:
        """The dimension of the projections that holds the images: 1 for AMCL's multi-heads
        (``[heads, batch, dim]``), else 0."""
        heads = (AMCLProjectionHead, MultiHeadProjection)
        return 1 if isinstance(getattr(self, "projection_head", None), heads) else 0

    def training_loss(self, views: list[Tensor]) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        views = batch[0]
        if not isinstance(views, (list, tuple)) or len(views) < 2:
            raise ValueError("expected a batch (views, targets, ...) with at least two views; "
                             "use a MultiViewTransform such as lightly's SimCLRTransform")
        # a scheduled temperature follows the optimisation step (Lightning restores global_step
        # on resume, so the schedule resumes with it)
        set_schedule_step(self.criterion, self.global_step)
        loss = self.training_loss(list(views))
        self.log_loss_stats(loss, batch_size=views[0].shape[0])
        return loss

    # --- logging -------------------------------------------------------------------------------
    def log_loss_stats(self, loss: Tensor, batch_size: int, criterion: nn.Module | None = None) -> None:
        """Log the loss and the criterion's ``last_stats``; append them to ``history``."""
        criterion = self.criterion if criterion is None else criterion
        self.log("train_loss", loss.detach(), prog_bar=True, batch_size=batch_size)
        record = {"step": float(self.global_step), "epoch": float(self.current_epoch),
                  "loss": float(loss.detach())}
        for key, value in dict(getattr(criterion, "last_stats", {}) or {}).items():
            if key == "loss" or not isinstance(value, Tensor) or value.numel() != 1:
                continue
            value = value.detach().float()
            self.log(f"train_{key}", value, prog_bar=key == "temperature", batch_size=batch_size)
            record[key] = float(value)
        self.history.append(record)

    # --- checkpoints ------------------------------------------------------------------------------
    checkpointed = ("history", "knn_history")

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.record_resume(checkpoint)

    # --- online kNN monitor ---------------------------------------------------------------------
    def set_knn_bank_loader(self, loader: Any) -> None:
        """Dataloader of ``(image, target)`` whose features form the kNN bank."""
        self.knn_bank_loader = loader

    @torch.no_grad()
    def on_validation_epoch_start(self) -> None:
        self._knn_correct, self._knn_total = 0, 0
        self._bank = self._bank_targets = None
        if self.knn_bank_loader is None:
            return
        # The bank loader is not handed to the Trainer, so it has no distributed sampler: every
        # rank builds the whole bank (as Lightly's BenchmarkModule); the validation batches are
        # split across ranks and the counts are summed in on_validation_epoch_end.
        features, self._bank_targets = extract_features(self, self.knn_bank_loader, self.device,
                                                        keep_on_device=True)
        self._bank = F.normalize(features, dim=1).t().contiguous()

    @torch.no_grad()
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if self._bank is None or self._bank_targets is None:
            return
        images, targets = batch[0], batch[1]
        features = F.normalize(self(images).float(), dim=1)
        self._knn_correct += knn_correct(features, self._bank, self._bank_targets, targets,
                                         self.num_classes, self.knn_k, self.knn_t)
        self._knn_total += int(targets.shape[0])

    def on_validation_epoch_end(self) -> None:
        if self._knn_total == 0:
            return
        counts = torch.tensor([self._knn_correct, self._knn_total], dtype=torch.float64,
                              device=self.device)
        if self.trainer is not None and self.trainer.world_size > 1:
            counts = self.all_gather(counts).reshape(-1, 2).sum(dim=0)
        accuracy = float(counts[0] / counts[1])
        self.log("val_knn_top1", accuracy, prog_bar=True, sync_dist=False)
        if not self.trainer.sanity_checking:
            self.knn_history.append({"epoch": float(self.current_epoch), "knn_top1": accuracy})
        self._bank = self._bank_targets = None

    # --- optimisation -----------------------------------------------------------------------------
    def configure_optimizers(self):
        params = _weight_decay_groups(self)
        if self.optimizer_name == "adam":
            optimizer = torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
        elif self.optimizer_name == "adamw":
            optimizer = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)
        else:
            optimizer = torch.optim.SGD(params, lr=self.lr, momentum=self.momentum,
                                        weight_decay=self.weight_decay)
        if self.lr_schedule == "constant":
            return optimizer
        total = max(1, int(self.trainer.estimated_stepping_batches))
        epochs = max(1, int(self.trainer.max_epochs or 1))
        warmup = int(total * self.warmup_epochs / epochs)

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = (step - warmup) / max(1, total - warmup)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _weight_decay_groups(module: nn.Module) -> list:
    """``module``'s trainable parameters, with a learned temperature (CLIP's logit scale) in a
    group of its own without weight decay, as open_clip's optimiser groups have it (weight decay
    pulls ``s`` to 0, i.e. tau to 1). Without one, the plain list of parameters."""
    temperatures = {id(p) for m in module.modules() if isinstance(m, LearnableTemperatureLoss)
                    for p in m.parameters()}
    params = [p for p in module.parameters() if p.requires_grad]
    if not temperatures:
        return params
    return [{"params": [p for p in params if id(p) not in temperatures]},
            {"params": [p for p in params if id(p) in temperatures], "weight_decay": 0.0}]


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
