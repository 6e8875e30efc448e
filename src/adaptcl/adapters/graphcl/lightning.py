"""GraphCL pre-training as a PyTorch Lightning module: one device or many (``strategy="ddp"``).

:class:`GraphCLModule` trains a :class:`~adaptcl.adapters.graphcl.GraphCL` model (You et al.,
"Graph Contrastive Learning with Augmentations", NeurIPS 2020) with any loss of
:mod:`adaptcl.plugins` (MACL, Huang et al., ICML 2023, among them) under ``pl.Trainer``, the
way :class:`adaptcl.adapters.lightning.base.SSLModule` trains the image methods:

- ``training_step`` is the step of :func:`~adaptcl.adapters.graphcl.train_epoch` (both hand
  it to :class:`~adaptcl.adapters.graphcl.steps.StepRecorder`): the loss of a
  two-view batch ``(b0, b1)`` from :class:`~adaptcl.adapters.graphcl.TwoViewDataset` (or,
  with ``step_loss``, any objective of a batch: supervised fine-tuning); at one
  device a batch of one graph is skipped (no negative). At one device, with the same seeds and
  data order, it trains to the weights and losses of ``train_epoch``. Under DDP every rank
  takes every step (Lightning cannot skip one on some ranks): a rank's batch of one graph
  meets the other ranks' graphs as negatives through the gathering loss;
- it logs ``train_loss`` and the loss's scalar ``last_stats`` (``train_temperature``,
  ``train_alignment``, ...), keeps them per step in ``history`` and the mean loss per graph of
  each epoch in ``epoch_losses`` (summed over ranks under DDP);
- under DDP (``world_size > 1``) it switches the loss's ``gather_distributed`` on, so every
  rank's anchors meet the projections of all ranks (gradient-carrying all-gather) and MACL's
  temperature comes from the alignment averaged over ranks;
- a non-finite loss raises :class:`~adaptcl.plugins.validation.NonFiniteError` before its
  optimiser step, with ``err.step`` the step of the run (from 1, counting the optimisation
  steps of ``history``, not the skipped batches Lightning's ``global_step`` counts) and its
  loss. As in ``train_epoch`` that check reads the loss on the host, so it is made at every
  step on the CPU only (``sync_each_step``); on an accelerator the loss, its finiteness and
  the statistics stay on the device and are read once at the end of the epoch;
- ``history`` and ``epoch_losses`` travel in the checkpoint; the loss's own state (buffers of an
  adaptive loss, a learned temperature, a schedule's step) is part of the model's
  ``state_dict``, so Lightning's checkpoints hold it; a learned temperature is among
  ``model.parameters()``, so the optimiser trains it;
- a scheduled temperature (``graphcl_loss("temperature_schedule")``) is set, before every
  step, to the number of optimisation steps taken so far (those of ``history``, so the count
  of ``train_epoch``, and restored on resume).

Precision (``"bf16-mixed"``, ``"16-mixed"`` with its gradient scaler) is the Trainer's.
Needs ``pytorch-lightning`` (``pip install 'adaptcl[graph]'``); ``import
adaptcl.adapters.graphcl`` does not import this module.

Example::

    import pytorch_lightning as pl
    from torch_geometric.loader import DataLoader
    from adaptcl.adapters.graphcl import GraphCL, TUGINEncoder, TwoViewDataset
    from adaptcl.adapters.graphcl.lightning import GraphCLModule

    module = GraphCLModule(GraphCL(TUGINEncoder(7), loss_fn="macl"), lr=0.01)
    trainer = pl.Trainer(max_epochs=20, accelerator="gpu", devices=4, strategy="ddp")
    trainer.fit(module, DataLoader(pairs, batch_size=128, shuffle=True))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, get_args

from adaptcl.adapters import require

require("torch_geometric", "graph")
pl = require("pytorch_lightning", "graph")

import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from adaptcl.adapters.lightning.resume import CheckpointedHistory  # noqa: E402
from adaptcl.plugins import set_schedule_step  # noqa: E402
from adaptcl.plugins.validation import (  # noqa: E402
    check_choice,
    check_non_negative,
    check_positive,
)

from .steps import StepRecorder, two_views  # noqa: E402

__all__ = ["OptimizerName", "GraphCLModule", "OPTIMIZERS"]

#: the optimisers :class:`GraphCLModule` builds (GraphCL and the recipes use Adam)
OptimizerName = Literal["adam", "adamw"]
#: the same choices as a tuple, checked at construction
OPTIMIZERS: tuple[OptimizerName, ...] = get_args(OptimizerName)


class GraphCLModule(CheckpointedHistory, pl.LightningModule):
    """GraphCL pre-training of ``model`` with Lightning.

    Args:
        model: the :class:`~adaptcl.adapters.graphcl.GraphCL` model (encoder, projection head
            and loss ``model.loss_fn``); ``module.model`` is it, trained in place.
        lr: learning rate (the recipes: 0.01 on TU, 1e-3 on molecules).
        optimizer: ``"adam"`` (as :func:`~adaptcl.adapters.graphcl.train_epoch`'s callers)
            or ``"adamw"``.
        weight_decay: weight decay of the optimiser.
        gather_distributed: gather the projections of every rank in the loss. ``None`` (the
            default): on exactly when the Trainer runs more than one process; ``True`` on a
            loss without a ``gather_distributed`` attribute is an error.
        where: names the run in a :class:`~adaptcl.plugins.validation.NonFiniteError`.
        sync_each_step: read the loss and its statistics on the host at every step, so a
            non-finite loss stops training before its optimiser step. Default: on the CPU,
            where reading is free; elsewhere they are read once at the end of the epoch
            (``history`` fills then), so no step waits for the host.
        step_loss: the loss of one batch instead of GraphCL's ``model(b0, b1)``, as
            :func:`~adaptcl.adapters.graphcl.train_epoch` takes it: ``step_loss(*views)``
            gets the loader's batch (a single ``Batch``, or the tuple's items) and returns the
            scalar loss (e.g. a masked BCE of ``model(batch)`` for fine-tuning a
            :class:`~adaptcl.adapters.graphcl.MolPropertyModel`). ``model`` then needs no
            ``loss_fn``; nothing is gathered across ranks.

    Batches are ``(b0, b1)`` pairs of torch_geometric ``Batch`` objects (graph ``k`` of each is
    a positive pair), as a ``DataLoader`` over a
    :class:`~adaptcl.adapters.graphcl.TwoViewDataset` yields them (any batch with
    ``step_loss``).
    """

    def __init__(self, model: nn.Module, *, lr: float = 1e-3, optimizer: OptimizerName = "adam",
                 weight_decay: float = 0.0, gather_distributed: bool | None = None,
                 where: str = "GraphCL pre-training",
                 sync_each_step: bool | None = None,
                 step_loss: Callable[..., Tensor] | None = None) -> None:
        super().__init__()
        if not isinstance(model, nn.Module) or (step_loss is None
                                                and not hasattr(model, "loss_fn")):
            raise TypeError("model must be a GraphCL model (an nn.Module with a loss_fn), got "
                            f"{type(model).__name__}; give step_loss= for another objective")
        if step_loss is not None and not callable(step_loss):
            raise TypeError(f"step_loss must be callable, got {type(step_loss).__name__}")
        if gather_distributed not in (None, True, False):
            raise TypeError(f"gather_distributed must be None, True or False, got "
                            f"{gather_distributed!r}")
        if gather_distributed and not hasattr(getattr(model, "loss_fn", None),
                                              "gather_distributed"):
            raise ValueError("gather_distributed=True needs a loss with a gather_distributed "
                             f"attribute (the adaptcl.plugins losses); "
                             f"{type(getattr(model, 'loss_fn', None)).__name__} has none")
        self.model = model
        self.lr = check_positive("lr", lr)
        self.optimizer_name = check_choice("optimizer", optimizer, OPTIMIZERS)
        self.weight_decay = check_non_negative("weight_decay", weight_decay)
        self.gather_distributed = gather_distributed
        self.where = str(where)
        self.sync_each_step = sync_each_step  # checked by the StepRecorder built below
        self.step_loss = step_loss
        #: one record per optimisation step: step, epoch, loss and the loss's scalar stats
        self.history: list[dict[str, float]] = []
        #: mean loss per graph of each finished epoch (as ``train_epoch`` returns it)
        self.epoch_losses: list[float] = []
        self._world = 1
        self._steps = self._recorder()

    def _recorder(self) -> StepRecorder:
        """The step bookkeeping of :func:`~adaptcl.adapters.graphcl.train_epoch`, numbering
        steps on from ``history`` (a resumed run's steps so far)."""
        return StepRecorder(self.where, sync_each_step=self.sync_each_step,
                            first_step=len(self.history) + 1)

    # --- set-up ------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        loss_fn = getattr(self.model, "loss_fn", None)
        world = int(self.trainer.world_size) if self._trainer is not None else 1
        gather = self.gather_distributed if self.gather_distributed is not None else world > 1
        self._world = world
        if hasattr(loss_fn, "gather_distributed"):
            loss_fn.gather_distributed = bool(gather) and self.step_loss is None
        elif world > 1 and self.step_loss is None:
            pl.utilities.rank_zero_warn(
                f"{type(loss_fn).__name__} has no gather_distributed: under {world} processes "
                "each rank's anchors meet only its own batch's negatives")

    # --- training -----------------------------------------------------------------------------
    def forward(self, data) -> Tensor:
        """Graph embeddings (the encoder's output, no projection head)."""
        return self.model.encoder(data)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        views = two_views(batch)
        if self.step_loss is None and len(views) != 2:
            raise ValueError("expected a batch (b0, b1) of two views, as a DataLoader over a "
                             f"TwoViewDataset yields; got {len(views)} item(s)")
        num_graphs = int(views[0].num_graphs)
        if not self._steps.takes_step(views, negatives_elsewhere=self._gathers()):
            if self._world > 1:  # Lightning cannot skip a step on some ranks only
                raise ValueError(
                    f"a batch of {num_graphs} graph(s) on one of {self._world} processes whose "
                    "loss does not gather across them has no negative; give the DataLoader "
                    "drop_last=True or a loss with gather_distributed")
            return None  # a single-graph batch has no negative (as train_epoch)
        # a scheduled temperature follows the optimisation steps taken so far (those of
        # ``history``, restored on resume; train_epoch counts the same steps)
        set_schedule_step(self.model, self._steps.step)
        loss = self._steps.loss(self.step_loss or self.model, views)
        record = self._steps.record(loss, num_graphs, self.model,
                                    step=float(self._steps.step), epoch=float(self.current_epoch))
        for key, value in record.items():
            if key in ("step", "epoch"):
                continue
            value = torch.as_tensor(value, dtype=torch.float32, device=loss.device).reshape(())
            self.log(f"train_{key}", value, prog_bar=key in ("loss", "temperature"),
                     batch_size=num_graphs)
        if self._steps.per_step(loss):
            self._steps.flush(into=self.history)
        return loss

    def _gathers(self) -> bool:
        """Whether the loss meets the other ranks' projections (then a rank's batch of one
        graph still has negatives, and its step is taken)."""
        loss_fn = getattr(self.model, "loss_fn", None)
        return self._world > 1 and bool(getattr(loss_fn, "gather_distributed", False))

    def on_train_epoch_start(self) -> None:
        self._steps = self._recorder()

    def on_train_epoch_end(self) -> None:
        self._steps.flush(into=self.history)
        total = (self._steps.total if self._steps.total is not None
                 else torch.zeros((), device=self.device))
        sums = torch.stack([total.double().to(self.device),
                            torch.tensor(float(self._steps.count), dtype=torch.float64,
                                         device=self.device)])
        if self._trainer is not None and self.trainer.world_size > 1:
            sums = self.trainer.strategy.reduce(sums, reduce_op="sum")
        self.epoch_losses.append(float(sums[0] / sums[1]) if float(sums[1]) > 0 else 0.0)

    # --- checkpoints ----------------------------------------------------------------------------
    checkpointed = ("history", "epoch_losses")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._steps.flush(into=self.history)  # the steps read on the host since the last flush
        super().on_save_checkpoint(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self._steps = self._recorder()

    # --- optimisation ---------------------------------------------------------------------------
    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.model.parameters() if p.requires_grad]
        optim = torch.optim.Adam if self.optimizer_name == "adam" else torch.optim.AdamW
        return optim(params, lr=self.lr, weight_decay=self.weight_decay)
