"""``trainer.fit`` as the recipes run it: Lightning turns Ctrl-C (and the CLI's SIGTERM) into
``SystemExit(1)`` and leaves SIGINT ignored; :func:`fit` raises the interrupt again and restores
SIGINT's handler, so the CLI says what happened in one line, and a run on several devices whose
other process died stops with one line, not a gloo traceback. On several devices a SIGTERM or a
Ctrl-C stops every rank at one point that they agree on (:class:`_StopTogether`), from the start
of ``fit`` (with :class:`~adaptcl.recipes.common.ddp.StartTogether`) to its end."""

from __future__ import annotations

import os
import signal
import threading
import warnings
from pathlib import Path
from typing import Any

import pytorch_lightning as pl

from adaptcl.recipes.common.ddp import HOST, STOPS, StartTogether, Stopping, peer_stopped
from adaptcl.recipes.engine.files import torch_load_checked

#: what a process of a distributed run sees when another one has ended (gloo and NCCL)
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
              "NCCL communicator was aborted", "connection closed")


class _StopTogether(pl.Callback):
    """A SIGTERM or a Ctrl-C to a run on several processes, acted on where every rank agrees.

    ``kill -- -PGID``, ``timeout``, SLURM and docker send SIGTERM to the whole process group,
    and Ctrl-C sends SIGINT to it, so every rank receives it, each somewhere else. Lightning's
    SIGTERM handler (``_SignalConnector._sigterm_notifier_fn``) broadcasts from inside the
    handler: that collective meets whatever collective the other rank is in (gloo aborts with
    "collective mismatch", or both ranks wait in a futex for ever), and the launcher's copy of
    the signal to rank 1 makes it broadcast twice. A handler that raises where the signal lands
    (the CLI's, Python's ``KeyboardInterrupt``) leaves the other rank in a collective alone, and
    a ``KeyboardInterrupt`` has Lightning SIGKILL the ranks it started. So from the start of
    ``fit`` to its end, both signals only note the first one here (:meth:`note`); the ranks act
    on it where they agree: before the process group's rendezvous (rank 0's word,
    :class:`~adaptcl.recipes.common.ddp.StartTogether`), then at the start of training, after
    every training step and at its end, where they reduce it (Lightning's
    ``reduce_boolean_decision``, as ``EarlyStopping`` does). When one rank has it, every rank
    raises :class:`~adaptcl.recipes.common.ddp.Stopping` at that same point, and :func:`fit`
    then calls :meth:`deliver`, the handler from before ``fit`` (the CLI's for SIGTERM,
    Python's ``KeyboardInterrupt`` for SIGINT; a rank stopped by another's signal takes
    SIGTERM's), outside the trainer. The reduction costs one barrier and one all-reduce of a
    number per step, beside Lightning's own per-step broadcast of its flag.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        main = threading.current_thread() is threading.main_thread()
        #: each stop signal's handler from before ``fit`` (none off the main thread)
        self.handlers: dict[int, Any] = ({s: signal.getsignal(s) for s in STOPS} if main
                                         else {})

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def note(self, signum: int, frame: object) -> None:
        """The handler of both signals while ``fit`` runs: no collective, nothing raised."""
        if self.signum is None:
            self.signum = signum

    def install(self) -> None:
        """Note SIGTERM (Lightning's handler replaces any other while it trains), and SIGINT
        where it raises (Python's ``KeyboardInterrupt``): ignored (a command started in the
        background ignores it), it stays ignored."""
        for signum, handler in self.handlers.items():
            if signum == signal.SIGTERM or callable(handler):
                signal.signal(signum, self.note)

    def restore(self) -> None:
        for signum, handler in self.handlers.items():
            if handler is not None:  # None: set from C, nothing Python can put back
                signal.signal(signum, handler)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # after Lightning's signal connector has put its SIGTERM handler in (Trainer._run)
        if signal.SIGTERM in self.handlers:
            signal.signal(signal.SIGTERM, self.note)
        self._agree(trainer)

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self._agree(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._agree(trainer)

    def _agree(self, trainer: pl.Trainer) -> None:
        if trainer.strategy.reduce_boolean_decision(self.requested, all=False):
            raise Stopping

    def deliver(self) -> None:
        """Run the handler from before ``fit`` of the signal noted (SIGTERM's when the stop
        came from another rank): it raises, as the CLI's does, or it returns: then the caller
        stops as Lightning does."""
        signum, self.signum = self.signum or signal.SIGTERM, None
        handler = self.handlers.get(signum)
        if callable(handler):
            handler(signum, None)


def fit(trainer: pl.Trainer, module: pl.LightningModule, *args: Any, **kwargs: Any) -> None:
    """``trainer.fit(module, *args, **kwargs)``: an interrupt raised again after Lightning's
    shutdown, :class:`~adaptcl.recipes.engine.errors.RunStopped` when another rank ended."""
    interrupts: list[BaseException] = []  # what Lightning's on_exception hook saw
    trainer.callbacks.append(pl.callbacks.LambdaCallback(on_exception=lambda t, m, err: (
        interrupts.append(err) if isinstance(err, KeyboardInterrupt) else None)))
    stop = _StopTogether()
    world = int(trainer.world_size)
    main = threading.current_thread() is threading.main_thread()
    sigint = signal.getsignal(signal.SIGINT) if main else None
    mask = None
    if world > 1:
        trainer.callbacks.append(stop)
        strategy = trainer.strategy
        if isinstance(strategy, StartTogether):
            strategy.stop_requested = lambda: stop.signum
            if not strategy.cluster_environment.creates_processes_externally:  # it starts them
                os.environ[HOST] = str(os.getpid())
                if main:  # the ranks start with both blocked: none is lost before their handlers
                    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
        if main:
            stop.install()
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
    except Stopping:  # every rank, at the same point
        stop.deliver()
        raise
    except SystemExit:
        if not interrupts:
            raise
        raise interrupts[-1] from None
    except RuntimeError as err:
        if stop.requested:  # the stop's own doing (a rank or a loader worker it ended)
            stop.deliver()
        if world < 2 or not any(text in str(err) for text in _PEER_GONE):
            raise
        raise peer_stopped(world, int(trainer.global_rank)) from None
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.environ.pop(HOST, None)
        if world > 1:
            stop.restore()
        elif main and sigint is not None:
            signal.signal(signal.SIGINT, sigint)
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
