"""The GraphCL model with any contrastive loss of :mod:`adaptcl.plugins`.

GraphCL (You et al., "Graph Contrastive Learning with Augmentations", NeurIPS 2020): a GNN
encoder, a 2-layer MLP projection head (``Linear(D, D)-ReLU-Linear(D, D)``) used only during
pre-training, and a contrastive loss between the projections of two views of each graph.
GraphCL's own loss is DCL in the one-direction cross-view form (N-1 negatives from the other
view, positive dropped from the denominator, tau 0.2). MACL (Huang et al., "Model-Aware
Contrastive Learning: Towards Escaping the Dilemmas", ICML 2023) replaces the fixed
temperature with ``tau0 * (1 + alpha * (A - A0))`` (tau0 0.2 on TU, 0.1 on molecules,
alpha 0.5, A0 0).

Example::

    from adaptcl.adapters.graphcl import GraphCL, TUGINEncoder, graphcl_loss
    model = GraphCL(TUGINEncoder(in_channels=7), loss_fn=graphcl_loss("macl"))
    loss = model(batch_view0, batch_view1)      # two torch_geometric Batch objects
    loss.backward()
    emb = model.embed(batch)                    # encoder output, no projection head
    model.loss_fn.last_stats                    # e.g. alignment, temperature
"""

from __future__ import annotations

from collections.abc import Callable

from adaptcl.adapters import require

require("torch_geometric", "graph")

import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from adaptcl.plugins import advance_schedules  # noqa: E402
from adaptcl.precision import Precision, autocast, check_precision  # noqa: E402
from adaptcl.registry import canonical_loss_name, loss_help  # noqa: E402

from ._graph import _data_device  # noqa: E402
from .names import LOSS_ALIASES, LOSS_NAMES  # noqa: E402
from .steps import StepRecorder, scalar_stats, two_views  # noqa: E402

__all__ = ["GraphCL", "MolPropertyModel", "graphcl_loss", "LOSS_NAMES", "LOSS_ALIASES",
           "projection_head", "train_epoch"]


# default tau of each loss in GraphCL's TU setting (MACL's tau0 0.2 on TU, 0.1 on molecules)
DEFAULT_TEMPERATURE = 0.2


def graphcl_loss(name: str | nn.Module = "graphcl", temperature: float = DEFAULT_TEMPERATURE,
                 **kwargs) -> nn.Module:
    """Build a loss for :class:`GraphCL` by name, or return a given ``nn.Module`` unchanged.

    * ``"dcl"`` (GraphCL's own loss, also by its name ``"graphcl"``):
      ``DCLLoss(form="cross_view")``.
    * ``"infonce"``: ``InfoNCELoss(form="cross_view")`` (positive in the denominator).
    * ``"macl"``: ``MACLLoss(alpha=0.5, a0=0.0, reweight=False, form="cross_view",
      positive_in_denominator=False)``: GraphCL + MACL as in Huang et al. 2023, App. B.5.
    * ``"dystress"``: ``DySTreSSLoss(min_temperature=temperature,
      max_temperature=2 * temperature, form="cross_view", positive_in_denominator=False)``:
      GraphCL's DCL cross-view loss with DySTreSS's per-pair temperatures (Manna et al., IEEE
      TAI 2025), as ``"macl"`` is GraphCL's loss with MACL's. The DySTreSS authors ran no
      graphs; as in their SimCLR setting (0.1 and 0.2) the fixed tau is tau_min and tau_max is
      twice it, the rule of the Lightning factory too. The temperature is detached, as in
      their NT-Xent code (their DCL code is not: ``detach_temperature=False``; the value is the
      corrected DCL, not their ``TSDCLLoss``, see :mod:`adaptcl.plugins.dystress`).
    * ``"temperature_schedule"``: GraphCL's loss (DCL, cross-view) at Kukleva et al.'s cosine
      schedule from ``temperature`` (tau_min) up to their tau_max 1.0, period 400 steps
      (``max_temperature=``, ``period=`` override them): ``TemperatureScheduleLoss(temperature,
      1.0, 400, form="cross_view", positive_in_denominator=False)``. :func:`train_epoch` and
      :class:`~adaptcl.adapters.graphcl.lightning.GraphCLModule` drive its step.
    * ``"learnable_temperature"``: GraphCL's loss at a learned temperature exp(-s) starting at
      ``temperature`` (CLIP's, clamped as open_clip does): ``LearnableTemperatureLoss(
      temperature, form="cross_view", positive_in_denominator=False)``; ``s`` is a parameter of
      the model (``model.parameters()``), so of its optimiser and ``state_dict``.

    ``kwargs`` go to the loss constructor (e.g. ``alpha=``, ``a0=`` for MACL, or ``tile_size=``
    to stream the similarity matrix in tiles for very large batches; its default ``"auto"``
    does so only beyond the memory budget). Names are resolved by
    :func:`~adaptcl.registry.canonical_loss_name` (case-insensitive; an older spelling
    such as ``"nt_xent"`` builds InfoNCE with a ``FutureWarning``).
    """
    if isinstance(name, nn.Module):
        if kwargs:
            raise TypeError("keyword arguments are only used when the loss is given by name")
        return name
    from adaptcl.plugins import (
        DCLLoss,
        DySTreSSLoss,
        InfoNCELoss,
        LearnableTemperatureLoss,
        MACLLoss,
        TemperatureScheduleLoss,
    )

    if not isinstance(name, str):
        raise TypeError(f"loss_fn must be a loss name ({loss_help(LOSS_NAMES, LOSS_ALIASES)}) "
                        f"or an nn.Module, got {type(name).__name__} {name!r}")
    key = canonical_loss_name(name, allowed=LOSS_NAMES, aliases=LOSS_ALIASES)
    if key == "dcl":
        return DCLLoss(temperature=temperature, form="cross_view", **kwargs)
    if key == "infonce":
        return InfoNCELoss(temperature=temperature, form="cross_view", **kwargs)
    if key == "macl":
        params = {"alpha": 0.5, "a0": 0.0, "reweight": False, "form": "cross_view",
                  "positive_in_denominator": False}
        params.update(kwargs)
        return MACLLoss(temperature=temperature, **params)
    if key == "dystress":
        params = {"max_temperature": 2 * temperature, "form": "cross_view",
                  "positive_in_denominator": False}
        params.update(kwargs)
        return DySTreSSLoss(min_temperature=temperature, **params)
    graphcl_form = {"form": "cross_view", "positive_in_denominator": False, **kwargs}
    if key == "temperature_schedule":
        graphcl_form = {"max_temperature": 1.0, "period": 400, **graphcl_form}
        return TemperatureScheduleLoss(min_temperature=temperature, **graphcl_form)
    if key == "learnable_temperature":
        return LearnableTemperatureLoss(temperature, **graphcl_form)
    raise AssertionError(key)  # pragma: no cover - LOSS_NAMES are all built above


