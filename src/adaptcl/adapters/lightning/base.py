"""The base of the self-supervised image modules, :class:`SSLModule`: a ``LightningModule``
parameterised by its loss.

Pass any loss with Lightly's call signature (``lightly.loss.NTXentLoss``, or the drop-in
:mod:`adaptcl.adapters.lightly` losses such as ``MACLLoss``) as ``criterion``; a method module of
:mod:`~adaptcl.adapters.lightning.modules` adds its heads and its ``training_loss``. Every module

- drives a scheduled temperature (:class:`~adaptcl.adapters.lightly.TemperatureScheduleLoss`)
  with ``global_step`` before every training step, and trains a learned one
  (:class:`~adaptcl.adapters.lightly.LearnableTemperatureLoss`: a parameter of the criterion,
  so of ``self.parameters()``, the optimiser, without weight decay, and the checkpoints);
- logs ``train_loss`` and the adaptive quantities the loss exposes in ``last_stats``
  (``train_temperature``, ``train_alignment``, ``train_mean_w``, ``train_confidence``, ...) and
  keeps them per step in ``history`` (for plots);
- runs an online kNN monitor (Lightly's ``knn_predict``, k=200, t=0.1 by default) on the
  validation dataloader against a feature bank built from ``knn_bank_loader`` at the start of
  every validation epoch, logging ``val_knn_top1``
  (:mod:`~adaptcl.adapters.lightning.features`);
- scales to several GPUs/machines with Lightning's own strategies (``Trainer(strategy="ddp",
  sync_batchnorm=True)``) when the loss is built with ``gather_distributed=True``;
- resumes exactly where a checkpoint left off: ``history`` and ``knn_history`` travel in the
  checkpoint, queues are persistent buffers, and ``resumed_from`` records the checkpoint's
  epoch/step and the epoch/step training restarted at;
- trains a batch larger than memory allows with ``mini_batch_size=``: exact gradient caching
  (:class:`~adaptcl.adapters.lightning.caching.GradientCaching`) of every encoder, the momentum
  encoder chunked the same way, under Lightning's own backward, precision and clipping.
  :class:`~adaptcl.adapters.lightning.trainer.AtomicCheckpointIO` makes Lightning write
  checkpoints through a temporary file and ``os.replace``.

Batches follow Lightly's convention: ``(views, targets, ...)`` with ``views = [x0, x1]`` from
a ``MultiViewTransform`` (``SimCLRTransform``, ``MoCoV2Transform``, :class:`ASCLTransform`).
"""

from __future__ import annotations

import math
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from adaptcl.adapters import require
from adaptcl.adapters.lightning.caching import GradientCaching
from adaptcl.adapters.lightning.resume import CheckpointedHistory, ResumeRecord
from adaptcl.plugins.gradient_cache import BatchNormMode

require("lightly", "vision")
pl = require("pytorch_lightning", "vision")

from adaptcl.adapters.lightly import AMCLProjectionHead  # noqa: E402
from adaptcl.adapters.lightning.features import extract_features, knn_correct  # noqa: E402
from adaptcl.plugins import (  # noqa: E402
    LearnableTemperatureLoss,
    MultiHeadProjection,
    set_schedule_step,
)
from adaptcl.plugins.validation import (  # noqa: E402
    check_choice,
    check_int,
    check_non_negative,
    check_positive,
)

__all__ = ["SSLModule", "OptimizerName", "OPTIMIZERS", "LRSchedule", "LR_SCHEDULES"]

#: the optimisers :class:`SSLModule` builds
OptimizerName = Literal["adam", "adamw", "sgd"]
OPTIMIZERS: tuple[OptimizerName, ...] = get_args(OptimizerName)
#: the learning-rate schedules of :class:`SSLModule`: cosine decay (after the warm-up) or none
LRSchedule = Literal["cosine", "constant"]
LR_SCHEDULES: tuple[LRSchedule, ...] = get_args(LRSchedule)


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
