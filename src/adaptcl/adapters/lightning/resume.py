"""What a Lightning module carries across a resume, as two mixins: :class:`CheckpointedHistory`
(the lists it keeps per step or epoch, in the checkpoint) and :class:`ResumeRecord` (where the
training was resumed).

They need no framework themselves, so the graph adapter's module mixes them in without the
image methods' (Lightly) part of this package; mix them in before ``pl.LightningModule`` (their
``on_save_checkpoint``, ``on_load_checkpoint`` and ``on_train_start`` are Lightning's hooks) and
call :meth:`ResumeRecord.record_resume` from ``on_load_checkpoint``. Used by the image methods'
:class:`~adaptcl.adapters.lightning.base.SSLModule`, the graph adapter's
:class:`~adaptcl.adapters.graphcl.lightning.GraphCLModule` and the ``clip`` recipe's module.

Example:
    >>> class Model(ResumeRecord):
    ...     current_epoch, global_step = 1, 30
    >>> model = Model()
    >>> model.record_resume({"epoch": 0, "global_step": 30})
    >>> model.on_train_start()
    >>> model.resumed_from
    {'checkpoint_epoch': 0, 'checkpoint_global_step': 30, 'start_epoch': 1, 'start_global_step': 30}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = ["CheckpointedHistory", "ResumeRecord"]

#: the checkpoint's entry holding a module's :attr:`CheckpointedHistory.checkpointed` lists
CHECKPOINT_KEY = "adaptcl_history"


class CheckpointedHistory:
    """The lists named in :attr:`checkpointed` travel in the checkpoint (under
    ``"adaptcl_history"``), so a resumed run's curves go on where they stopped; each item is
    restored as a copy (a record ``dict`` as a new dict). A module that must complete a list
    before it is saved overrides the hook and calls ``super()``.

    Example:
        >>> class Model(CheckpointedHistory):
        ...     checkpointed = ("history", "epoch_losses")
        >>> model, checkpoint = Model(), {}
        >>> model.history, model.epoch_losses = [{"loss": 1.5}], [1.5]
        >>> model.on_save_checkpoint(checkpoint)
        >>> resumed = Model()
        >>> resumed.on_load_checkpoint(checkpoint)
        >>> resumed.history, resumed.epoch_losses
        ([{'loss': 1.5}], [1.5])
    """

    #: the names of the list attributes the checkpoint holds
    checkpointed: ClassVar[tuple[str, ...]] = ("history",)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[CHECKPOINT_KEY] = {name: list(getattr(self, name))
                                      for name in self.checkpointed}

    def on_load_checkpoint(self, checkpoint: Mapping[str, Any]) -> None:
        saved = checkpoint.get(CHECKPOINT_KEY) or {}
        for name in self.checkpointed:
            setattr(self, name, [dict(item) if isinstance(item, Mapping) else item
                                 for item in saved.get(name, [])])


class ResumeRecord:
    """``resumed_from``: ``None`` for a fresh run; after a resume the checkpoint's epoch and
    global step (``checkpoint_epoch``, ``checkpoint_global_step``) and, once training starts,
    the epoch and global step it restarted at (``start_epoch``, ``start_global_step``)."""

    resumed_from: dict[str, int] | None = None

    def record_resume(self, checkpoint: Mapping[str, Any]) -> None:
        """Note the checkpoint being loaded (call from ``on_load_checkpoint``)."""
        self.resumed_from = {"checkpoint_epoch": int(checkpoint.get("epoch", -1)),
                             "checkpoint_global_step": int(checkpoint.get("global_step", -1))}

    def on_train_start(self) -> None:
        if self.resumed_from is not None:
            self.resumed_from.update(start_epoch=int(self.current_epoch),  # type: ignore[attr-defined]
                                     start_global_step=int(self.global_step))  # type: ignore[attr-defined]
