"""Where a Lightning module's training was resumed: a mixin that records it.

Needs no framework itself; mix it in before ``pl.LightningModule`` (its ``on_train_start`` is
Lightning's hook) and call :meth:`ResumeRecord.record_resume` from ``on_load_checkpoint``. Used
by the image methods' :class:`~adaptcl.adapters.lightning.modules.SSLModule` and the ``clip``
recipe's module.

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
from typing import Any

__all__ = ["ResumeRecord"]


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
