"""Adaptive Soft Contrastive Learning (ASCL).

Reference:
    Feng & Patras, "Adaptive Soft Contrastive Learning", ICPR 2022 (arXiv:2207.11163).

ASCL changes the target distribution of InfoNCE. For the query ``q_i`` contrasted with its key
``k_i`` and the negatives ``{z_j}`` (a queue, or the other keys of the batch):

* ``d_ij = cos(k_i, z_j)``: how close each negative is to the query's own positive key;
* ``q_ij = softmax_j(d_ij / tau')``, sharpened with ``tau' < tau`` (Eq. 7);
* confidence ``c_i = 1 - H(q_i) / log(n)`` with ``n`` the number of negatives (Eq. 8);
* targets: the positive keeps label 1; negatives get ``1`` for the top-K neighbours (Hard, Eq. 6),
  ``c_i`` for them (AHCL, Eq. 9) or ``min(1, c_i K q_ij)`` for all (ASCL, Eq. 10); each row is
  then normalised (Eq. 11).

The whole label path (key, negatives, ``q``, ``c``) is detached. ``num_neighbors=0`` gives back
InfoNCE (MoCo) exactly. Negatives and soft targets come from the queue only in the queue form;
the in-batch form (``form="cross_view"``) uses the other keys of the batch and ``n = N - 1``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._validation import check_choice, check_int, check_positive
from .base import ContrastiveLoss, Stats, in_row_blocks
from .candidates import MASKED, Candidates, rows_logits
from .distributed import GatherFn
from .kernel import contrastive_kernel, no_negatives_output
from .tiled import tiled_ascl

MODES = ("ascl", "ahcl", "hard")


@torch.no_grad()
def soft_labels(key_sim: Tensor, valid: Tensor, *, mode: str = "ascl", num_neighbors: int = 1,
                sharpen_temperature: float = 0.05) -> tuple[Tensor, Tensor, Tensor]:
    """ASCL pseudo-labels from the key-to-negative cosine matrix.

    Args:
        key_sim: ``[A, C]`` cosine of each anchor's positive key with every candidate column.
        valid: ``[A, C]`` bool, True where the column is a negative of that row.
        mode: ``"ascl"``, ``"ahcl"`` or ``"hard"``.
        num_neighbors: K, the number of neighbours treated as extra positives.
        sharpen_temperature: tau' of Eq. 7.

    Returns:
        ``(y_pos [A], y_neg [A, C], confidence [A])`` with each row of targets summing to 1.
    """
    a = key_sim.shape[0]
    n = valid.sum(dim=1)
    if num_neighbors == 0:
        return (torch.ones(a, dtype=key_sim.dtype, device=key_sim.device),
                torch.zeros_like(key_sim), torch.zeros(a, dtype=key_sim.dtype, device=key_sim.device))
    if int(n.min()) < num_neighbors:
        raise ValueError(
            f"num_neighbors={num_neighbors} is larger than the {int(n.min())} negatives available"
        )
    d = key_sim.masked_fill(~valid, MASKED)
    log_q = torch.log_softmax(d / sharpen_temperature, dim=1)
    q = log_q.exp()
    entropy = -(q * log_q.masked_fill(~valid, 0.0)).sum(dim=1)
    # log(n) with n = 1 is 0: a single negative carries no uncertainty, c = 1.
    log_n = torch.log(n.to(key_sim.dtype)).clamp(min=torch.finfo(key_sim.dtype).tiny)
    confidence = (1 - entropy / log_n).clamp(0.0, 1.0)
    if mode == "ascl":
        y_neg = torch.minimum(torch.ones_like(q), confidence[:, None] * num_neighbors * q)
        y_neg = y_neg.masked_fill(~valid, 0.0)
    else:
        top = d.topk(num_neighbors, dim=1).indices
        fill = torch.ones_like(confidence) if mode == "hard" else confidence
        y_neg = torch.zeros_like(q).scatter_(1, top, fill[:, None].expand(-1, num_neighbors))
    total = 1 + y_neg.sum(dim=1)
    return 1 / total, y_neg / total[:, None], confidence


class ASCLLoss(ContrastiveLoss):
    """ASCL loss (Feng & Patras, ICPR 2022): InfoNCE with adaptive soft targets.

    Called as ``loss(q, k, negatives=queue)``: ``q`` the queries (strong views, online
    encoder), ``k`` their keys (weak views, momentum encoder), ``queue`` ``[K, D]`` negatives.
    With ``form="cross_view"`` the other keys of the batch serve as negatives (no queue).

    Args:
        temperature: tau of the contrastive softmax (paper: 0.1).
        sharpen_temperature: tau' of the neighbour distribution (paper: 0.05).
        num_neighbors: K (paper: 1); 0 gives InfoNCE / MoCo.
        mode: ``"ascl"`` (soft), ``"ahcl"`` (adaptive hard) or ``"hard"``.
        form: ``"queue"`` (default) or ``"cross_view"`` (in-batch).
        tile_size: stream the logits and the key-to-negative similarities in tiles (Inf-CL,
            Cheng et al. 2024; :mod:`adaptcl.plugins.tiled`), exact in every mode: a first
            gradient-free pass gathers the normaliser and entropy of the sharpened distribution
            (and merges the top-K across tiles for ``"hard"`` / ``"ahcl"``), the second streams
            ``lse`` and the soft-target sum ``sum_j y_ij l_ij``. ``None`` (default) materialises.

    ``last_stats["confidence"]`` holds the mean label confidence c.

    Examples:
        >>> loss_fn = ASCLLoss(temperature=0.1, sharpen_temperature=0.05, num_neighbors=1)
        >>> q, k, queue = torch.randn(8, 32), torch.randn(8, 32), torch.randn(64, 32)
        >>> loss = loss_fn(q, k, negatives=queue)
    """

    def __init__(self, temperature: float = 0.1, sharpen_temperature: float = 0.05,
                 num_neighbors: int = 1, mode: str = "ascl", *, form: str = "queue",
                 gather_distributed: bool = False, gather_fn: GatherFn | None = None,
                 check_finite: bool = True, tile_size: int | None = None) -> None:
        super().__init__(form=form, gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size,
                         forms=("queue", "cross_view"))
        self.temperature = check_positive("temperature", temperature)
        self.sharpen_temperature = check_positive("sharpen_temperature", sharpen_temperature)
        self.num_neighbors = check_int("num_neighbors", num_neighbors, minimum=0)
        self.mode = check_choice("mode", mode, MODES)

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None) -> tuple[Tensor, Stats]:
        (c,) = self.candidates(z0, z1, negatives)
        return self.compute_from_candidates(c)

    def compute_from_candidates(self, c: Candidates) -> tuple[Tensor, Stats]:
        if c.num_negatives == 0:
            # nothing to contrast against and no neighbour to label: 0, as InfoNCE
            confidence = torch.zeros_like(c.positive_sim).detach()
            return self._stats(c, no_negatives_output(c.positive_sim), confidence)
        if self.tile_size is not None:
            out, confidence = tiled_ascl(c, self.temperature, self.tile_size, mode=self.mode,
                                         num_neighbors=self.num_neighbors,
                                         sharpen_temperature=self.sharpen_temperature)
            return self._stats(c, out, confidence)
        with torch.no_grad(), torch.autocast(device_type=c.anchors.device.type, enabled=False):
            key_sim = c.positive_keys.detach() @ c.keys.detach().T
            valid = c.positive_mask()
            y_pos, y_neg, confidence = soft_labels(
                key_sim, valid, mode=self.mode, num_neighbors=self.num_neighbors,
                sharpen_temperature=self.sharpen_temperature)
        neg, pos = rows_logits(c, self.temperature)
        out = contrastive_kernel(neg, pos, soft_targets=(y_pos, y_neg))
        return self._stats(c, out, confidence)

    def _stats(self, c: Candidates, out, confidence: Tensor) -> tuple[Tensor, Stats]:
        loss = out.loss.mean()
        stats = {"loss": loss.detach(), "plain_loss": loss.detach(),
                 "alignment": c.positive_sim.detach().mean(),
                 "temperature": torch.tensor(self.temperature),
                 "confidence": confidence.mean(), "mean_w": out.log_w.exp().mean()}
        return loss, stats


class ASCLBYOLLoss(ContrastiveLoss):
    """ASCL without negatives (paper appendix A): BYOL's regression loss with soft targets.

    ``L_i = 2 - 2 * sum_j y_ij cos(t_i, p_j)`` where ``p`` are the online predictions and ``t``
    the target (momentum) projections; ``y`` comes from the in-batch neighbour distribution of
    ``t_i`` with ``c = 1 - H(q) / log(b - 1)`` and ``y_ij = min(1, c K q_ij)`` (the appendix's
    ``max`` is a typo: the bound keeps a neighbour below the sample's own view). A batch of one
    has no neighbour: its target is its own view, plain BYOL ``2 - 2 cos(t, p)``.

    The shared keywords work as in the contrastive losses: ``gather_distributed`` /
    ``gather_fn`` make every rank's samples neighbours (``j`` runs over the gathered batch),
    ``tile_size`` processes that many samples at a time under activation checkpointing.

    Examples:
        >>> loss_fn = ASCLBYOLLoss(sharpen_temperature=0.05, num_neighbors=1)
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32))
    """

    def __init__(self, sharpen_temperature: float = 0.05, num_neighbors: int = 1,
                 mode: str = "ascl", *, gather_distributed: bool = False,
                 gather_fn: GatherFn | None = None, check_finite: bool = True,
                 tile_size: int | None = None) -> None:
        super().__init__(form="cross_view", gather_distributed=gather_distributed,
                         gather_fn=gather_fn, check_finite=check_finite, tile_size=tile_size,
                         forms=("cross_view",))
        self.sharpen_temperature = check_positive("sharpen_temperature", sharpen_temperature)
        self.num_neighbors = check_int("num_neighbors", num_neighbors, minimum=0)
        self.mode = check_choice("mode", mode, MODES)

    def forward(self, predictions: Tensor, targets: Tensor, negatives: None = None) -> Tensor:
        """``predictions`` (online, with gradient) and ``targets`` (momentum), both ``[B, D]``."""
        return super().forward(predictions, targets, negatives)

    def compute(self, predictions: Tensor, targets: Tensor,
                negatives: Tensor | None) -> tuple[Tensor, Stats]:
        if negatives is not None:
            raise ValueError("ASCLBYOLLoss takes no negatives: BYOL regresses onto its targets")
        try:
            # anchors t_i against the (gathered) predictions p_j ...
            (c,) = self.candidates(targets.detach(), predictions, None)
        except ValueError as e:  # name the arguments as the caller knows them
            raise ValueError(str(e).replace("z0", "targets").replace("z1", "predictions")) from None
        # ... and against the (gathered) targets t_j, for the neighbour distribution
        (neighbours,) = self.candidates(targets.detach(), targets.detach(), None)
        k = self.num_neighbors if neighbours.num_negatives > 0 else 0

        def rows(r0: int, r1: int) -> Tensor:
            block, near = c.rows(r0, r1), neighbours.rows(r0, r1)
            with torch.no_grad(), torch.autocast(device_type=block.anchors.device.type, enabled=False):
                y_pos, y_neg, confidence = soft_labels(
                    near.similarity(), near.positive_mask(), mode=self.mode, num_neighbors=k,
                    sharpen_temperature=self.sharpen_temperature)
            agreement = y_pos * block.positive_sim + (y_neg * block.similarity()).sum(dim=1)
            return torch.stack([2 - 2 * agreement, confidence])

        out = in_row_blocks(rows, c.num_anchors, self.tile_size)
        loss = out[0].mean()
        return loss, {"loss": loss.detach(), "confidence": out[1].detach().mean(),
                      "alignment": c.positive_sim.detach().mean()}