def projection_head(dim: int, out_dim: int | None = None) -> nn.Sequential:
    """GraphCL's projection head: ``Linear(dim, dim)-ReLU-Linear(dim, out_dim or dim)``."""
    return nn.Sequential(nn.Linear(dim, dim), nn.ReLU(inplace=True),
                         nn.Linear(dim, out_dim or dim))


class GraphCL(nn.Module):
    """Encoder + projection head + contrastive loss ``loss_fn(z0, z1)``.

    Args:
        encoder: a module mapping a ``Batch`` to ``[num_graphs, encoder.out_dim]`` (e.g.
            :class:`~adaptcl.adapters.graphcl.TUGINEncoder`).
        loss_fn: a loss name for :func:`graphcl_loss` or any module called as
            ``loss_fn(z0, z1) -> scalar``; default GraphCL's DCL loss at tau 0.2.
        proj_dim: output size of the projection head (default: the encoder's ``out_dim``).
        xavier_init: re-initialise every ``nn.Linear`` (encoder and head) with Xavier-uniform
            weights and zero bias, as GraphCL's TU code does.
    """

    def __init__(self, encoder: nn.Module, loss_fn: str | nn.Module | None = None,
                 proj_dim: int | None = None, xavier_init: bool = True) -> None:
        super().__init__()
        dim = getattr(encoder, "out_dim", None)
        if dim is None:
            raise ValueError("encoder must expose out_dim (the graph embedding size)")
        self.encoder = encoder
        self.proj_head = projection_head(int(dim), proj_dim)
        self.loss_fn = graphcl_loss(loss_fn if loss_fn is not None else "graphcl")
        if xavier_init:
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    nn.init.xavier_uniform_(module.weight)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)

    def project(self, data) -> Tensor:
        """Projection-head output of a batch of graphs (what the loss sees)."""
        return self.proj_head(self.encoder(data))

    @torch.no_grad()
    def embed(self, data) -> Tensor:
        """Graph embeddings for downstream use: the encoder output, without the head."""
        return self.encoder(data)

    def forward(self, view0, view1) -> Tensor:
        """Contrastive loss between two batches of views (graph ``k`` of each is a pair)."""
        if view0.num_graphs != view1.num_graphs:
            raise ValueError(f"views hold {view0.num_graphs} and {view1.num_graphs} graphs")
        return self.loss_fn(self.project(view0), self.project(view1))

    @property
    def last_stats(self) -> dict[str, float]:
        """What the loss last computed (alignment, temperature, ...) as Python floats.

        Scalars only (one-element tensors and numbers); reading them syncs with the device.
        """
        return {key: float(value) for key, value in scalar_stats(self).items()}


