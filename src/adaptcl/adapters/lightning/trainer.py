"""Lightning's ``Trainer`` by device name, atomic checkpoints and the clock of a run: what every
Lightning training of adaptcl shares (the image methods and GraphCL).

Needs ``pytorch-lightning`` only (in the ``vision`` and the ``graph`` extras).

Example:
    >>> from adaptcl.adapters.lightning.trainer import TrainingClock, build_trainer
    >>> clock = TrainingClock()
    >>> trainer = build_trainer(5, device="cpu", ckpt_dir="runs/a", callbacks=[clock])
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from adaptcl.adapters import require
from adaptcl.io import atomic_write
from adaptcl.precision import Precision

pl = require("pytorch_lightning", "vision")

__all__ = ["AtomicCheckpointIO", "RandomStates", "StepMeter", "TrainingClock", "build_trainer"]


class AtomicCheckpointIO(pl.plugins.TorchCheckpointIO):
    """``TorchCheckpointIO`` that never leaves a half-written checkpoint behind.

    Lightning's own ``_atomic_save`` goes through an fsspec transaction whose temporary file is
    created in the system temp folder and then *moved*; across file systems that move is a copy,
    so a killed process can leave a truncated ``last.ckpt``. Here the checkpoint is written to a
    temporary file in the destination folder, fsynced and renamed with ``os.replace``.

    Examples:
        >>> trainer = pl.Trainer(plugins=[AtomicCheckpointIO()],
        ...                      callbacks=[ModelCheckpoint(dirpath=run_dir, save_last=True)])
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO does not take storage_options")
        atomic_write(path, lambda handle: torch.save(checkpoint, handle))


class TrainingClock(pl.Callback):
    """The seconds of every training epoch, over every invocation of a resumed run.

    Its state travels in Lightning's checkpoints, so after a resumed ``fit`` ``epoch_seconds``
    holds every epoch of the run and ``seconds`` their sum, not only the last invocation's.

    >>> TrainingClock().seconds
    0.0
    """

    def __init__(self) -> None:
        self.epoch_seconds: list[float] = []
        self._start = 0.0

    @property
    def seconds(self) -> float:
        return sum(self.epoch_seconds)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning runs checkpoint callbacks last, so the saved state includes this epoch
        self.epoch_seconds.append(time.perf_counter() - self._start)

    def state_dict(self) -> dict[str, list[float]]:
        return {"epoch_seconds": list(self.epoch_seconds)}

    def load_state_dict(self, state_dict: dict[str, list[float]]) -> None:
        self.epoch_seconds = [float(s) for s in state_dict["epoch_seconds"]]


class StepMeter(pl.Callback):
    """What a training step costs: its mean seconds (the batch's forward, backward and
    optimiser step, CUDA synchronised at both ends) and the peak CUDA memory allocated during
    one (reset before every step; ``None`` on the CPU), over every invocation of a resumed run
    (its state travels in the checkpoints).

    >>> StepMeter().seconds_per_step is None
    True
    """

    def __init__(self) -> None:
        self.steps, self.seconds, self.peak_bytes = 0, 0.0, None
        self._start = 0.0

    @property
    def seconds_per_step(self) -> float | None:
        return self.seconds / self.steps if self.steps else None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
            peak = torch.cuda.max_memory_allocated(pl_module.device)
            self.peak_bytes = max(self.peak_bytes or 0, peak)
        self.seconds += time.perf_counter() - self._start
        self.steps += 1

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "seconds": self.seconds, "peak_bytes": self.peak_bytes}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps, self.seconds = int(state_dict["steps"]), float(state_dict["seconds"])
        self.peak_bytes = state_dict["peak_bytes"]


