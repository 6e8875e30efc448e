"""The step of GraphCL training, shared by :func:`~adaptcl.adapters.graphcl.train_epoch` (plain
PyTorch) and :class:`~adaptcl.adapters.graphcl.lightning.GraphCLModule` (Lightning).

Both loops leave the backward pass and the optimiser to their owner (the loop, or the Trainer)
and hand everything else to :class:`StepRecorder`: which batches take a step, the loss of one
batch with a divergence named by its step, when a non-finite loss is noticed, and what each step
records (the loss and the loss module's scalar statistics). So the two loops train and report
alike by construction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from adaptcl.plugins.validation import NonFiniteError

__all__ = ["StepRecorder", "two_views"]


def two_views(batch: Any) -> tuple[Any, ...]:
    """A loader's batch as a tuple of views: ``(b0, b1)`` of a two-view pair loader, or the
    single ``Batch`` of a supervised one."""
    return tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)


def scalar_stats(model: nn.Module) -> dict[str, object]:
    """The scalars of the loss's ``last_stats``; tensors stay on their device, unread."""
    stats = getattr(getattr(model, "loss_fn", None), "last_stats", None) or {}
    return {k: v.detach() if isinstance(v, Tensor) else v for k, v in stats.items()
            if (isinstance(v, Tensor) and v.numel() == 1) or isinstance(v, (int, float))}


def as_floats(values: list) -> list[float]:
    """Python floats from per-step values, reading device tensors with one transfer."""
    if values and all(isinstance(v, Tensor) for v in values):
        return torch.stack([v.reshape(()).float() for v in values]).tolist()
    return [float(v) for v in values]


class StepRecorder:
    """One run's (or epoch's) steps: the loss of each batch, its finiteness, its records.

    Args:
        where: names the run in a :class:`~adaptcl.plugins.validation.NonFiniteError`.
        sync_each_step: read each loss on the host as it is computed, so a non-finite loss
            raises before its backward pass and optimiser step. ``None``: on the CPU, where
            reading is free; on an accelerator the losses, their finiteness and the statistics
            stay on the device until :meth:`flush`, so no step waits for the host.
        first_step: the number of the first step recorded (a resumed run's steps so far + 1).

    Per batch: :meth:`loss` (``None`` for a batch that takes no step), the owner's backward
    and optimiser step, :meth:`record`; at the end :meth:`flush` returns the steps as float
    records and raises for a non-finite loss among them.
    """

    def __init__(self, where: str, *, sync_each_step: bool | None = None,
                 first_step: int = 1) -> None:
        if sync_each_step not in (None, True, False):
            raise TypeError(f"sync_each_step must be None, True or False, got {sync_each_step!r}")
        self.where = where
        self.sync_each_step = sync_each_step
        #: the number of the last step begun (``first_step - 1`` before any)
        self.step = first_step - 1
        self.total: Tensor | None = None  # sum of loss x graphs over the steps, on the device
        self.count = 0  # graphs over the steps
        self._pending: list[dict[str, Any]] = []
        self._nonfinite: Tensor | None = None

    def takes_step(self, views: tuple[Any, ...], *, negatives_elsewhere: bool = False) -> bool:
        """Whether a batch takes a step: it has at least two graphs (a lone graph has no
        negative, and BatchNorm needs two samples), or its graphs meet negatives elsewhere
        (the other ranks' projections under a gathering loss)."""
        return negatives_elsewhere or int(views[0].num_graphs) >= 2

    def loss(self, compute_loss: Callable[..., Tensor], views: tuple[Any, ...]) -> Tensor:
        """``compute_loss(*views)``, the next step's loss; a non-finite loss read on the host
        (``sync_each_step``) or embeddings the loss refuses raise
        :class:`~adaptcl.plugins.validation.NonFiniteError` with this step."""
        self.step += 1
        try:
            loss = compute_loss(*views)
        except NonFiniteError as err:  # the model's output went NaN: the previous step diverged
            raise NonFiniteError(f"{err} on {self.where} at step {self.step}", step=self.step,
                                 loss=float("nan")) from err
        finite = torch.isfinite(loss.detach())
        if self.per_step(loss):
            if not bool(finite):  # before backward: the weights stay as they were
                raise NonFiniteError(f"non-finite loss on {self.where} at step {self.step}",
                                     step=self.step, loss=float(loss.detach()))
        else:
            self._nonfinite = ~finite if self._nonfinite is None else self._nonfinite | ~finite
        return loss

    def per_step(self, loss: Tensor) -> bool:
        """Whether this loss is read on the host at its step."""
        return (self.sync_each_step if self.sync_each_step is not None
                else loss.device.type == "cpu")

    def record(self, loss: Tensor, num_graphs: int, model: nn.Module,
               **extra: Any) -> dict[str, Any]:
        """Record the step just taken: its loss (key ``"loss"``), the loss module's scalar
        statistics and ``extra``; returns the record (values still tensors)."""
        value = loss.detach().float()
        step_total = value * num_graphs
        self.total = step_total if self.total is None else self.total + step_total
        self.count += num_graphs
        record: dict[str, Any] = {**extra, "loss": value, **{
            k: v for k, v in scalar_stats(model).items() if k != "loss"}}
        self._pending.append(record)
        return record

    def mean_loss(self) -> float:
        """The mean loss per graph over the recorded steps (0.0 when none)."""
        return float(self.total) / self.count if self.total is not None else 0.0

    def flush(self, into: list[dict[str, float]] | None = None) -> list[dict[str, float]]:
        """The steps recorded since the last flush as float records (one transfer per key),
        appended to ``into`` and returned; then a
        :class:`~adaptcl.plugins.validation.NonFiniteError` if a loss among them was
        non-finite (named by the last step begun)."""
        rows: list[dict[str, float]] = []
        if self._pending:
            keys = dict.fromkeys(k for record in self._pending for k in record)
            columns = {k: iter(as_floats([r[k] for r in self._pending if k in r])) for k in keys}
            rows = [{k: next(columns[k]) for k in r} for r in self._pending]
            self._pending = []
        if into is not None:
            into.extend(rows)
        if self._nonfinite is not None:
            nonfinite, self._nonfinite = bool(self._nonfinite), None
            if nonfinite:
                raise NonFiniteError(f"non-finite loss on {self.where} by step {self.step}",
                                     step=self.step, loss=float("nan"))
        return rows