class MolPropertyModel(nn.Module):
    """A graph encoder and a linear head: one logit per property (task) of each graph.

    The fine-tuning model of Hu et al. 2020 ("Strategies for Pre-training Graph Neural
    Networks", ICLR 2020) and GraphCL's transfer setting: the (pre-trained) encoder, e.g.
    :class:`~adaptcl.adapters.graphcl.MolGINEncoder` with mean pooling, then
    ``Linear(encoder.out_dim, num_tasks)``. Train it with a multi-task binary cross-entropy on
    the logits (labels of missing tasks masked out). Its state dict holds ``encoder.*`` and
    ``head.*``, so ``model.encoder.load_state_dict(GraphCL(...).encoder.state_dict())``
    starts fine-tuning from a GraphCL pre-training.

    Example::

        model = MolPropertyModel(MolGINEncoder(num_layers=5, emb_dim=300, drop_ratio=0.5),
                                 num_tasks=12)
        logits = model(batch)               # [batch.num_graphs, 12]
    """

    def __init__(self, encoder: nn.Module, num_tasks: int) -> None:
        super().__init__()
        dim = getattr(encoder, "out_dim", None)
        if dim is None:
            raise ValueError("encoder must expose out_dim (the graph embedding size)")
        if isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or num_tasks < 1:
            raise ValueError(f"num_tasks must be an integer >= 1, got {num_tasks!r}")
        self.encoder = encoder
        self.head = nn.Linear(int(dim), num_tasks)

    def forward(self, data) -> Tensor:
        """Logits ``[num_graphs, num_tasks]`` of a batch of graphs."""
        return self.head(self.encoder(data))


def train_epoch(model: nn.Module, loader, optimizer: torch.optim.Optimizer,
                stats: dict[str, list] | None = None, *, where: str = "",
                device: torch.device | str | None = None, precision: Precision = "32",
                scaler: torch.amp.GradScaler | None = None,
                sync_each_step: bool | None = None,
                step_loss: Callable[..., Tensor] | None = None) -> float:
    """One training epoch over a graph loader; returns the mean loss per graph.

    By default a GraphCL pre-training epoch: the loader yields two-view pairs ``(b0, b1)``
    and the loss is ``model(b0, b1)``. With ``step_loss`` any objective trains the same way
    (e.g. supervised fine-tuning): ``step_loss(*views)`` gets the loader's batch (a single
    ``Batch``, or the tuple's items), already on ``device``, and returns the scalar loss.

    The step is :class:`~adaptcl.adapters.graphcl.steps.StepRecorder`'s, shared with
    :class:`~adaptcl.adapters.graphcl.lightning.GraphCLModule` (this loop adds autocast, the
    backward pass and the optimiser). Batches of a single graph are skipped (no negative;
    BatchNorm needs two samples). Each step appends its loss (key ``"loss"``, the value the
    step returned) and the loss module's other scalar ``last_stats``
    (``model.loss_fn.last_stats``, when there is one) to ``stats`` (key -> list, one value
    per step), so ``len(stats["loss"])`` counts the optimisation steps. A scheduled temperature
    inside ``model`` (``graphcl_loss("temperature_schedule")``) is advanced after each optimiser
    step, so its step counts the steps of every epoch so far and travels in
    ``model.state_dict()``: a loop resumed from a saved state dict continues the schedule.
    A non-finite loss, or
    embeddings the loss refuses as non-finite, raise
    :class:`~adaptcl.plugins.validation.NonFiniteError` naming ``where``, with the step of this
    epoch (from 1) and its loss (``err.step``, ``err.loss``; on an accelerator without
    ``sync_each_step`` the epoch's last step, read at its end).

    Args:
        device: move each batch there (``non_blocking``) before its step; ``None`` leaves the
            batches where the loader puts them. The model's device is the caller's choice.
        precision: ``"32"``, ``"bf16-mixed"`` or ``"16-mixed"`` (Lightning's spellings):
            the forward pass runs under ``torch.autocast`` in that dtype on the batch's
            device; the loss core computes its logits in float32 either way.
        scaler: the ``torch.amp.GradScaler`` of a ``"16-mixed"`` run (keep one across epochs
            so its scale carries over); with ``"16-mixed"`` and none given, one is made for
            this epoch.
        sync_each_step: read the loss on the host at every step, so a non-finite loss stops
            training before its optimiser step. Default: on CPU, where reading is free;
            elsewhere the loss, its finiteness and the stats stay on the device and are read
            once at the end of the epoch, so no step waits for the host.
        step_loss: the loss of one batch (default: ``model(b0, b1)``, GraphCL's objective).

    """
    check_precision(precision)
    steps = StepRecorder(where or ("GraphCL pre-training" if step_loss is None else "training"),
                         sync_each_step=sync_each_step)
    compute_loss = step_loss if step_loss is not None else model
    model.train()
    for batch in loader:
        views = two_views(batch)
        if not steps.takes_step(views):
            continue
        if device is not None:
            views = tuple(view.to(device, non_blocking=True) for view in views)
        on = _data_device(views[0])
        if precision == "16-mixed" and scaler is None:
            scaler = torch.amp.GradScaler(on.type)
        optimizer.zero_grad()
        with autocast(on, precision):
            loss = steps.loss(compute_loss, views)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        advance_schedules(model)  # a scheduled temperature moves on with the optimiser
        steps.record(loss, views[0].num_graphs, model)
    for row in steps.flush():
        if stats is not None:
            for key, value in row.items():
                stats.setdefault(key, []).append(value)
    return steps.mean_loss()
