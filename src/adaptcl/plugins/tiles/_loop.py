"""The streaming engine: exact row statistics of ``a @ k.T`` without the full matrix.

Reference:
    Cheng et al., "Breaking the Memory Barrier: Near Infinite Batch Size Scaling for Contrastive
    Loss" (Inf-CL), 2024, arXiv:2410.17243.

Every loss of :mod:`adaptcl.plugins` needs, per anchor ``i``, only a few row statistics of the
``[A, C]`` logit matrix ``l_ij = <f_i / tau_i, k_j>``:

* ``lse_neg_i = logsumexp_j l_ij`` over the negatives (InfoNCE, DCL, FlatNCE, MACL's ``W`` and
  ``V = exp(lse_all - lse_neg)``, Dual temperature);
* for ASCL's soft targets, ``sum_j u_ij l_ij`` and ``sum_j u_ij`` where ``u_ij`` is the
  un-normalised target of column ``j``, itself a function of the key-key cosine tile and of
  per-row statistics of the sharpened distribution (normaliser, entropy) gathered in a first,
  gradient-free pass;
* for AMCL, the log-sum-exp of ``s_ij / tau_ij - beta Omega(tau_ij)`` with learned pair
  temperatures, or the top-kappa columns of a row.

All of them stream: the forward pass walks over ``tile_size x tile_size`` tiles of anchors x
candidates keeping an online log-sum-exp (running max and rescaled sum) per anchor, and the
backward pass recomputes each tile and accumulates the gradients with respect to anchors and
keys from the softmax weights ``exp(l_ij - lse_i) * g_i`` (plus ``u_ij * g'_i`` for soft
targets). Masked columns (an anchor's positive and itself) are set to ``-inf`` inside the tile
and get exactly zero weight. Memory is linear in the batch: the inputs, their gradients and
one tile (plus a few tile-sized temporaries); nothing ``[A, C]`` is ever allocated. The
positive logit is computed row-wise by ordinary autograd, and the temperature (a scalar, or
one per anchor; MACL's is detached) is folded into the anchors before they enter the tiles, so
its gradient, if any, flows through ordinary autograd too.

Top-K selections (ASCL ``mode="hard"`` / ``"ahcl"``, AMCL ``negative_term="topk"``) are merged
across tiles by :func:`top_columns`, the one selection both paths use: among columns tied exactly
at the K-th value the lowest column index wins, so the tiled and the materialised path pick the
same columns and route the gradient identically. The selected columns are then gathered
(``[A, K, D]``) and differentiated by ordinary autograd.

This module knows no method. A method plugs into it through four small interfaces:

* :class:`TileWeights` (``tile(rows, keys, masks, c0, c1) -> [rows, cols]``): detached weights
  ``u_ij`` of a streamed weighted sum ``sum_j u_ij l_ij`` (ASCL's soft targets, the
  multi-positive targets of labels);
* :class:`TileBias` (the same ``tile``): detached terms added to the logits inside the
  log-sum-exp only (sentence-transformers' hardness term);
* :class:`TileTerm` (``logits(s)`` and ``slope(s)``): an elementwise map from ``s = a @ k.T`` to
  the logits, differentiated in the recomputing backward (DySTreSS's ``s / tau(s)``);
* :class:`PairTerm` (``term(s, r)`` and ``grads(s, r, w)``): an elementwise function of two
  bilinear forms ``s = a @ k.T`` and ``r = pa @ pk.T`` whose row log-sum-exp is streamed
  (AMCL's ``s / tau(r) - beta Omega(tau(r))`` with learned pair temperatures).

Nothing here synchronises with the device: masks are built by comparison with a column range,
never with ``nonzero()``.

When to tile: measured with ``benchmarks/bench_tiled.py`` (MACL, NT-Xent form, dim 128,
tile 2048, 2 shared CPU cores), tiled / materialised time is 1.11x at batch 1024, 1.01x at
4096 and 1.17x at 8192: materialising is never slower where it fits, tiling costs 1-17% (it
recomputes each tile in backward), while the materialised peak grows as ~3 copies of
``4 * (2N)^2`` bytes (3.0 GiB at N = 8192 against 72 MiB tiled). So the default
``tile_size="auto"`` takes the materialised path where the matrix fits the budget and this loop
beyond it, unless a faster backend pays (the fused kernels on CUDA, from
``KERNEL_FROM_LOGITS`` logits on tensor cores: :mod:`~adaptcl.plugins.tiles._dispatch`); an
explicit tile, e.g. ``MACLLoss(...,
tile_size=4096)`` at batch 65,536 (535 MiB peak where one materialised matrix alone is
64 GiB), tiles whatever the budget.

Example:
    >>> import torch
    >>> from adaptcl.plugins import MACLLoss
    >>> loss_fn = MACLLoss(temperature=0.1, alpha=0.5, tile_size=1024)
    >>> z0 = torch.randn(4096, 128, requires_grad=True)
    >>> z1 = torch.randn(4096, 128, requires_grad=True)
    >>> loss_fn(z0, z1).backward()   # never allocates an 8192 x 8192 matrix
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._products import ProductPrecision, product, product_precision
from ..candidates import autocast_off
from ..execution import TilePlan
from ._backend import Problem

NEG_INF = float("-inf")
Masks = tuple[Tensor | None, ...]


def blocks(n: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def mask_tile(tile: Tensor, indices: Masks, c0: int, c1: int, fill: float = NEG_INF) -> Tensor:
    """Set, in place, entry ``(r, idx[r] - c0)`` of a ``[rows, c1 - c0]`` tile to ``fill``
    for every row whose excluded column ``idx[r]`` falls inside ``[c0, c1)``.

    One gather and one scatter of ``rows`` entries per index vector (rows whose column lies
    outside the tile write back what they read): no ``nonzero()``, so no host synchronisation
    per tile, and no pass over the whole tile.
    """
    rows = None
    for idx in indices:
        if idx is None:
            continue
        if rows is None:
            rows = torch.arange(tile.shape[0], device=tile.device)
        local = idx - c0
        inside = (local >= 0) & (local < c1 - c0)
        col = local.clamp(0, c1 - c0 - 1)
        tile[rows, col] = torch.where(inside, fill, tile[rows, col])
    return tile


def row_slice(indices: Masks, r0: int, r1: int) -> Masks:
    return tuple(None if idx is None else idx[r0:r1] for idx in indices)


class OnlineLSE:
    """Running ``logsumexp`` of rows fed tile by tile (``-inf`` entries contribute nothing)."""

    def __init__(self, rows: int, like: Tensor) -> None:
        self.m = torch.full((rows,), NEG_INF, dtype=like.dtype, device=like.device)
        self.s = torch.zeros(rows, dtype=like.dtype, device=like.device)

    def update(self, tile: Tensor) -> Tensor:
        """Consume ``tile`` (overwritten: it becomes ``exp(tile - running max)``, returned)."""
        new = torch.maximum(self.m, tile.amax(dim=1))
        shift = torch.where(torch.isinf(new), torch.zeros_like(new), new)
        e = tile.sub_(shift[:, None]).exp_()
        self.s = self.s * torch.exp(self.m - shift) + e.sum(dim=1)
        self.m = new
        return e

    def result(self) -> Tensor:
        shift = torch.where(torch.isinf(self.m), torch.zeros_like(self.m), self.m)
        return shift + torch.log(self.s)


def top_columns(values: Tensor, columns: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` largest entries of each row of ``values`` and their ``columns``.

    ``columns`` holds each entry's column index, ascending along every row. Among entries tied
    exactly, the lowest columns are taken, so the selection does not depend on how a row was
    split into tiles (``torch.topk`` promises no order among ties; ``torch.argmax`` documents
    that it returns the first maximal index). The result is ordered by column.
    """
    if k <= _ARGMAX_ROUNDS:
        # k passes of argmax, each masking its pick with -inf: the cheapest exact choice for
        # small k. Masked (-inf) entries are lifted to the most negative float first, so a
        # pick is never chosen twice while an unpicked entry is left.
        work = values if k == 1 else values.nan_to_num(neginf=torch.finfo(values.dtype).min)
        picks = []
        for j in range(k):
            pick = work.argmax(dim=1, keepdim=True)
            picks.append(pick)
            if j + 1 < k:
                work.scatter_(1, pick, NEG_INF)
        picked = torch.cat(picks, dim=1).sort(dim=1).values
    else:
        kth = values.topk(k, dim=1).values[:, -1:]
        greater = values > kth
        tied = values == kth
        need = k - greater.sum(dim=1, keepdim=True)
        take = greater | (tied & (tied.cumsum(dim=1) <= need))
        # exactly k entries per row are taken; rank them before the others, in column order
        width = values.shape[1]
        rank = take * width + (width - 1 - torch.arange(width, device=values.device))
        picked = rank.topk(k, dim=1).indices.sort(dim=1).values
    return values.gather(1, picked), columns.gather(1, picked)


