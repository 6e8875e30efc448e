"""``trainer.fit`` as the recipes run it: Lightning turns Ctrl-C (and the CLI's SIGTERM) into
``SystemExit(1)`` and leaves SIGINT ignored; :func:`fit` raises the interrupt again and restores
SIGINT's handler, so the CLI says what happened in one line, and a run on several devices whose
other process died stops with one line, not a gloo traceback. On several devices a SIGTERM
stops every rank at the same training step (:class:`_StopTogether`)."""

from __future__ import annotations

import signal
import threading
import warnings
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.utilities.exceptions import SIGTERMException

from adaptcl.recipes.engine.errors import RunStopped
from adaptcl.recipes.engine.files import torch_load_checked

#: what a process of a distributed run sees when another one has ended (gloo and NCCL)
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
              "NCCL communicator was aborted", "connection closed")


class _StopTogether(pl.Callback):
    """A SIGTERM to a run on several processes, acted on at a step that every rank agrees on.

    ``kill -- -PGID``, ``timeout``, SLURM and docker send SIGTERM to the whole process group, so
    every rank receives it, each somewhere else in its step. Lightning's handler
    (``_SignalConnector._sigterm_notifier_fn``) broadcasts from inside the handler: that
    collective meets whatever collective the other rank is in (gloo aborts with "collective
    mismatch", or both ranks wait in a futex for ever), and the launcher's copy of the signal
    to rank 1 makes it broadcast twice. A handler that raises where the signal lands (the
    CLI's) leaves the other rank in a collective alone. So while training runs, SIGTERM only
    sets :attr:`requested` here; after every training step and at the end of training the
    ranks reduce it (Lightning's ``reduce_boolean_decision``, as ``EarlyStopping`` does), and
    when one has it every rank raises Lightning's ``SIGTERMException`` at that same step.
    :func:`fit` then calls :attr:`handler`, the SIGTERM handler from before Lightning's (the
    CLI's: the run stops as on Ctrl-C), outside the trainer. Lightning restores that handler
    when ``fit`` ends, so after training a SIGTERM is the CLI's again; before training starts
    (the ranks' set-up) it is handled as it was. The reduction costs one barrier and one
    all-reduce of a number per step, beside Lightning's own per-step broadcast of its flag.
    """

    def __init__(self) -> None:
        self.requested = False
        main = threading.current_thread() is threading.main_thread()
        self.handler: Any = signal.getsignal(signal.SIGTERM) if main else None

    def note(self, signum: int, frame: object) -> None:
        """The SIGTERM handler while training runs: no collective, nothing raised."""
        self.requested = True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # after Lightning's signal connector has put its handler in (Trainer._run)
        if self.handler is not None:
            signal.signal(signal.SIGTERM, self.note)

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self._agree(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._agree(trainer)

    def _agree(self, trainer: pl.Trainer) -> None:
        if trainer.strategy.reduce_boolean_decision(self.requested, all=False):
            raise SIGTERMException

    def deliver(self) -> None:
        """Run the SIGTERM handler that was there before Lightning's (it raises, as the CLI's
        does, or it returns: then the caller stops as Lightning does)."""
        self.requested = False
        if callable(self.handler):
            self.handler(signal.SIGTERM, None)


def fit(trainer: pl.Trainer, module: pl.LightningModule, *args: Any, **kwargs: Any) -> None:
    """``trainer.fit(module, *args, **kwargs)``: an interrupt raised again after Lightning's
    shutdown, :class:`~adaptcl.recipes.engine.errors.RunStopped` when another rank ended."""
    interrupts: list[BaseException] = []  # what Lightning's on_exception hook saw
    trainer.callbacks.append(pl.callbacks.LambdaCallback(on_exception=lambda t, m, err: (
        interrupts.append(err) if isinstance(err, KeyboardInterrupt) else None)))
    stop = _StopTogether()
    if int(trainer.world_size) > 1:
        trainer.callbacks.append(stop)
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGINT) if main else None
    try:
        with warnings.catch_warnings():
            # Lightning builds torch's deprecated LeafSpec (torch >= 2.10): not the user's to fix
            warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                                    FutureWarning)
            # the kNN monitor is a validation step a run without --knn-every does not use
            warnings.filterwarnings("ignore", "You defined a `validation_step` but have no "
                                    "`val_dataloader`")
            if kwargs.get("ckpt_path") is not None:  # resuming: the folder holds the run's own
                warnings.filterwarnings("ignore", r"Checkpoint directory .* exists and is not "
                                        r"empty\.", UserWarning)
            trainer.fit(module, *args, **kwargs)
    except SIGTERMException:  # every rank, at the same step
        stop.deliver()
        raise
    except SystemExit:
        if not interrupts:
            raise
        raise interrupts[-1] from None
    except RuntimeError as err:
        if stop.requested:  # the stop's own doing (a rank or a loader worker it ended)
            stop.deliver()
        world = int(trainer.world_size)
        if world < 2 or not any(text in str(err) for text in _PEER_GONE):
            raise
        rank = int(trainer.global_rank)
        other = f"rank {1 - rank}" if world == 2 else "another rank"
        raise RunStopped(f"{other} of {world} processes stopped (it was killed or crashed; its "
                         f"own output says why), so rank {rank} stopped too") from None
    finally:
        if main and handler is not None:
            signal.signal(signal.SIGINT, handler)
    if stop.requested:  # it came after training's last agreed step
        stop.deliver()


def resume_checkpoint(ckpt_dir: Path | None) -> Path | None:
    """The ``last.ckpt`` an interrupted run left in ``ckpt_dir``, or ``None``; a killed write's
    temporary file is removed, an unreadable checkpoint (a full disk's) named and set aside."""
    if ckpt_dir is None:
        return None
    for stale in ckpt_dir.glob(".*.tmp"):
        stale.unlink(missing_ok=True)
    last = ckpt_dir / "last.ckpt"
    readable = torch_load_checked(last, what="checkpoint", map_location="cpu",
                                  weights_only=False) is not None
    return last if readable else None
