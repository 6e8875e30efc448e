"""``trainer.fit`` as the recipes run it: Lightning turns Ctrl-C (and the CLI's SIGTERM) into
``SystemExit(1)`` and leaves SIGINT ignored; :func:`fit` raises the interrupt again and restores
SIGINT's handler, so the CLI says what happened in one line, and a run on several devices whose
other process died stops with one line, not a gloo traceback."""

from __future__ import annotations

import signal
import threading
import warnings
from pathlib import Path
from typing import Any

import pytorch_lightning as pl

from adaptcl.recipes.engine.errors import RunStopped
from adaptcl.recipes.engine.files import torch_load_checked

#: what a process of a distributed run sees when another one has ended (gloo and NCCL)
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
              "NCCL communicator was aborted", "connection closed")


def fit(trainer: pl.Trainer, module: pl.LightningModule, *args: Any, **kwargs: Any) -> None:
    """``trainer.fit(module, *args, **kwargs)``: an interrupt raised again after Lightning's
    shutdown, :class:`~adaptcl.recipes.engine.errors.RunStopped` when another rank ended."""
    interrupts: list[BaseException] = []  # what Lightning's on_exception hook saw
    trainer.callbacks.append(pl.callbacks.LambdaCallback(on_exception=lambda t, m, err: (
        interrupts.append(err) if isinstance(err, KeyboardInterrupt) else None)))
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
    except SystemExit:
        if not interrupts:
            raise
        raise interrupts[-1] from None
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