# Up to this k the top columns are found by k argmax passes, beyond it by a threshold.
_ARGMAX_ROUNDS = 8


def merge_top(best: tuple[Tensor, Tensor] | None, tile: Tensor, c0: int,
              k: int) -> tuple[Tensor, Tensor]:
    """Merge the top-``k`` of a ``[rows, w]`` tile (columns offset by ``c0``) into the running
    ``(values, columns)``, with :func:`top_columns`' tie-breaking."""
    cols = torch.arange(c0, c0 + tile.shape[1], device=tile.device).expand(tile.shape[0], -1)
    v, i = top_columns(tile, cols, min(k, tile.shape[1]))
    if best is None:
        return v, i
    v, i = torch.cat([best[0], v], dim=1), torch.cat([best[1], i], dim=1)
    order = i.argsort(dim=1)  # the running columns may come after the tile's (an extra column)
    v, i = v.gather(1, order), i.gather(1, order)
    return top_columns(v, i, min(k, v.shape[1]))


# --------------------------------------------------------------------------------------------
# Streamed log-sum-exp and weighted row sums with a recomputing backward
# --------------------------------------------------------------------------------------------


class TileWeights(Protocol):
    """Detached weights ``u_ij >= 0`` of a streamed weighted row sum, rebuilt per tile."""

    def tile(self, r0: int, r1: int, keys: Tensor, masks: Masks, c0: int, c1: int) -> Tensor:
        """``[r1 - r0, c1 - c0]`` weights of rows ``r0:r1`` against the key block ``keys``
        (columns ``c0:c1``); ``masks`` are the rows' excluded columns."""
        ...


