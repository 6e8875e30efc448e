"""What the graph recipes (``tu``, ``moleculenet``) share: the epochs, the embeddings, and the
checks and identity of a run on several devices (its training: :mod:`~adaptcl.recipes.graph_distributed`).

Each epoch is the adapter's :func:`adaptcl.adapters.graphcl.train_epoch` (one loop for GraphCL
pre-training and supervised fine-tuning: device, ``--precision`` autocast, fp16 gradient
scaler); this module adds what only a recipe needs around it: the progress bar, a
non-finite loss as :class:`~adaptcl.recipes.template.errors.DivergedError`, the step history and the
``--logger`` (every step's loss and the loss module's statistics: temperature, alignment, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from adaptcl.recipes.template.errors import DivergedError, check_embeddings
from adaptcl.recipes.template.loggers import metric_logger
from adaptcl.recipes.template.store import distributed_follower

#: on several devices each rank draws its augmentations from ``seed + stride * rank``
AUGMENTATION_RANK_STRIDE = 1_000_003

#: Lightning strategies of a multi-device pre-training ("auto" is "ddp" on several devices); a
#: spawned or forked rank would not give its history back to the command
STRATEGIES = ("auto", "ddp")


def check_devices(batch_size: int, devices: int, strategy: str, *,
                  batch_name: str = "batch_size") -> None:
    """Refuse a multi-device setting that cannot run: ``ValueError`` naming the field.

    Each of ``devices`` processes takes ``batch_size / devices`` graphs a step, so the batch
    must split evenly with at least 2 graphs per device; ``strategy`` must be one of
    :data:`STRATEGIES` (each rank runs the command again).
    """
    if devices > 1 and (batch_size % devices or batch_size // devices < 2):
        raise ValueError(f"{batch_name} ({batch_size}) must be a multiple of devices ({devices}) "
                         "with at least 2 graphs per device (each device takes its share of "
                         "the batch)")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(map(repr, STRATEGIES))} (each "
                         f"rank runs the command again), got {strategy!r}")


def devices_identity(devices: int, strategy: str) -> dict[str, Any]:
    """What a run on several devices adds to its identity: another training (Lightning,
    per-rank BatchNorm and data order, the code of :mod:`~adaptcl.recipes.graph_distributed`).
    One device adds nothing, so its stored runs and encoders stay those of the single-process
    loop."""
    if devices <= 1:
        return {}
    from adaptcl.recipes.template.provenance import code_version

    return {"distributed": {"devices": devices, "strategy": strategy,
                            "code": code_version("adaptcl.recipes.graph_distributed")["sources"]}}


def rank_logger(kind: str, log_dir: Path) -> AbstractContextManager[Any]:
    """The recipe's ``--logger`` (:func:`~adaptcl.recipes.template.loggers.metric_logger`),
    except on a non-zero rank of a distributed run: it trains the same steps, rank 0 alone
    writes the logs."""
    return nullcontext(None) if distributed_follower() else metric_logger(kind, log_dir)


def train_epochs(model: Any, loader: Any, optimizer: Any,
                 step_loss: Callable[..., Any] | None = None, *, epochs: range,
                 device: str = "cpu", precision: str = "32", progress: bool = False,
                 desc: str = "", stats: dict[str, list[float]] | None = None,
                 logger: Any = None, step: int = 0,
                 on_epoch_end: Callable[[int, float, int], None] | None = None,
                 ) -> tuple[list[float], int]:
    """The adapter's ``train_epoch`` for every epoch of ``epochs`` under one progress bar.

    Returns (mean loss per graph of each epoch, optimisation steps taken). ``step_loss``
    (default: GraphCL's ``model(b0, b1)``) goes to ``train_epoch``; one gradient scaler serves
    every epoch of a ``16-mixed`` run. Each step's loss and statistics are appended to
    ``stats`` and logged to ``logger`` at step numbers counted on from ``step`` (a resumed
    run's steps so far); ``on_epoch_end(epoch, loss, steps so far)`` runs after each epoch
    (checkpoints, evaluation).
    """
    import torch

    from adaptcl.adapters.graphcl import train_epoch
    from adaptcl.plugins.validation import NonFiniteError
    from adaptcl.recipes.template.progress import progress as progress_bar

    scaler = torch.amp.GradScaler(torch.device(device).type) if precision == "16-mixed" else None
    losses, steps = [], step
    bar = progress_bar(epochs, enabled=progress, desc=desc)
    for epoch in bar:
        points: dict[str, list[float]] = {}
        try:
            loss = train_epoch(model, loader, optimizer, points, where=desc or "training",
                               device=device, precision=precision, scaler=scaler,
                               step_loss=step_loss)
        except NonFiniteError as err:
            at = steps + (err.step or 0)
            raise DivergedError(f"{err} (epoch {epoch}, step {at} of the run); nothing was "
                                "stored", step=at, loss=err.loss) from None
        taken = len(points.get("loss", []))
        for key, values in points.items():
            if stats is not None:
                stats.setdefault(key, []).extend(values)
        if logger is not None:
            for i in range(taken):
                logger.log({f"train/{k}": v[i] for k, v in points.items()}, steps + i + 1)
        losses.append(loss)
        steps += taken
        bar.set_postfix(loss=f"{loss:.3f}")
        if on_epoch_end is not None:
            on_epoch_end(epoch, loss, steps)
    return losses, steps - step


def embed_graphs(encode: Callable[[Any], Any], graphs: Any, *, device: str = "cpu",
                 batch_size: int = 256, where: str = "embeddings", labels: bool = True,
                 allow_constant: bool = False):
    """``encode(batch)`` of every graph (no gradient), checked finite and non-constant.

    Returns ``(embeddings [n, d], labels [n, ...])`` as numpy arrays (labels ``None`` when
    ``labels=False``). ``allow_constant`` accepts identical rows (a classifier's scores may be).
    """
    import torch
    from torch_geometric.loader import DataLoader

    outs, ys = [], []
    with torch.no_grad():
        for batch in DataLoader(graphs, batch_size=batch_size, shuffle=False):
            outs.append(encode(batch.to(device)).float().cpu())
            if labels:
                ys.append(batch.y.cpu())
    x = torch.cat(outs).numpy()
    check_embeddings(x, where, allow_constant=allow_constant)
    return x, (torch.cat(ys).numpy() if labels else None)


def paper_columns(table: dict[str, dict[str, tuple[float, float]]],
                  labels: dict[str, str]) -> Callable[[str], dict[str, str]]:
    """The table's extra columns: dataset -> the paper's ``mean ± std`` of each method.

    ``labels`` maps a method of ``table`` to its column; a dataset the paper did not report
    gets ``-``.
    """
    def columns(dataset: str) -> dict[str, str]:
        paper = table.get(dataset)
        return {column: "{:.2f} ± {:.2f}".format(*paper[method]) if paper else "-"
                for method, column in labels.items()}

    return columns


def draw_pretraining_curves(axes: Any, curves: dict[str, dict[str, list[float]]], *,
                            empty: str = "") -> None:
    """Alignment (``axes[0]``) and temperature (``axes[1]``) per pre-training step.

    ``curves`` maps a legend label to a run's step statistics; a panel left empty says
    ``empty`` (or the runner's generic reason).
    """
    from adaptcl.recipes.template.plots import explain_empty

    keys = ("alignment", "temperature")
    for label, stats in curves.items():
        for ax, key in zip(axes, keys, strict=True):
            if (stats or {}).get(key):
                ax.plot(stats[key], lw=1, label=label)
    for ax, name in zip(axes, ("alignment A (mean positive cosine)", "temperature"), strict=True):
        ax.set(xlabel="pre-training step", ylabel=name)
        if empty:
            explain_empty(ax, empty)
