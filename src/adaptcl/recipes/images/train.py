"""One cell of ``adaptcl images``: one loss and seed trained by Lightning (resumed from the
``last.ckpt`` an interrupted run left), then the frozen backbone scored by kNN and a linear probe."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from adaptcl.adapters.lightning.factory import build_ssl_module, ssl_transforms
from adaptcl.adapters.lightning.settings import SSLModuleSettings
from adaptcl.adapters.lightning.trainer import (
    RandomStates,
    StepMeter,
    TrainingClock,
    build_trainer,
)
from adaptcl.evaluation.images import evaluate_backbone
from adaptcl.plugins.validation import NonFiniteError
from adaptcl.recipes.common.ddp import ddp_strategy
from adaptcl.recipes.common.lightning import fit, resume_checkpoint
from adaptcl.recipes.common.schedule import schedule_steps
from adaptcl.recipes.common.step_cost import step_cost
from adaptcl.recipes.engine.cells import Cell
from adaptcl.recipes.engine.errors import DivergedError, NonResultError, require_steps
from adaptcl.recipes.engine.loggers import lightning_logger
from adaptcl.recipes.engine.progress import on_terminal
from adaptcl.recipes.engine.torch_env import (
    loader_options,
    loader_workers,
    resolve_device,
    seed_everything,
)
from adaptcl.recipes.images.config import ImagesConfig
from adaptcl.recipes.images.data import ImageSplits

#: the module's settings that are not a setting of the same name in :class:`ImagesConfig`
#: (``dystress_max_temperature`` keeps its default, twice ``temperature``)
DERIVED = ("period", "gather_distributed", "num_classes", "dystress_max_temperature")


def module_settings(cfg: ImagesConfig, num_classes: int,
                    steps_per_epoch: int) -> SSLModuleSettings:
    """The module's settings of ``cfg``: every field of
    :class:`~adaptcl.adapters.lightning.settings.SSLModuleSettings` from the setting of the
    same name, the temperature schedule's period in optimisation steps, negatives gathered
    across ranks under DDP, and the data's classes (for the kNN monitor)."""
    same = {name: getattr(cfg, name) for name in SSLModuleSettings.field_names()
            if name not in DERIVED}
    return SSLModuleSettings(**same, num_classes=num_classes,
                             gather_distributed=cfg.strategy.startswith("ddp"),
                             period=schedule_steps(cfg.schedule_period, steps_per_epoch))


def build_module(cfg: ImagesConfig, loss: str, num_classes: int, steps_per_epoch: int) -> Any:
    """The Lightning module of ``cfg.method`` trained with ``loss`` (the adapter's factory)."""
    return build_ssl_module(cfg.method, loss, module_settings(cfg, num_classes, steps_per_epoch))


def lightning_trainer(cfg: ImagesConfig, log_dir: Path, ckpt_dir: Path | None = None,
                      callbacks: list[Any] | None = None) -> Any:
    """Lightning's Trainer of the run's settings (the online kNN every ``knn_every`` epochs)."""
    return build_trainer(cfg.epochs, device=resolve_device(cfg.device), devices=cfg.devices,
                         strategy=ddp_strategy(cfg.strategy, cfg.devices), precision=cfg.precision,
                         logger=lightning_logger(cfg.logger, log_dir), ckpt_dir=ckpt_dir,
                         callbacks=callbacks,
                         progress=on_terminal(cfg.progress), val_every=cfg.knn_every)


def loaders(cfg: ImagesConfig, splits: ImageSplits, seed: int) -> tuple[Any, Any, Any]:
    """(two-view training loader, kNN bank loader, test loader), the order drawn from ``seed``;
    an image folder is normalised with ImageNet's statistics, CIFAR-10 with its own."""
    normalize = None
    if splits.source.startswith("image folder"):
        from lightly.transforms.utils import IMAGENET_NORMALIZE

        normalize = IMAGENET_NORMALIZE
    train_tf, eval_tf = ssl_transforms(cfg.method, cfg.input_size, normalize)
    device = resolve_device(cfg.device)
    options = loader_options(device, loader_workers(device, cfg.num_workers, cfg.devices))
    train = DataLoader(splits.train.with_transform(train_tf), batch_size=cfg.batch_size,
                       shuffle=True, drop_last=True,
                       generator=torch.Generator().manual_seed(seed), **options)
    # the features of the kNN bank and the probe: as many images at a time as a training step
    # holds in activations (with --mini-batch-size, its chunk), at least 256
    features_batch = max(cfg.mini_batch_size or cfg.batch_size, 256)
    bank, test = (DataLoader(part.with_transform(eval_tf), batch_size=features_batch,
                             shuffle=False, **options) for part in (splits.train, splits.test))
    return train, bank, test


def train_and_score(cfg: ImagesConfig, splits: ImageSplits, cell: Cell, ckpt_dir: Path,
                    log_dir: Path) -> dict[str, Any] | None:
    """Train (or resume) and evaluate one cell; ``None`` on a non-zero rank."""
    resume = resume_checkpoint(ckpt_dir)
    seed_everything(cell.seed)
    train, bank, test = loaders(cfg, splits, cell.seed)
    module = build_module(cfg, cell.loss, splits.num_classes, len(train))
    if cfg.knn_every:
        module.set_knn_bank_loader(bank)
    clock, meter = TrainingClock(), StepMeter()
    # the order and the augmentations draw from these: resumed, the run goes on as it would have
    states = RandomStates({"order": train.generator}, world=cfg.devices)
    trainer = lightning_trainer(cfg, log_dir, ckpt_dir=ckpt_dir,
                                callbacks=[clock, meter, states])
    try:
        fit(trainer, module, train_dataloaders=train,
                    val_dataloaders=test if cfg.knn_every else None,
                    ckpt_path=str(resume) if resume is not None else None)
    except NonFiniteError as err:  # the loss met NaN embeddings: the weights diverged
        step = trainer.global_step + 1  # its loss was never computed: loss stays None
        last = module.history[-1] if module.history else None
        before = (f"; the last loss was {last['loss']:.4g} at step {int(last['step']) + 1}"
                  if last else "")
        raise DivergedError(f"{cell.label()}: {err} at step {step}{before}", step=step) from None
    if not trainer.is_global_zero:
        return None
    history = module.history
    require_steps(len(history), cell.label())
    start = time.perf_counter()
    try:
        # on the run's device: after fit, Lightning's teardown has left the module on the CPU
        metrics = evaluate_backbone(module.backbone, bank, test, splits.num_classes,
                                    device=resolve_device(cfg.device), cfg=cfg, seed=cell.seed,
                                    where=cell.label())
    except NonFiniteError as err:  # features of a trained backbone went NaN: it diverged
        raise DivergedError(str(err)) from None
    except ValueError as err:  # constant features: a collapsed backbone is no result
        raise NonResultError(str(err)) from None
    last = history[-1]
    return {"metrics": metrics, "optimisation_steps": len(history),
            "losses": [h["loss"] for h in history], "method": cfg.method,
            "final_temperature": last.get("temperature"),
            "final_alignment": last.get("alignment"), "train_seconds": clock.seconds,
            "epoch_seconds": list(clock.epoch_seconds), **step_cost(meter),
            "loader_workers": train.num_workers,
            "eval_seconds": time.perf_counter() - start, "resumed_from": module.resumed_from,
            "checkpoint_dir": str(ckpt_dir), "history": history,
            "online_knn": module.knn_history}
