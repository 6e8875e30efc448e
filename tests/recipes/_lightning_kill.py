"""A Lightning run killed at the start of an epoch, in-process: what the resume tests of the
Lightning recipes (``images``, ``clip``) share.

The callback raises :class:`Killed` at the start of epoch ``k``, after epoch ``k - 1``'s
checkpoint was written and before anything of epoch ``k`` ran: the stand-in for SIGKILL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pl = pytest.importorskip("pytorch_lightning")


class Killed(Exception):
    """The stand-in for SIGKILL."""


class KillAtEpoch(pl.Callback):
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            raise Killed(f"killed at the start of epoch {self.epoch}")


def kill_trainers_at_epoch(monkeypatch: pytest.MonkeyPatch, module: Any, factory: str,
                           epoch: int) -> Any:
    """Make ``module.<factory>`` (a recipe's Trainer factory) build Trainers that are killed at
    the start of ``epoch``; returns the original factory (``monkeypatch.setattr`` it back)."""
    original = getattr(module, factory)

    def killed(*args: Any, **kwargs: Any) -> Any:
        trainer = original(*args, **kwargs)
        trainer.callbacks.insert(0, KillAtEpoch(epoch))
        return trainer

    monkeypatch.setattr(module, factory, killed)
    return original


def killed_once(monkeypatch: pytest.MonkeyPatch, module: Any, factory: str,
                run: Callable[[], Any], epoch: int = 1) -> None:
    """``run()`` with ``module.<factory>``'s Trainers killed at the start of ``epoch`` (it must
    raise :class:`Killed`), then the factory restored: running again resumes."""
    original = kill_trainers_at_epoch(monkeypatch, module, factory, epoch)
    with pytest.raises(Killed):
        run()
    monkeypatch.setattr(module, factory, original)
