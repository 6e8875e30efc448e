"""GraphCL pre-training on several devices through Lightning, for ``tu`` and ``moleculenet``.

:func:`pretrain_on_devices` is the one multi-device path of the graph recipes (``--devices N
--strategy ddp``): :class:`~adaptcl.adapters.graphcl.lightning.GraphCLModule` under a
``pl.Trainer`` whose launcher runs the command again for every other rank. The single-device
path stays :func:`~adaptcl.recipes.graph_common.train_epochs` (the published numbers).

Needs ``pytorch-lightning`` (the ``graph`` extra); importing this module imports it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import Dataset, DistributedSampler
from torch_geometric.loader import DataLoader

from adaptcl.adapters.graphcl.lightning import GraphCLModule
from adaptcl.plugins.validation import NonFiniteError
from adaptcl.recipes.template.errors import DivergedError, require_steps
from adaptcl.recipes.template.files import torch_load_checked
from adaptcl.recipes.template.torch_env import loader_options


class EpochClock(pl.Callback):
    """Seconds of each training epoch; its state travels in Lightning's checkpoints."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.seconds.append(time.perf_counter() - self._start)

    def state_dict(self) -> dict[str, list[float]]:
        return {"seconds": list(self.seconds)}

    def load_state_dict(self, state_dict: dict[str, list[float]]) -> None:
        self.seconds = [float(s) for s in state_dict["seconds"]]


def pretrain_on_devices(model: torch.nn.Module, pairs: Callable[[int], Dataset], *,
                        devices: int, strategy: str, epochs: int, batch_size: int, lr: float,
                        device: str, precision: str, shuffle_seed: int, where: str,
                        progress: bool = False, checkpoint_dir: Path | None = None,
                        logger: Any = None) -> dict[str, Any] | None:
    """Pre-train the GraphCL ``model`` on ``devices`` processes (``strategy``, e.g. ``"ddp"``).

    Each rank trains a copy of ``model`` (call it after seeding, so every rank builds the same
    initial weights; DDP broadcasts rank 0's anyway) on its share of ``pairs(rank)``, the
    two-view dataset whose augmentations the rank draws from its own stream: a
    ``DistributedSampler`` shuffled with ``shuffle_seed`` (epoch by epoch) gives each rank
    ``batch_size / devices`` pairs a step, and the loss's ``gather_distributed`` makes every
    rank's anchors meet the projections of the whole batch of ``batch_size``. BatchNorm
    statistics stay per rank.

    ``checkpoint_dir``: Lightning's ``last.ckpt`` is written there after every epoch and a run
    resumes from it (model, optimiser, loop state; the augmentation streams start again);
    ``None`` keeps no checkpoint (a short run recomputes). A non-finite loss raises
    :class:`~adaptcl.recipes.template.errors.DivergedError` with its step. After training the
    model is on ``device`` again, in eval mode.

    Returns, on rank 0, ``{"epoch_loss", "epoch_seconds", "steps", "step_stats"}`` (the mean
    loss per graph of each epoch over all ranks, seconds per epoch, optimisation steps, and
    each step's loss and loss statistics, as :func:`~adaptcl.recipes.graph_common.train_epochs`
    gives them) and logs every step to ``logger``; the other ranks get ``None``.
    """
    clock = EpochClock()
    callbacks: list[pl.Callback] = [clock]
    if checkpoint_dir is not None:
        from pytorch_lightning.callbacks import ModelCheckpoint

        callbacks.append(ModelCheckpoint(dirpath=str(checkpoint_dir), filename="{epoch}",
                                         save_last=True, every_n_epochs=1,
                                         save_on_train_epoch_end=True,
                                         enable_version_counter=False))
    trainer = pl.Trainer(
        max_epochs=epochs, accelerator="gpu" if device.startswith("cuda") else "cpu",
        devices=devices, strategy=strategy, precision=precision, logger=False,
        callbacks=callbacks, enable_progress_bar=progress, enable_model_summary=False,
        enable_checkpointing=checkpoint_dir is not None, num_sanity_val_steps=0,
        limit_val_batches=0, log_every_n_steps=1)
    # the rank is known before the launcher starts the others: they run with LOCAL_RANK set
    rank, world = int(trainer.global_rank), int(trainer.world_size)
    dataset = pairs(rank)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                 seed=shuffle_seed)  # Lightning keeps it and sets its epoch
    loader = DataLoader(dataset, batch_size=batch_size // world, sampler=sampler,
                        **loader_options(device))
    module = GraphCLModule(model, lr=lr, where=where)
    last = checkpoint_dir / "last.ckpt" if checkpoint_dir is not None else None
    resume = last if last is not None and torch_load_checked(
        last, what="checkpoint", map_location="cpu", weights_only=False) is not None else None
    if resume is not None and rank == 0:
        print(f"adaptcl: {where} resumes from {resume}", file=sys.stderr, flush=True)
    try:
        trainer.fit(module, loader, ckpt_path=str(resume) if resume is not None else None)
    except NonFiniteError as err:
        raise DivergedError(f"{err}; nothing was stored", step=err.step, loss=err.loss) from None
    model.to(device).eval()  # Lightning's teardown leaves it on the CPU
    if not trainer.is_global_zero:
        return None
    require_steps(len(module.history), where)
    step_stats: dict[str, list[float]] = {}
    for record in module.history:
        for key, value in record.items():
            if key not in ("step", "epoch"):
                step_stats.setdefault(key, []).append(value)
    if logger is not None:
        for record in module.history:
            logger.log({f"train/{k}": v for k, v in record.items() if k not in ("step", "epoch")},
                       int(record["step"]))
    return {"epoch_loss": list(module.epoch_losses), "epoch_seconds": list(clock.seconds),
            "steps": len(module.history), "step_stats": step_stats}
