"""The CLIP of ``adaptcl clip``: small open_clip towers built from a config dict (no weights
downloaded) and the Lightning module that trains them as open_clip's training loop does.

:func:`build_clip` gives ``open_clip.CLIP(embed_dim, vision_cfg, text_cfg)`` with a ViT image
tower (``CLIPVisionCfg``) and a text transformer (``CLIPTextCfg``) of open_clip's vocabulary.
:class:`ClipModule` computes ``loss(image_features, text_features, logit_scale)`` with any
``ClipLoss``-shaped criterion (``labels=`` the class ids for multi-positive targets), clamps the
learned ``logit_scale`` to [0, ln 100] after every optimiser step (open_clip_train's
``train_one_epoch``), and optimises with AdamW without weight decay on gains, biases and
``logit_scale`` and a cosine learning rate after a linear warm-up (open_clip_train's
``cosine_lr``). With ``mini_batch_size`` each tower runs that many pairs at a time through
exact gradient caching (:class:`~adaptcl.adapters.lightning.caching.GradientCaching`); the
towers have LayerNorm only, so a cached step is the uncached one.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor, nn

from adaptcl.adapters.lightning.caching import GradientCaching
from adaptcl.adapters.lightning.resume import CheckpointedHistory, ResumeRecord
from adaptcl.recipes.clip.config import ClipConfig

#: open_clip_train's ``--beta1/--beta2/--eps`` for ViT models
ADAMW_BETAS, ADAMW_EPS = (0.9, 0.98), 1e-6


def tower_configs(cfg: ClipConfig) -> dict[str, Any]:
    """``open_clip.CLIP``'s keyword arguments for ``cfg`` (what a model config JSON holds)."""
    return {
        "embed_dim": cfg.embed_dim,
        "vision_cfg": {"image_size": 32, "patch_size": cfg.patch_size, "width": cfg.vision_width,
                       "layers": cfg.vision_layers, "head_width": cfg.head_width,
                       "mlp_ratio": 4.0},
        "text_cfg": {"context_length": cfg.context_length, "width": cfg.text_width,
                     "heads": cfg.text_width // cfg.head_width, "layers": cfg.text_layers,
                     "mlp_ratio": 4.0},
        "init_logit_scale": math.log(1 / cfg.init_temperature),
    }


def build_clip(cfg: ClipConfig) -> nn.Module:
    """A randomly initialised ``open_clip.CLIP`` of ``cfg``'s towers."""
    import open_clip

    return open_clip.CLIP(**tower_configs(cfg))


def _no_weight_decay(name: str, param: Tensor) -> bool:
    """open_clip_train's rule: gains, biases, norms and ``logit_scale`` take no weight decay."""
    return (param.ndim < 2 or "bn" in name or "ln" in name or "bias" in name
            or "logit_scale" in name)


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    """open_clip_train's ``cosine_lr`` as a factor of the base learning rate."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


class ClipModule(ResumeRecord, CheckpointedHistory, GradientCaching, pl.LightningModule):
    """``model`` trained with ``criterion`` (``ClipLoss``'s call); ``multi_positive`` passes
    the batch's class ids as ``labels=``; ``mini_batch_size`` caches the towers' gradients
    (``None``: no caching). ``history`` (loss, temperature 1/logit_scale and the criterion's
    ``last_stats`` per step) travels in the checkpoints."""

    def __init__(self, model: nn.Module, criterion: nn.Module, *, multi_positive: bool,
                 lr: float, weight_decay: float, warmup_steps: int,
                 mini_batch_size: int | None = None) -> None:
        super().__init__()
        self.set_gradient_cache(mini_batch_size)
        self.model, self.criterion = model, criterion
        self.multi_positive = multi_positive
        self.lr, self.weight_decay, self.warmup_steps = lr, weight_decay, warmup_steps
        self.history: list[dict[str, float]] = []
        self.resumed_from: dict[str, int] | None = None

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        images, tokens, labels = batch
        # open_clip's CLIP.forward, each tower through self.embed
        image_features = self.embed(functools.partial(self.model.encode_image, normalize=True),
                                    images)
        text_features = self.embed(functools.partial(self.model.encode_text, normalize=True),
                                   tokens)
        logit_scale = self.model.logit_scale.exp()
        extra = {"labels": labels} if self.multi_positive else {}
        loss = self.criterion(image_features, text_features, logit_scale, **extra)
        record = {"step": float(self.global_step), "epoch": float(self.current_epoch),
                  "loss": float(loss.detach()), "temperature": float(1 / logit_scale.detach())}
        for key, value in dict(getattr(self.criterion, "last_stats", {}) or {}).items():
            if key != "loss" and isinstance(value, Tensor) and value.numel() == 1:
                # the loss's own temperature (MACL's tau, DySTreSS's mean positive one)
                record["loss_" + key if key in record else key] = float(value.detach())
        self.log("train_loss", loss.detach(), prog_bar=True, batch_size=len(images))
        self.log("train_temperature", record["temperature"], batch_size=len(images))
        self.history.append(record)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        with torch.no_grad():  # open_clip_train: after every step
            self.model.logit_scale.clamp_(0, math.log(100))

    def configure_optimizers(self) -> Any:
        named = [(n, p) for n, p in self.named_parameters() if p.requires_grad]
        groups = [{"params": [p for n, p in named if _no_weight_decay(n, p)], "weight_decay": 0.0},
                  {"params": [p for n, p in named if not _no_weight_decay(n, p)],
                   "weight_decay": self.weight_decay}]
        optimizer = torch.optim.AdamW(groups, lr=self.lr, betas=ADAMW_BETAS, eps=ADAMW_EPS)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = min(self.warmup_steps, total)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: warmup_cosine(step, warmup, total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler,
                                                         "interval": "step"}}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.record_resume(checkpoint)
