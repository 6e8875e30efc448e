"""GraphCL training of ``tu`` and ``moleculenet`` through Lightning, pre-training and
fine-tuning alike (:func:`fit_graphs`). On one device the numbers are a plain loop's over
:func:`~adaptcl.adapters.graphcl.train_epoch` bit for bit; on several each rank takes its share
of the batch and draws its own augmentations, and the loss gathers the whole batch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import Dataset, DistributedSampler, RandomSampler
from torch_geometric.loader import DataLoader

from adaptcl.adapters.graphcl.lightning import GraphCLModule
from adaptcl.adapters.lightning.trainer import RandomStates, TrainingClock, build_trainer
from adaptcl.plugins.validation import NonFiniteError
from adaptcl.recipes.common.ddp import ddp_strategy
from adaptcl.recipes.common.lightning import fit, resume_checkpoint
from adaptcl.recipes.engine.errors import DivergedError, require_steps, trained_embeddings
from adaptcl.recipes.engine.loggers import lightning_logger
from adaptcl.recipes.engine.progress import on_terminal
from adaptcl.recipes.engine.torch_env import loader_options


@dataclass
class Training:
    """What a finished training gives rank 0: each epoch's mean loss per graph (over all ranks)
    and seconds, the steps, and every step's loss statistics (key -> one value per step)."""

    epoch_loss: list[float]
    epoch_seconds: list[float]
    steps: int
    step_stats: dict[str, list[float]]


class _WholeEpoch(RandomSampler):
    """Draws each epoch's order at once: a plain loop run to the loader's end draws one more
    permutation when the batch divides the data; Lightning, stopping after ``len(loader)``
    batches, would not, and every later epoch's order would differ."""

    def __iter__(self) -> Iterator[int]:
        return iter(list(super().__iter__()))


def _loader(dataset: Dataset, batch_size: int, rank: int, world: int, shuffle: torch.Generator,
            seed: int, device: str) -> DataLoader:
    if world == 1:  # the order of a plain loop over DataLoader(shuffle=True, generator=shuffle)
        return DataLoader(dataset, batch_size=batch_size, generator=shuffle,
                          sampler=_WholeEpoch(dataset, generator=shuffle),
                          **loader_options(device))
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                 seed=seed)  # Lightning keeps it and sets its epoch
    return DataLoader(dataset, batch_size=batch_size // world, sampler=sampler,
                      **loader_options(device))


def fit_graphs(model: torch.nn.Module, dataset: Callable[[int], Dataset], *, epochs: int,
               batch_size: int, lr: float, device: str, precision: str, shuffle_seed: int,
               where: str, weight_decay: float = 0.0,
               step_loss: Callable[..., torch.Tensor] | None = None, devices: int = 1,
               strategy: str = "auto", progress: bool = False, logger: str = "none",
               log_dir: Path | None = None, checkpoint_dir: Path | None = None,
               generators: Mapping[str, torch.Generator] | None = None,
               on_epoch: Callable[[int, int], None] | None = None) -> Training | None:
    """Train ``model`` with Lightning and Adam; :class:`Training` on rank 0, else ``None``.

    ``dataset(rank)`` is the rank's dataset (two-view pairs, or labelled graphs with
    ``step_loss``, which replaces GraphCL's ``model(b0, b1)``). Call this after seeding, so
    every rank builds the same initial weights. ``on_epoch(epoch, steps)`` runs after each
    epoch, before its checkpoint; ``checkpoint_dir`` holds ``last.ckpt`` (with ``generators``),
    resumed from when readable. A non-finite loss raises
    :class:`~adaptcl.recipes.engine.errors.DivergedError`. The model ends on ``device``, in
    eval mode.
    """
    clock = TrainingClock()
    shuffle = torch.Generator().manual_seed(shuffle_seed)
    callbacks: list[pl.Callback] = [
        clock, RandomStates({"shuffle": shuffle, **(generators or {})}, world=devices)]
    if on_epoch is not None:
        callbacks.append(pl.callbacks.LambdaCallback(on_train_epoch_end=lambda trainer, _: (
            on_epoch(trainer.current_epoch, trainer.global_step))))
    trainer = build_trainer(epochs, device=device, devices=devices,
                            strategy=ddp_strategy(strategy, devices),
                            precision=precision, logger=lightning_logger(logger, log_dir or "."),
                            ckpt_dir=checkpoint_dir, callbacks=callbacks,
                            progress=on_terminal(progress))
    # the rank is known before the launcher starts the others: they run with LOCAL_RANK set
    rank, world = int(trainer.global_rank), int(trainer.world_size)
    loader = _loader(dataset(rank), batch_size, rank, world, shuffle, shuffle_seed, device)
    module = GraphCLModule(model, lr=lr, weight_decay=weight_decay, where=where,
                           step_loss=step_loss)
    resume = resume_checkpoint(checkpoint_dir)
    if resume is not None and rank == 0:
        print(f"adaptcl: {where} resumes from {resume}", file=sys.stderr, flush=True)
    try:
        fit(trainer, module, loader, ckpt_path=str(resume) if resume is not None else None)
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
    return Training(epoch_loss=list(module.epoch_losses), epoch_seconds=list(clock.epoch_seconds),
                    steps=len(module.history), step_stats=step_stats)


def embed_graphs(encode: Callable[[Any], Any], graphs: Any, *, device: str = "cpu",
                 batch_size: int = 256, where: str = "embeddings", labels: bool = True,
                 allow_constant: bool = False) -> tuple[Any, Any]:
    """``(encode(batch) [n, d], labels [n, ...])`` of every graph as numpy arrays (no gradient;
    labels ``None`` when ``labels=False``), checked finite and, unless ``allow_constant`` (a
    classifier's scores), not constant."""
    outs, ys = [], []
    with torch.no_grad():
        for batch in DataLoader(graphs, batch_size=batch_size, shuffle=False):
            outs.append(encode(batch.to(device)).float().cpu())
            if labels:
                ys.append(batch.y.cpu())
    x = torch.cat(outs).numpy()
    trained_embeddings(x, where, allow_constant=allow_constant)
    return x, (torch.cat(ys).numpy() if labels else None)