class TileBias(Protocol):
    """Detached terms ``b_ij`` added to the logits inside the log-sum-exp only (the hardness
    penalty; ``-inf`` takes a column out of the denominator), rebuilt per tile with the
    signature of :meth:`TileWeights.tile`."""

    def tile(self, r0: int, r1: int, keys: Tensor, masks: Masks, c0: int, c1: int) -> Tensor:
        ...


class TileTerm(Protocol):
    """An elementwise map from the bilinear form ``s = a @ k.T`` to the logits (a per-pair
    temperature, ``s / tau(s)``)."""

    def logits(self, s: Tensor) -> Tensor:
        """The logits of the entries ``s`` (differentiable torch operations: the materialised
        path and the row-wise positive logit use autograd on the same function)."""
        ...

    def slope(self, s: Tensor) -> Tensor:
        """``d logits / d s`` entrywise, for the recomputing backward."""
        ...


class _StreamedRowStats(torch.autograd.Function):
    """``lse_neg [A]``, ``sum_j u_ij l_ij [A]`` and ``sum_j u_ij [A]`` of ``l = term(a @ k.T)``
    (``l = a @ k.T`` without a term), the log-sum-exp taken over ``l + b``."""

    @staticmethod
    def forward(ctx, a: Tensor, k: Tensor, tile: int, masks: Masks, weights: TileWeights | None,
                bias: TileBias | None, term: TileTerm | None,
                precision: ProductPrecision) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        rows, cols = a.shape[0], k.shape[0]
        lse = torch.empty(rows, dtype=a.dtype, device=a.device)
        sum_ul = torch.zeros_like(lse)
        sum_u = torch.zeros_like(lse)
        for r0, r1 in blocks(rows, tile):
            ab = a[r0:r1]
            row_masks = row_slice(masks, r0, r1)
            online = OnlineLSE(r1 - r0, a)
            for c0, c1 in blocks(cols, tile):
                kb = k[c0:c1]
                logits = product(ab, kb.T, precision)
                if term is not None:
                    logits = term.logits(logits)
                if weights is not None:
                    u = weights.tile(r0, r1, kb, row_masks, c0, c1)
                    sum_ul[r0:r1] += (u * logits).sum(dim=1)
                    sum_u[r0:r1] += u.sum(dim=1)
                if bias is not None:
                    logits.add_(bias.tile(r0, r1, kb, row_masks, c0, c1))
                online.update(mask_tile(logits, row_masks, c0, c1))
            lse[r0:r1] = online.result()
        ctx.save_for_backward(a, k, lse)
        ctx.tile, ctx.masks, ctx.weights, ctx.bias, ctx.term = tile, masks, weights, bias, term
        ctx.precision = precision
        ctx.mark_non_differentiable(sum_u)
        return lse, sum_ul, sum_u

    @staticmethod
    @once_differentiable
    def backward(ctx, g_lse: Tensor, g_ul: Tensor, _g_u: Tensor):  # type: ignore[override]
        a, k, lse = ctx.saved_tensors
        tile, masks, weights, bias, term = ctx.tile, ctx.masks, ctx.weights, ctx.bias, ctx.term
        precision = ctx.precision
        ga = torch.zeros_like(a) if ctx.needs_input_grad[0] else None
        gk = torch.zeros_like(k) if ctx.needs_input_grad[1] else None
        for r0, r1 in blocks(a.shape[0], tile):
            ab = a[r0:r1]
            row_masks = row_slice(masks, r0, r1)
            for c0, c1 in blocks(k.shape[0], tile):
                kb = k[c0:c1]
                s = product(ab, kb.T, precision)
                w = s if term is None else term.logits(s)
                if bias is not None:
                    w.add_(bias.tile(r0, r1, kb, row_masks, c0, c1))
                mask_tile(w, row_masks, c0, c1)
                w.sub_(lse[r0:r1, None]).exp_().mul_(g_lse[r0:r1, None])
                if weights is not None:
                    w.add_(weights.tile(r0, r1, kb, row_masks, c0, c1).mul_(g_ul[r0:r1, None]))
                if term is not None:
                    w.mul_(term.slope(s))
                if ga is not None:
                    product(w, kb, precision, out=ga[r0:r1])
                if gk is not None:
                    product(w.T, ab, precision, out=gk[c0:c1])
        return ga, gk, None, None, None, None, None, None