class RandomStates(pl.Callback):
    """The random states a run draws its data from, saved in every checkpoint and restored on
    resume, so that a run resumed from an epoch's checkpoint is the uninterrupted run.

    Python's ``random``, numpy's global generator, torch's CPU generator (the augmentations of
    a loader without workers), CUDA's, and the named ``generators`` (e.g. a ``DataLoader``'s
    ``generator=``, which draws each epoch's order and the seed of the epoch's workers). They
    are restored when the checkpoint is loaded, before the first epoch's loader is iterated.

    Not covered: several devices (``world > 1``: the checkpoint holds rank 0's states only, so
    each rank's streams start again) and a loader with *persistent* workers (seeded once per
    process, by a draw from the loader's generator the uninterrupted run made only at its
    start; their own streams go on from epoch to epoch, and no checkpoint holds them).

    >>> states = RandomStates({"order": torch.Generator().manual_seed(0)})
    >>> sorted(states.state_dict())
    ['numpy', 'order', 'python', 'torch']
    """

    _GLOBAL = ("python", "numpy", "torch", "cuda")

    def __init__(self, generators: Mapping[str, torch.Generator], world: int = 1) -> None:
        clash = sorted(set(generators) & set(self._GLOBAL))
        if clash:
            raise ValueError(f"generators: {clash} name global states; choose other names")
        self.generators, self.world = dict(generators), world

    def state_dict(self) -> dict[str, Any]:
        import numpy as np

        _, keys, pos, has_gauss, gauss = np.random.get_state()
        state: dict[str, Any] = {
            "python": random.getstate(), "torch": torch.get_rng_state(),
            # plain lists and numbers: a checkpoint stays loadable with weights_only
            "numpy": [keys.tolist(), int(pos), int(has_gauss), float(gauss)],
            **{name: g.get_state() for name, g in self.generators.items()}}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        import numpy as np

        if self.world > 1:
            return
        torch.set_rng_state(state_dict["torch"])
        for name, generator in self.generators.items():
            generator.set_state(state_dict[name])
        # checkpoints written before python's, numpy's and CUDA's states were kept lack them
        if "python" in state_dict:
            random.setstate(state_dict["python"])
        if "numpy" in state_dict:
            keys, pos, has_gauss, gauss = state_dict["numpy"]
            np.random.set_state(("MT19937", np.asarray(keys, dtype=np.uint32), pos, has_gauss,
                                 gauss))
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])


def build_trainer(max_epochs: int, *, device: str = "cpu", devices: int = 1,
                  strategy: str | Any = "auto", precision: Precision = "32", logger: Any = False,
                  ckpt_dir: str | Path | None = None, callbacks: list[Any] | None = None,
                  progress: bool = True, val_every: int = 0) -> pl.Trainer:
    """Lightning's ``Trainer`` for ``device`` (``"cpu"``, ``"cuda"`` or ``"cuda:N"``).

    ``devices``/``strategy`` (e.g. 4 and ``"ddp"``, or a ``Strategy`` as the Trainer takes it;
    SyncBatchNorm on GPUs under DDP), ``precision`` and ``logger`` go to the Trainer as they
    are. With ``ckpt_dir``, ``last.ckpt`` is written there after every training epoch (no
    version counter, through :class:`AtomicCheckpointIO`), so ``fit(...,
    ckpt_path=<ckpt_dir>/last.ckpt)`` resumes. ``val_every`` runs the validation loop (the
    online kNN monitor) every that many epochs, 0 never.
    """
    from pytorch_lightning.callbacks import ModelCheckpoint

    callbacks, plugins = list(callbacks or []), []
    if ckpt_dir is not None:
        callbacks.append(ModelCheckpoint(dirpath=str(ckpt_dir), filename="{epoch}",
                                         save_last=True, every_n_epochs=1,
                                         save_on_train_epoch_end=True,
                                         enable_version_counter=False))
        plugins.append(AtomicCheckpointIO())
    accelerator = "gpu" if device.startswith("cuda") else "cpu"
    ddp = (strategy.startswith("ddp") if isinstance(strategy, str)
           else isinstance(strategy, pl.strategies.DDPStrategy))
    chosen: Any = [int(device[5:])] if device.startswith("cuda:") else devices
    return pl.Trainer(
        max_epochs=max_epochs, accelerator=accelerator, devices=chosen, strategy=strategy,
        precision=precision, logger=logger, enable_checkpointing=ckpt_dir is not None,
        callbacks=callbacks, plugins=plugins, enable_progress_bar=progress,
        enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=1,
        check_val_every_n_epoch=max(1, val_every), limit_val_batches=1.0 if val_every else 0,
        # SyncBatchNorm needs GPU modules; CPU DDP keeps per-rank BN
        sync_batchnorm=ddp and accelerator == "gpu")

