"""GraphCL training of the graph recipes (``tu``, ``moleculenet``), through Lightning, on one
device or several: pre-training and supervised fine-tuning are one path,
:func:`fit_graphs`, over :class:`~adaptcl.adapters.graphcl.lightning.GraphCLModule`.

On one device the loader shuffles with its own seeded generator, exactly as a plain loop over
:func:`~adaptcl.adapters.graphcl.train_epoch` does, and the numbers are that loop's bit for
bit. On ``devices`` processes (``strategy="ddp"``) each rank takes ``batch_size / devices``
graphs a step from a ``DistributedSampler`` shuffled with the same seed, draws its
augmentations from its own stream, and the loss gathers the whole batch; rank 0 alone gets
the result. With a ``checkpoint_dir`` every epoch ends in Lightning's ``last.ckpt`` (weights,
optimiser, loop, the generators of :class:`RandomStates`) and a run resumes from it exactly.

Needs ``pytorch-lightning`` and ``torch-geometric`` (the ``graph`` extra).
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
from adaptcl.adapters.lightning.trainer import TrainingClock, build_trainer
from adaptcl.plugins.validation import NonFiniteError
from adaptcl.recipes.common.lightning import fit
from adaptcl.recipes.engine.errors import DivergedError, require_steps, trained_embeddings
from adaptcl.recipes.engine.files import torch_load_checked
from adaptcl.recipes.engine.loggers import lightning_logger
from adaptcl.recipes.engine.progress import on_terminal
from adaptcl.recipes.engine.torch_env import loader_options


class RandomStates(pl.Callback):
    """The states of ``generators`` (augmentations, data order) and of torch's global RNG in
    every checkpoint, restored on resume, so a resumed run on one device draws what the
    uninterrupted one would have. On several devices the checkpoint holds rank 0's states
    only: there each rank's streams start again (the model, optimiser and loop resume)."""

    def __init__(self, generators: Mapping[str, torch.Generator], world: int = 1) -> None:
        self.generators, self.world = dict(generators), world

    def state_dict(self) -> dict[str, Any]:
        return {"torch": torch.get_rng_state(),
                **{name: g.get_state() for name, g in self.generators.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.world > 1:
            return
        torch.set_rng_state(state_dict["torch"])
        for name, generator in self.generators.items():
            generator.set_state(state_dict[name])


class _EachEpoch(pl.Callback):
    """``on_epoch(epoch, steps so far)`` after every training epoch, before its checkpoint."""

    def __init__(self, on_epoch: Callable[[int, int], None]) -> None:
        self.on_epoch = on_epoch

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.on_epoch(trainer.current_epoch, trainer.global_step)


@dataclass
class Training:
    """What a finished training gives rank 0: the mean loss per graph of each epoch (over all
    ranks), each epoch's seconds, the optimisation steps, and every step's loss and loss
    statistics (``step_stats``: key -> one value per step)."""

    epoch_loss: list[float]
    epoch_seconds: list[float]
    steps: int
    step_stats: dict[str, list[float]]


class _WholeEpoch(RandomSampler):
    """Draws each epoch's order at once. A loop that runs a loader to its end draws one more
    permutation from the generator when the data is an exact multiple of the batch (the
    sampler's empty remainder); Lightning stops after ``len(loader)`` batches and does not, so
    every later epoch's order would differ from the plain loop's."""

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
    """Train ``model`` with Lightning for ``epochs``; :class:`Training` on rank 0, else ``None``.

    ``dataset(rank)`` is the rank's dataset (two-view pairs, whose augmentations the rank draws
    from its own stream; or labelled graphs with ``step_loss``). Call this after seeding, so
    every rank builds the same initial weights. The optimiser is Adam (``lr``,
    ``weight_decay``); ``step_loss`` replaces GraphCL's ``model(b0, b1)`` (fine-tuning).
    ``logger`` (``none``, ``csv``, ``tensorboard``) writes every step's loss and statistics to
    ``log_dir`` through Lightning's logger; ``on_epoch(epoch, steps)`` runs after each epoch
    (an evaluation), before its checkpoint. ``checkpoint_dir``: ``last.ckpt`` after every epoch,
    resumed from when readable, with ``generators`` and torch's RNG (:class:`RandomStates`).
    A non-finite loss raises :class:`~adaptcl.recipes.engine.errors.DivergedError` with its
    step. After training the model is on ``device`` again, in eval mode.
    """
    clock = TrainingClock()
    shuffle = torch.Generator().manual_seed(shuffle_seed)
    callbacks: list[pl.Callback] = [
        clock, RandomStates({"shuffle": shuffle, **(generators or {})}, world=devices)]
    if on_epoch is not None:
        callbacks.append(_EachEpoch(on_epoch))
    trainer = build_trainer(epochs, device=device, devices=devices, strategy=strategy,
                            precision=precision, logger=lightning_logger(logger, log_dir or "."),
                            ckpt_dir=checkpoint_dir, callbacks=callbacks,
                            progress=on_terminal(progress))
    # the rank is known before the launcher starts the others: they run with LOCAL_RANK set
    rank, world = int(trainer.global_rank), int(trainer.world_size)
    loader = _loader(dataset(rank), batch_size, rank, world, shuffle, shuffle_seed, device)
    module = GraphCLModule(model, lr=lr, weight_decay=weight_decay, where=where,
                           step_loss=step_loss)
    last = checkpoint_dir / "last.ckpt" if checkpoint_dir is not None else None
    resume = last if last is not None and torch_load_checked(
        last, what="checkpoint", map_location="cpu", weights_only=False) is not None else None
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
    """``encode(batch)`` of every graph (no gradient), checked finite and non-constant.

    Returns ``(embeddings [n, d], labels [n, ...])`` as numpy arrays (labels ``None`` when
    ``labels=False``). ``allow_constant`` accepts identical rows (a classifier's scores may be).
    """
    outs, ys = [], []
    with torch.no_grad():
        for batch in DataLoader(graphs, batch_size=batch_size, shuffle=False):
            outs.append(encode(batch.to(device)).float().cpu())
            if labels:
                ys.append(batch.y.cpu())
    x = torch.cat(outs).numpy()
    trained_embeddings(x, where, allow_constant=allow_constant)
    return x, (torch.cat(ys).numpy() if labels else None)