def streamed_row_stats(a: Tensor, k: Tensor, tile: int, masks: Masks,
                       weights: TileWeights | None = None, *, bias: TileBias | None = None,
                       term: TileTerm | None = None,
                       precision: ProductPrecision | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``(logsumexp_j (l_ij + b_ij), sum_j u_ij l_ij, sum_j u_ij)`` over the unmasked columns
    of ``l = term(a @ k.T)`` (``a @ k.T`` without a ``term``), streamed over ``tile x tile``
    tiles; differentiable in ``a`` and ``k`` (``u`` and ``b`` are detached). ``precision``:
    that of the products (:mod:`~adaptcl.plugins._products`; ``None``: the policy's for
    ``a``'s dtype and device). The losses reach it through the dispatcher
    (:func:`~adaptcl.plugins.tiles._dispatch.row_stats`), which may run another backend
    instead."""
    precision = product_precision(a.dtype, a.device) if precision is None else precision
    with autocast_off(a):
        return _StreamedRowStats.apply(a, k, tile, masks, weights, bias, term, precision)


@torch.no_grad()
def streamed_softmax_stats(q: Tensor, k: Tensor, temperature: float, tile: int, masks: Masks, *,
                           top: int = 0, precision: ProductPrecision = "ieee"
                           ) -> tuple[Tensor, Tensor, Tensor | None]:
    """Row statistics of ``softmax_j(<q_i, k_j> / temperature)`` over unmasked columns, streamed
    without gradient: ``(log normaliser [A], entropy [A], top columns [A, top] or None)``.

    The entropy is accumulated in shifted coordinates, ``H = log S - T / S`` with
    ``S = sum e^(x - m)`` and ``T = sum e^(x - m) (x - m)``, both rescaled when the running max
    ``m`` moves, so no large logits cancel. The top columns are those of ``<q_i, k_j>``
    (:func:`top_columns`' tie-breaking). The products are at ``precision``.
    """
    a, n = q.shape[0], k.shape[0]
    log_norm = torch.empty(a, dtype=q.dtype, device=q.device)
    ent = torch.empty_like(log_norm)
    top_idx = torch.empty(a, top, dtype=torch.long, device=q.device) if top else None
    for r0, r1 in blocks(a, tile):
        row_masks = row_slice(masks, r0, r1)
        m = torch.full((r1 - r0,), NEG_INF, dtype=q.dtype, device=q.device)
        s = torch.zeros_like(m)
        t = torch.zeros_like(m)
        best = None
        for c0, c1 in blocks(n, tile):
            d = mask_tile(product(q[r0:r1], k[c0:c1].T, precision), row_masks, c0, c1)
            if top:
                best = merge_top(best, d, c0, top)
            x = d.div_(temperature)
            new = torch.maximum(m, x.amax(dim=1))
            shift = torch.where(torch.isinf(new), torch.zeros_like(new), new)
            delta = m - shift  # <= 0, -inf while the row has seen nothing
            scale = torch.exp(delta)
            x.sub_(shift[:, None])
            e = torch.exp(x)
            x.masked_fill_(e == 0, 0.0)  # masked (-inf) and underflowed entries add 0 to T
            safe_delta = torch.where(torch.isinf(delta), torch.zeros_like(delta), delta)
            t = scale * (t + safe_delta * s) + (e * x).sum(dim=1)
            s = scale * s + e.sum(dim=1)
            m = new
        shift = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        log_norm[r0:r1] = shift + torch.log(s)
        ent[r0:r1] = torch.log(s) - t / s
        if top:
            top_idx[r0:r1] = best[1]
    return log_norm, ent, top_idx


@torch.no_grad()
def streamed_top_columns(a: Tensor, k: Tensor, tile: int, masks: Masks, kappa: int,
                         extra: Tensor | None = None,
                         precision: ProductPrecision = "ieee") -> Tensor:
    """Columns ``[A, kappa]`` of the largest entries of each row of the masked ``a @ k.T``
    (with ``extra [A]`` appended as column ``C``; products at ``precision``), merged across
    tiles by :func:`merge_top`."""
    rows, cols = a.shape[0], k.shape[0]
    out = torch.empty(rows, kappa, dtype=torch.long, device=a.device)
    for r0, r1 in blocks(rows, tile):
        row_masks = row_slice(masks, r0, r1)
        best = None
        if extra is not None:
            best = (extra[r0:r1, None],
                    torch.full((r1 - r0, 1), cols, dtype=torch.long, device=a.device))
        for c0, c1 in blocks(cols, tile):
            s = product(a[r0:r1], k[c0:c1].T, precision)
            best = merge_top(best, mask_tile(s, row_masks, c0, c1), c0, kappa)
        out[r0:r1] = best[1]
    return out


# --------------------------------------------------------------------------------------------
# Streamed log-sum-exp of an elementwise function of two bilinear forms
# --------------------------------------------------------------------------------------------


class PairTerm(Protocol):
    """``term(s, r)`` elementwise on tiles of ``s = a @ k.T`` and ``r = pa @ pk.T``."""

    def term(self, s: Tensor, r: Tensor) -> Tensor:
        """The entries whose row log-sum-exp is streamed."""
        ...

    def grads(self, s: Tensor, r: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        """``(w * d term / d s, w * d term / d r)`` for an upstream weight tile ``w``."""
        ...

    def statistic(self, r: Tensor) -> Tensor:
        """An entry-wise quantity summed over every pair for monitoring (detached)."""
        ...


class _StreamedPairLSE(torch.autograd.Function):
    """``logsumexp_j term(s_ij, r_ij)`` over the unmasked columns, with gradients to
    ``a, k, pa, pk``; also the (non-differentiable) sum of ``statistic(r)`` over every pair."""

    @staticmethod
    def forward(ctx, a, k, pa, pk, tile, masks, pair, precision):  # type: ignore[override]
        rows, cols = a.shape[0], k.shape[0]
        lse = torch.empty(rows, dtype=a.dtype, device=a.device)
        total = torch.zeros((), dtype=a.dtype, device=a.device)
        for r0, r1 in blocks(rows, tile):
            row_masks = row_slice(masks, r0, r1)
            online = OnlineLSE(r1 - r0, a)
            for c0, c1 in blocks(cols, tile):
                s = product(a[r0:r1], k[c0:c1].T, precision)
                r = product(pa[r0:r1], pk[c0:c1].T, precision)
                total = total + pair.statistic(r).sum()
                online.update(mask_tile(pair.term(s, r), row_masks, c0, c1))
            lse[r0:r1] = online.result()
        ctx.save_for_backward(a, k, pa, pk, lse)
        ctx.tile, ctx.masks, ctx.pair, ctx.precision = tile, masks, pair, precision
        ctx.mark_non_differentiable(total)
        return lse, total

    @staticmethod
    @once_differentiable
    def backward(ctx, g_lse, _g_total):  # type: ignore[override]
        a, k, pa, pk, lse = ctx.saved_tensors
        tile, masks, pair, precision = ctx.tile, ctx.masks, ctx.pair, ctx.precision
        ga, gk, gpa, gpk = (torch.zeros_like(t) for t in (a, k, pa, pk))
        for r0, r1 in blocks(a.shape[0], tile):
            row_masks = row_slice(masks, r0, r1)
            for c0, c1 in blocks(k.shape[0], tile):
                ab, kb, pab, pkb = a[r0:r1], k[c0:c1], pa[r0:r1], pk[c0:c1]
                s, r = product(ab, kb.T, precision), product(pab, pkb.T, precision)
                w = mask_tile(pair.term(s, r), row_masks, c0, c1)
                w.sub_(lse[r0:r1, None]).exp_().mul_(g_lse[r0:r1, None])
                g_s, g_r = pair.grads(s, r, w)
                product(g_s, kb, precision, out=ga[r0:r1])
                product(g_s.T, ab, precision, out=gk[c0:c1])
                product(g_r, pkb, precision, out=gpa[r0:r1])
                product(g_r.T, pab, precision, out=gpk[c0:c1])
        return ga, gk, gpa, gpk, None, None, None, None


def streamed_pair_lse(a: Tensor, k: Tensor, pa: Tensor, pk: Tensor, tile: int, masks: Masks,
                      pair: PairTerm,
                      precision: ProductPrecision | None = None) -> tuple[Tensor, Tensor]:
    """``(logsumexp_j pair.term(s_ij, r_ij) [A], sum of pair.statistic over all pairs)``,
    streamed over ``tile x tile`` tiles (``precision``, that of both products, as in
    :func:`streamed_row_stats`; the dispatcher's
    :func:`~adaptcl.plugins.tiles._dispatch.pair_lse` may run another backend instead)."""
    precision = product_precision(a.dtype, a.device) if precision is None else precision
    with autocast_off(a):
        return _StreamedPairLSE.apply(a, k, pa, pk, tile, masks, pair, precision)


@torch.no_grad()
def streamed_sum(fn, a: Tensor, b: Tensor, tile: int,
                 precision: ProductPrecision = "ieee") -> Tensor:
    """``fn(a @ b.T).sum()`` over tiles (products at ``precision``), without gradient."""
    total = torch.zeros((), dtype=a.dtype, device=a.device)
    for r0, r1 in blocks(a.shape[0], tile):
        for c0, c1 in blocks(b.shape[0], tile):
            total += fn(product(a[r0:r1], b[c0:c1].T, precision)).sum()
    return total


def materialised_bytes(num_anchors: int, num_candidates: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of one ``[A, C]`` similarity matrix (the materialised path keeps at least one)."""
    return num_anchors * num_candidates * torch.empty((), dtype=dtype).element_size()


class LoopBackend:
    """This loop as a backend (:class:`~adaptcl.plugins.tiles._backend.Backend`): the reference,
    on every device, every dtype and every op, in the plan's ``tile x tile`` tiles."""

    name = "torch"
    ops = frozenset({"row_stats", "pair_lse", "top_columns", "row_blocks"})
    own_blocks = False

    def why_not(self, problem: Problem) -> str | None:
        return None

    def auto_why_not(self, problem: Problem) -> str | None:
        return None

    def pays(self, problem: Problem) -> bool:
        return False

    def row_stats(self, plan: TilePlan, a: Tensor, k: Tensor, masks: Masks,
                  weights: TileWeights | None, bias: TileBias | None,
                  term: TileTerm | None) -> tuple[Tensor, Tensor, Tensor]:
        return streamed_row_stats(a, k, plan.tile, masks, weights, bias=bias, term=term,
                                  precision=plan.precision)

    def pair_lse(self, plan: TilePlan, a: Tensor, k: Tensor, pa: Tensor, pk: Tensor,
                 masks: Masks, pair: PairTerm) -> tuple[Tensor, Tensor]:
        return streamed_pair_lse(a, k, pa, pk, plan.tile, masks, pair, plan.precision)

    def softmax_stats(self, plan: TilePlan, q: Tensor, k: Tensor, temperature: float,
                      masks: Masks, *, top: int = 0) -> tuple[Tensor, Tensor, Tensor | None]:
        return streamed_softmax_stats(q, k, temperature, plan.tile, masks, top=top,
                                      precision=plan.precision)

    def top_columns(self, plan: TilePlan, a: Tensor, k: Tensor, masks: Masks, kappa: int,
                    extra: Tensor | None = None) -> Tensor:
        return streamed_top_columns(a, k, plan.tile, masks, kappa, extra, plan.precision)

    def pair_sum(self, plan: TilePlan, fn, a: Tensor, b: Tensor) -> Tensor:
        return streamed_sum(fn, a, b, plan.tile, plan.precision)


__all__ = ["TileWeights", "TileBias", "TileTerm", "PairTerm", "streamed_row_stats",
           "streamed_softmax_stats", "streamed_top_columns", "streamed_pair_lse",
           "streamed_sum", "top_columns", "merge_top", "materialised_bytes", "LoopBackend"]
