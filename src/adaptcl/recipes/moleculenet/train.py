"""Pre-training and fine-tuning of ``adaptcl moleculenet`` (GraphCL on Hu et al.'s GIN), both
through :func:`~adaptcl.recipes.common.graph_training.fit_graphs`."""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from adaptcl.adapters.graphcl import (
    GraphCL,
    MolGINEncoder,
    MolPropertyModel,
    TwoViewDataset,
    graphcl_augmentation,
    graphcl_loss,
)
from adaptcl.evaluation.graphs import masked_bce_loss, multitask_roc_auc
from adaptcl.recipes.common.devices import AUGMENTATION_RANK_STRIDE
from adaptcl.recipes.common.graph_training import embed_graphs, fit_graphs
from adaptcl.recipes.engine.cells import Cell
from adaptcl.recipes.engine.files import torch_load_checked, torch_save_atomic
from adaptcl.recipes.engine.torch_env import resolve_device, seed_everything
from adaptcl.recipes.moleculenet.config import MoleculeNetConfig


def build_encoder(cfg: MoleculeNetConfig, dropout: float) -> MolGINEncoder:
    """Hu et al.'s GIN (OGB atom and bond encoders, mean pooling) of the run's shape."""
    return MolGINEncoder(num_layers=cfg.num_layers, emb_dim=cfg.emb_dim, drop_ratio=dropout,
                         jk=cfg.jk, pooling="mean")


def pretrain_loss(cfg: MoleculeNetConfig, loss: str) -> torch.nn.Module:
    """The pre-training loss ``loss`` with the run's temperature and tile size (and MACL's
    alpha, A0)."""
    extra = {"alpha": cfg.alpha, "a0": cfg.a0} if loss == "macl" else {}
    return graphcl_loss(loss, temperature=cfg.temperature, tile_size=cfg.tile_size, **extra)


def pretrained_encoder(cfg: MoleculeNetConfig, loss: str, final: Path,
                       corpus: Callable[[], Any], log_dir: Path) -> dict[str, Any] | None:
    """The checkpoint of the encoder pre-trained with ``loss``: read from ``final`` (a corrupt
    one set aside), else pre-trained on ``corpus()`` (resumed from ``<final>.lightning/``'s
    ``last.ckpt``) and written there; ``None`` on a non-zero rank."""
    done = torch_load_checked(final, what="pre-trained encoder", weights_only=True)
    if done is not None:
        return done
    molecules = corpus()
    seed_everything(cfg.pretrain_seed)  # the same initial weights on every rank
    device = resolve_device(cfg.device)
    model = GraphCL(build_encoder(cfg, dropout=0.0), xavier_init=False,
                    loss_fn=pretrain_loss(cfg, loss)).to(device)
    augment = torch.Generator()

    def pairs(rank: int) -> TwoViewDataset:
        augment.manual_seed(cfg.pretrain_seed + AUGMENTATION_RANK_STRIDE * rank)
        view = graphcl_augmentation(cfg.aug, cfg.aug_ratio, generator=augment)
        return TwoViewDataset(molecules, view, view)

    checkpoints = final.with_suffix(".lightning")
    run = fit_graphs(model, pairs, epochs=cfg.pretrain_epochs, batch_size=cfg.pretrain_batch_size,
                     lr=cfg.pretrain_lr, device=device, precision=cfg.precision,
                     shuffle_seed=cfg.pretrain_seed + 1, where=f"pre-training {loss}",
                     devices=cfg.devices, strategy=cfg.strategy, progress=cfg.progress,
                     logger=cfg.logger, log_dir=log_dir, checkpoint_dir=checkpoints,
                     generators={"augment": augment})
    if run is None:
        return None
    checkpoint = {"encoder": model.encoder.state_dict(), "loss": loss,
                  "loss_module": repr(model.loss_fn), "num_molecules": len(molecules),
                  "num_invalid": molecules.num_invalid, "corpus": molecules.source,
                  "epoch_loss": run.epoch_loss, "epoch_seconds": run.epoch_seconds,
                  "steps": run.steps, "step_stats": run.step_stats}
    if cfg.devices > 1:
        checkpoint |= {"devices": cfg.devices, "strategy": cfg.strategy}
    torch_save_atomic(checkpoint, final)
    shutil.rmtree(checkpoints, ignore_errors=True)
    return checkpoint


def roc_auc(model: torch.nn.Module, graphs: list[Any], device: str) -> dict[str, Any]:
    """Multi-task ROC-AUC of ``model``'s scores on labelled graphs (left in eval mode)."""
    model.eval()
    scores, labels = embed_graphs(model, graphs, device=device,
                                  where="fine-tuned model scores", allow_constant=True)
    return multitask_roc_auc(labels, scores)


def finetune(cfg: MoleculeNetConfig, cell: Cell, dataset: Any,
             split: tuple[list[int], list[int], list[int]], encoder: dict[str, Any] | None,
             log_dir: Path) -> dict[str, Any]:
    """Fine-tune one (dataset, init, seed) from ``encoder``'s weights (or fresh ones); the record:
    test ROC-AUC at the last epoch (the paper's protocol) and at the best validation epoch."""
    train, valid, test = ([dataset[i] for i in part] for part in split)
    seed_everything(cell.seed)
    device = resolve_device(cfg.device)
    model = MolPropertyModel(build_encoder(cfg, cfg.dropout), dataset.num_tasks)
    if encoder is not None:
        model.encoder.load_state_dict(encoder)
    model.to(device)
    history: dict[str, list[Any]] = {"valid_roc": [], "test_roc": []}
    last: dict[str, Any] = {}

    def evaluate(epoch: int, steps: int) -> None:
        for key, graphs in (("valid_roc", valid), ("test_roc", test)):
            last[key] = roc_auc(model, graphs, device)
            history[key].append(None if math.isnan(last[key]["mean"]) else last[key]["mean"])
        model.train()  # Lightning trains the next epoch with the model as this leaves it

    start = time.perf_counter()  # one device: this process is rank 0 and gets the run
    run = fit_graphs(model, lambda rank: train, epochs=cfg.finetune_epochs,
                     batch_size=cfg.batch_size, lr=cfg.lr, weight_decay=cfg.weight_decay,
                     device=device, precision=cfg.precision, shuffle_seed=cell.seed,
                     where=cell.label(),
                     step_loss=lambda batch: masked_bce_loss(model(batch), batch.y),
                     progress=cfg.progress, logger=cfg.logger, log_dir=log_dir,
                     on_epoch=evaluate)
    history = {"train_loss": run.epoch_loss, **history}
    finite = [(v, i) for i, v in enumerate(history["valid_roc"]) if v is not None]
    best = max(finite, key=lambda t: (t[0], -t[1]))[1] if finite else -1  # -1: none finite
    return {"metrics": {"test_roc_last": history["test_roc"][-1],
                        "test_roc_best_valid": history["test_roc"][best]},
            "optimisation_steps": run.steps, "losses": run.epoch_loss,
            "best_epoch": best + 1,
            "valid_roc_best": history["valid_roc"][best],
            "test_per_task_last": last["test_roc"]["per_task"],
            "test_tasks_skipped": last["test_roc"]["num_skipped"],
            "num_tasks": dataset.num_tasks, "split_sizes": [len(train), len(valid), len(test)],
            "history": history, "train_seconds": time.perf_counter() - start}
