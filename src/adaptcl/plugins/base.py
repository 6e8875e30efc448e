"""Shared plumbing of the loss modules: the per-direction loop and the statistics they keep."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ._validation import check_choice, check_shared
from .candidates import FORMS, Candidates, build_candidates, rows_logits
from .distributed import GatherFn
from .kernel import contrastive_kernel, no_negatives_output
from .tiled import tiled_kernel

Stats = dict[str, Tensor]


def run_kernel(
    cands: list[Candidates],
    temperature: Tensor | float,
    *,
    positive_in_denominator: bool = True,
    log_weights: Callable[[Candidates, Tensor], Tensor] | None = None,
    tile_size: int | None = None,
) -> tuple[Tensor, Stats]:
    """Apply the kernel to every direction with one temperature; mean over all anchors.

    ``log_weights(cands, log_w)`` may return per-anchor log weights from the direction's
    candidates and its detached ``log W`` (they are detached anyway). ``tile_size`` streams
    the similarity matrix in tiles (:mod:`adaptcl.plugins.tiled`) instead of materialising it.
    """
    losses, plains, log_ws, p_pos = [], [], [], []
    for c in cands:
        weight_fn = None if log_weights is None else (lambda lw, c=c: log_weights(c, lw))
        if c.num_negatives == 0:
            out = no_negatives_output(c.positive_sim)
        elif tile_size is not None:
            out = tiled_kernel(c, temperature, tile_size,
                               positive_in_denominator=positive_in_denominator, log_weights=weight_fn)
        else:
            neg, pos = rows_logits(c, temperature)
            out = contrastive_kernel(neg, pos, positive_in_denominator=positive_in_denominator,
                                     log_weights=weight_fn, inplace=True)
        losses.append(out.loss)
        plains.append(out.plain)
        log_ws.append(out.log_w)
        p_pos.append(out.positive_probability)
    loss = torch.cat(losses).mean()
    stats = {
        "loss": loss.detach(),
        "plain_loss": torch.cat(plains).detach().mean(),
        "alignment": cands[0].positive_sim.detach().mean(),
        "temperature": torch.as_tensor(temperature).detach().float().mean(),
        "mean_w": torch.cat(log_ws).exp().mean(),
        "positive_probability": torch.cat(p_pos).mean(),
    }
    return loss, stats


def in_row_blocks(rows_fn: Callable[[int, int], Tensor], num_rows: int,
                  tile_size: int | None) -> Tensor:
    """``rows_fn(0, num_rows)``, computed ``tile_size`` rows at a time and concatenated on the
    last dimension (``rows_fn(r0, r1)`` returns ``[..., r1 - r0]``).

    For the losses without a streaming path (the survey losses, ASCL-BYOL): each block runs
    under activation checkpointing, so only one ``[tile_size, C]`` block of the similarity
    matrix is alive at a time, in forward and in the recomputing backward.
    """
    if tile_size is None or tile_size >= num_rows:
        return rows_fn(0, num_rows)
    return torch.cat([checkpoint(rows_fn, r0, min(r0 + tile_size, num_rows), use_reentrant=False)
                      for r0 in range(0, num_rows, tile_size)], dim=-1)


class ContrastiveLoss(nn.Module):
    """Base of the two-view loss modules: validation of the shared arguments and ``last_stats``.

    Every loss (InfoNCE, DCL, FlatNCE, Dual temperature, MACL, ASCL, ASCL-BYOL, AMCL, the
    survey losses) takes the same keywords, checked here by one function:
    ``gather_distributed`` (a bool), ``gather_fn`` (a gradient-carrying gather such as
    ``lightly.utils.dist.gather``, or None), ``check_finite`` (a bool) and ``tile_size``
    (None or an int >= 1). Inputs of mixed float32/float64 dtypes are computed in float64.
    Anchors with no negatives (a batch of one pair, an empty queue) contribute 0 with a zero
    gradient, as in Lightly and sentence-transformers.

    Subclasses implement :meth:`compute` returning ``(loss, stats)``; ``forward(z0, z1,
    negatives=None)`` is called like Lightly's losses.
    """

    def __init__(self, *, form: str, gather_distributed: bool = False,
                 gather_fn: GatherFn | None = None, check_finite: bool = True,
                 tile_size: int | None = None, forms: tuple[str, ...] = FORMS) -> None:
        super().__init__()
        # One validation path for the keywords every loss shares (a subclass restricts
        # ``forms`` to those it defines).
        self.form = check_choice("form", form, forms)
        (self.gather_distributed, self.gather_fn, self.check_finite,
         self.tile_size) = check_shared(gather_distributed=gather_distributed, gather_fn=gather_fn,
                                        check_finite=check_finite, tile_size=tile_size)
        self.last_stats: Stats = {}

    def candidates(self, z0: Tensor, z1: Tensor, negatives: Tensor | None) -> list[Candidates]:
        return build_candidates(z0, z1, self.form, negatives,
                                gather_distributed=self.gather_distributed,
                                gather_fn=self.gather_fn, check_finite=self.check_finite)

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None) -> tuple[Tensor, Stats]:
        raise NotImplementedError  # pragma: no cover - abstract

    def forward(self, z0: Tensor, z1: Tensor, negatives: Tensor | None = None) -> Tensor:
        """Loss of the positive pairs ``(z0[i], z1[i])``.

        Args:
            z0, z1: ``[N, D]`` embeddings of two views (normalised inside).
            negatives: optional ``[K, D]`` extra negatives, required for ``form="queue"``.
        """
        loss, stats = self.compute(z0, z1, negatives)
        self.last_stats = stats
        return loss

    def extra_repr(self) -> str:
        tiled = "" if self.tile_size is None else f", tile_size={self.tile_size}"
        return f"form={self.form!r}, gather_distributed={self.gather_distributed}{tiled}"
