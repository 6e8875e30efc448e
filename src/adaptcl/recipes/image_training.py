"""One cell of ``adaptcl images``: a Lightning module trained by Lightning's ``Trainer`` on one
loss and seed (resuming from the ``last.ckpt`` an interrupted run left), then its frozen
backbone scored by kNN and the linear probe (:mod:`adaptcl.evaluation.images`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaptcl.recipes.template.errors import DivergedError, NonResultError, require_steps
from adaptcl.recipes.template.files import torch_load_checked
from adaptcl.recipes.template.loggers import lightning_logger
from adaptcl.recipes.template.store import Cell
from adaptcl.recipes.template.torch_env import loader_options, resolve_device, seed_everything

if TYPE_CHECKING:
    from adaptcl.recipes.images import ImagesConfig


def build_module(cfg: ImagesConfig, loss: str, num_classes: int):
    """The Lightning module of ``cfg.method`` trained with ``loss`` (the adapter's factory)."""
    from adaptcl.adapters.lightning.factory import build_ssl_module

    return build_ssl_module(
        cfg.method, loss, backbone=cfg.backbone, width=cfg.width, hidden_dim=cfg.hidden_dim,
        output_dim=cfg.output_dim, temperature=cfg.temperature,
        macl_temperature=cfg.macl_temperature, alpha=cfg.alpha, a0=cfg.a0,
        num_heads=cfg.num_heads, beta=cfg.beta, kappa=cfg.kappa, negative_term=cfg.negative_term,
        amcl_objective=cfg.amcl_objective, queue_size=cfg.queue_size,
        num_neighbors=cfg.num_neighbors, sharpen_temperature=cfg.sharpen_temperature,
        gather_distributed=cfg.strategy.startswith("ddp"), optimizer=cfg.optimizer, lr=cfg.lr,
        weight_decay=cfg.weight_decay, num_classes=num_classes, knn_k=cfg.knn_k, knn_t=cfg.knn_t)


def build_images_trainer(cfg: ImagesConfig, log_dir: Path, max_epochs: int, ckpt_dir: Path | None = None,
             clock=None):
    """Lightning's Trainer with the recipe's device, precision, strategy, logger, checkpoints."""
    from adaptcl.adapters.lightning.factory import build_trainer

    return build_trainer(max_epochs, device=resolve_device(cfg.device),
                         devices=cfg.devices, strategy=cfg.strategy, precision=cfg.precision,
                         logger=lightning_logger(cfg.logger, log_dir), ckpt_dir=ckpt_dir,
                         callbacks=[clock] if clock is not None else None,
                         progress=cfg.progress, val_every=cfg.knn_every or 0)


def run_one(cfg: ImagesConfig, splits, cell: Cell, run_dir: Path,
            log_dir: Path) -> dict[str, Any] | None:
    """Train and evaluate one (loss, seed), resuming from the ``last.ckpt`` an earlier run left;
    ``None`` on a process that does not own the result (a non-zero rank)."""
    import torch
    from torch.utils.data import DataLoader

    from adaptcl.adapters.lightning.factory import TrainingClock, ssl_transforms
    from adaptcl.evaluation.images import evaluate_backbone
    from adaptcl.plugins.validation import NonFiniteError

    last_ckpt = run_dir / "last.ckpt"
    for stale in run_dir.glob(".*.tmp"):  # temporary file of a write that was killed
        stale.unlink(missing_ok=True)
    # a checkpoint that cannot be read (truncated by a full disk, say) is named and set aside
    resume = last_ckpt if torch_load_checked(last_ckpt, what="checkpoint", map_location="cpu",
                                             weights_only=False) is not None else None
    seed_everything(cell.seed)
    normalize = None  # CIFAR-10's statistics; ImageNet's for an image folder
    if splits.source.startswith("image folder"):
        from lightly.transforms.utils import IMAGENET_NORMALIZE

        normalize = IMAGENET_NORMALIZE
    train_tf, eval_tf = ssl_transforms(cfg.method, cfg.input_size, normalize)
    ssl_data = splits.train.with_transform(train_tf)
    loader_kw = loader_options(resolve_device(cfg.device), cfg.num_workers)
    ssl_loader = DataLoader(ssl_data, batch_size=cfg.batch_size, shuffle=True, drop_last=True,
                            generator=torch.Generator().manual_seed(cell.seed), **loader_kw)
    eval_bs = max(cfg.batch_size, 256)
    bank_loader, test_loader = (DataLoader(part.with_transform(eval_tf), batch_size=eval_bs,
                                           shuffle=False, **loader_kw)
                                for part in (splits.train, splits.test))
    module = build_module(cfg, cell.method, splits.num_classes)
    if cfg.knn_every:
        module.set_knn_bank_loader(bank_loader)
    clock = TrainingClock()
    trainer = build_images_trainer(cfg, log_dir, cfg.epochs, ckpt_dir=run_dir, clock=clock)
    try:
        trainer.fit(module, train_dataloaders=ssl_loader,
                    val_dataloaders=test_loader if cfg.knn_every else None,
                    ckpt_path=str(resume) if resume is not None else None)
    except NonFiniteError as err:  # the loss met NaN embeddings: the weights diverged
        step = trainer.global_step + 1
        raise DivergedError(f"{cell.label()}: {err} at step {step}", step=step,
                            loss=module.history[-1]["loss"] if module.history else None) from None
    if not trainer.is_global_zero:
        return None
    require_steps(len(module.history), cell.label())
    start = time.perf_counter()
    try:
        metrics = evaluate_backbone(module, bank_loader, test_loader, splits.num_classes,
                                    cfg=cfg, seed=cell.seed, where=cell.label())
    except NonFiniteError as err:  # features of a trained backbone went NaN: it diverged
        raise DivergedError(str(err)) from None
    except ValueError as err:  # constant features: a collapsed backbone is no result
        raise NonResultError(str(err)) from None
    history, last = module.history, (module.history or [{}])[-1]
    return {"metrics": metrics, "optimisation_steps": len(history),
            "losses": [h["loss"] for h in history], "method": cfg.method, "loss": cell.method,
            "seed": cell.seed, "final_temperature": last.get("temperature"),
            "final_alignment": last.get("alignment"), "train_seconds": clock.seconds,
            "eval_seconds": time.perf_counter() - start, "resumed_from": module.resumed_from,
            "run_dir": str(run_dir), "history": history, "online_knn": module.knn_history}
