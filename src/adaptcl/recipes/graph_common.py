"""What the graph recipes (``tu``, ``moleculenet``) share: the training epoch and embeddings.

One plain-torch loop serves GraphCL pre-training and supervised fine-tuning: batches are moved
to the chosen device, the forward pass runs under :func:`adaptcl.recipes.runner.autocast`
(``--precision``), fp16 uses a gradient scaler, a non-finite loss stops the run
(:class:`~adaptcl.recipes.runner.NonResultError`), and every step's loss and the loss module's
statistics (temperature, alignment, mean W, ...) go to the step history and the ``--logger``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from adaptcl.recipes.runner import NonResultError, autocast, check_embeddings, grad_scaler


def train_epoch(model: Any, loader: Any, optimizer: Any, step_loss: Callable[[Any], Any], *,
                device: str = "cpu", precision: str = "32", scaler: Any = None,
                stats: dict[str, list[float]] | None = None, logger: Any = None,
                step: int = 0, where: str = "", min_graphs: int = 2) -> tuple[float, int]:
    """One epoch; returns (mean loss per graph, optimisation steps taken).

    ``step_loss(batch)`` computes the loss of one batch (already on ``device``; a tuple for
    two-view loaders). Batches with fewer than ``min_graphs`` graphs are skipped (a contrastive
    batch needs a negative; BatchNorm needs two samples). ``step`` numbers the logged points.
    """
    scaler = scaler if scaler is not None else grad_scaler(device, precision)
    model.train()
    total, count, steps = 0.0, 0, 0
    for batch in loader:
        first = batch[0] if isinstance(batch, (tuple, list)) else batch
        if first.num_graphs < min_graphs:
            continue
        batch = (tuple(b.to(device, non_blocking=True) for b in batch)
                 if isinstance(batch, (tuple, list)) else batch.to(device, non_blocking=True))
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            loss = step_loss(batch)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        value = float(loss.detach())  # one synchronisation per step: the loss curve and its check
        if not math.isfinite(value):
            raise NonResultError(f"non-finite loss at {where or 'training'}, step {step + steps}")
        total += value * first.num_graphs
        count += first.num_graphs
        steps += 1
        point = {"loss": value, **(getattr(model, "last_stats", None) or {})}
        if stats is not None:
            for key, val in point.items():
                stats.setdefault(key, []).append(val)
        if logger is not None:
            logger.log({f"train/{k}": v for k, v in point.items()}, step + steps)
    return total / max(count, 1), steps


def train_epochs(model: Any, loader: Any, optimizer: Any, step_loss: Callable[[Any], Any], *,
                 epochs: range, progress: bool = False, desc: str = "",
                 on_epoch_end: Callable[[int, float, int], None] | None = None,
                 step: int = 0, **kwargs: Any) -> tuple[list[float], int]:
    """:func:`train_epoch` for every epoch of ``epochs`` under one progress bar.

    Returns (loss per epoch, optimisation steps); ``on_epoch_end(epoch, loss, steps so far)``
    runs after each epoch (checkpoints, evaluation). ``kwargs`` go to :func:`train_epoch`.
    """
    from adaptcl.recipes.runner import progress as progress_bar

    losses, steps = [], step
    kwargs.setdefault("where", desc)
    bar = progress_bar(epochs, enabled=progress, desc=desc)
    for epoch in bar:
        loss, taken = train_epoch(model, loader, optimizer, step_loss, step=steps, **kwargs)
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
