"""One cell of ``adaptcl tu``: GraphCL pre-training of a GIN, then its embeddings scored by
:func:`~adaptcl.evaluation.graphs.svm_cv_accuracy`."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from adaptcl.adapters.graphcl import (
    GraphCL,
    Identity,
    TUGINEncoder,
    TwoViewDataset,
    graphcl_augmentation,
    graphcl_loss,
)
from adaptcl.evaluation.graphs import svm_cv_accuracy
from adaptcl.recipes.common.devices import AUGMENTATION_RANK_STRIDE
from adaptcl.recipes.common.graph_training import embed_graphs, fit_graphs
from adaptcl.recipes.common.schedule import schedule_steps
from adaptcl.recipes.engine.cells import Cell
from adaptcl.recipes.engine.torch_env import resolve_device, seed_everything
from adaptcl.recipes.tu.config import TUConfig


def build_loss(cfg: TUConfig, name: str, steps_per_epoch: int = 1) -> torch.nn.Module:
    """The loss module of ``name`` with the run's temperature and tile size (and MACL's alpha,
    A0; the schedule's tau_max and its period, ``schedule_period`` epochs of
    ``steps_per_epoch``)."""
    extra: dict[str, Any] = {}
    if name == "macl":
        extra = {"alpha": cfg.alpha, "a0": cfg.a0}
    elif name == "temperature_schedule":
        extra = {"max_temperature": cfg.max_temperature,
                 "period": schedule_steps(cfg.schedule_period, steps_per_epoch)}
    return graphcl_loss(name, temperature=cfg.temperature, tile_size=cfg.tile_size, **extra)


def views(cfg: TUConfig, dataset: str, generator: torch.Generator) -> tuple[Any, Any]:
    """The two view transforms of a run (first view identity unless ``first_view='augmented'``)."""
    second = graphcl_augmentation(cfg.augmentation(dataset), cfg.aug_ratio,
                                  graphcl_quirks=cfg.graphcl_quirks, generator=generator,
                                  subgraph_ratio=cfg.subgraph_ratio or None)
    return (Identity() if cfg.first_view == "identity" else second), second


def train_and_score(cfg: TUConfig, cell: Cell, graphs: list[Any], in_dim: int,
                    log_dir: Path) -> dict[str, Any] | None:
    """Pre-train one model and score it; the record on rank 0, ``None`` on the other ranks."""
    seed_everything(cell.seed)
    device = resolve_device(cfg.device)
    loss_fn = build_loss(cfg, cell.loss, math.ceil(len(graphs) / cfg.batch_size))
    model = GraphCL(TUGINEncoder(in_dim, cfg.hidden, cfg.layers), loss_fn=loss_fn).to(device)

    def pairs(rank: int) -> TwoViewDataset:  # each rank its own augmentation stream
        seed = 10_000 + cell.seed + AUGMENTATION_RANK_STRIDE * rank
        return TwoViewDataset(graphs, *views(cfg, cell.dataset,
                                             torch.Generator().manual_seed(seed)))

    start = time.perf_counter()
    run = fit_graphs(model, pairs, epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                     device=device, precision=cfg.precision, shuffle_seed=20_000 + cell.seed,
                     where=cell.label(), devices=cfg.devices, strategy=cfg.strategy,
                     progress=cfg.progress, logger=cfg.logger, log_dir=log_dir)
    train_seconds = time.perf_counter() - start
    if run is None:  # rank 0 evaluates and stores
        return None
    start = time.perf_counter()
    x, y = embed_graphs(model.embed, graphs, device=device, where=f"{cell.label()} embeddings")
    evaluation = svm_cv_accuracy(x, y, folds=cfg.folds, inner_folds=cfg.inner_folds,
                                 c_grid=cfg.c_grid, classifier=cfg.classifier,
                                 cv_seed=cfg.cv_seed, standardize=cfg.standardize)
    return {"metrics": {"accuracy": evaluation["accuracy"]}, "optimisation_steps": run.steps,
            "losses": run.epoch_loss, "aug": cfg.augmentation(cell.dataset),
            "loss_module": repr(loss_fn), "evaluation": evaluation,
            "step_stats": run.step_stats, "embedding_dim": int(x.shape[1]),
            "train_seconds": train_seconds, "eval_seconds": time.perf_counter() - start}
