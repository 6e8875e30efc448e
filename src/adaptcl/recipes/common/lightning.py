"""``trainer.fit`` as the recipes run it: an interrupt comes out as it went in, and a run on
several devices whose other process died stops with one line, not a gloo traceback.

Lightning turns Ctrl-C (and the interrupt the CLI raises on SIGTERM) into a graceful shutdown
and ``SystemExit(1)``, and leaves SIGINT ignored; :func:`fit` raises the interrupt again after
that shutdown and restores SIGINT's handler, so the CLI says in one line what happened and that
a rerun resumes (exit 130 or 143), as for every other recipe.
"""

from __future__ import annotations

import signal
import threading
import warnings
from typing import Any

import pytorch_lightning as pl

from adaptcl.recipes.engine.errors import RunStopped

#: what a process of a distributed run sees when another one has ended (gloo and NCCL)
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
              "NCCL communicator was aborted", "connection closed")


class _Interrupt(pl.Callback):
    """Keeps the interrupt Lightning caught (its ``on_exception`` hook sees it)."""

    def __init__(self) -> None:
        self.exception: BaseException | None = None

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        if isinstance(exception, KeyboardInterrupt):
            self.exception = exception


def fit(trainer: pl.Trainer, module: pl.LightningModule, *args: Any, **kwargs: Any) -> None:
    """``trainer.fit(module, *args, **kwargs)``, raising an interrupt again after Lightning's
    shutdown, and :class:`~adaptcl.recipes.engine.errors.RunStopped` naming the rank when
    another process of the run ended."""
    interrupt = _Interrupt()
    trainer.callbacks.append(interrupt)
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
            trainer.fit(module, *args, **kwargs)
    except SystemExit:
        if interrupt.exception is None:
            raise
        raise interrupt.exception from None
    except RuntimeError as err:
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
