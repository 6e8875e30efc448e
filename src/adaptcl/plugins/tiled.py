"""Tiled contrastive losses: exact value and gradient without the full similarity matrix.

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
across tiles; the selected columns are then gathered (``[A, K, D]``) and differentiated by
ordinary autograd. When several columns tie exactly at the K-th value, which one is selected is
arbitrary in ``torch.topk`` too: the value of the loss is the same, the gradient may go to a
different (identical-valued) key. With no ties the tiled and materialised results agree to
float32 rounding.

What cannot be tiled: AMCL with a temperature network other than :class:`PairTemperature` or
:class:`ConstantTemperature` (the per-pair temperature must be recomputable inside a tile from
per-row features); :class:`AMCLLoss` raises a ``ValueError`` in that case.

When to tile: measured with ``benchmarks/bench_tiled.py`` (MACL, NT-Xent form, dim 128,
tile 2048, 2 shared CPU cores), tiled / materialised time is 1.11x at batch 1024, 1.01x at
4096 and 1.17x at 8192: materialising is never slower where it fits, tiling costs 1-17% (it
recomputes each tile in backward), while the materialised peak grows as ~3 copies of
``4 * (2N)^2`` bytes (3.0 GiB at N = 8192 against 72 MiB tiled). Keep ``tile_size=None`` while
the matrix fits comfortably; turn it on beyond that, e.g. ``MACLLoss(..., tile_size=4096)`` at
batch 65,536 (485 MiB peak where one materialised matrix alone is 64 GiB).

Example:
    >>> import torch
    >>> from adaptcl.plugins import MACLLoss
    >>> loss_fn = MACLLoss(temperature=0.1, alpha=0.5, tile_size=1024)
    >>> z0 = torch.randn(4096, 128, requires_grad=True)
    >>> z1 = torch.randn(4096, 128, requires_grad=True)
    >>> loss_fn(z0, z1).backward()   # never allocates an 8192 x 8192 matrix
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ._validation import check_int
from .candidates import Candidates
from .kernel import KernelOutput, kernel_from_lse

NEG_INF = float("-inf")


def check_tile_size(tile_size: int | None) -> int | None:
    """``None`` (materialise) or a positive int; raises ``TypeError`` / ``ValueError``."""
    if tile_size is None:
        return None
    return check_int("tile_size", tile_size, minimum=1)


def _blocks(n: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def _mask_tile(tile: Tensor, indices: tuple[Tensor | None, ...], c0: int, c1: int,
               fill: float = NEG_INF) -> Tensor:
    """Set, in place, entry ``(r, idx[r] - c0)`` of a ``[rows, c1 - c0]`` tile to ``fill``
    for every row whose excluded column ``idx[r]`` falls inside ``[c0, c1)``."""
    for idx in indices:
        if idx is None:
            continue
        rows = ((idx >= c0) & (idx < c1)).nonzero().squeeze(1)
        if rows.numel():
            tile[rows, idx[rows] - c0] = fill
    return tile


def _row_slice(idx: Tensor | None, r0: int, r1: int) -> Tensor | None:
    return None if idx is None else idx[r0:r1]


class _OnlineLSE:
    """Running ``logsumexp`` of rows fed tile by tile (``-inf`` entries contribute nothing)."""

    def __init__(self, rows: int, like: Tensor) -> None:
        self.m = torch.full((rows,), NEG_INF, dtype=like.dtype, device=like.device)
        self.s = torch.zeros(rows, dtype=like.dtype, device=like.device)

    def update(self, tile: Tensor) -> None:
        """Consume ``tile`` (overwritten: it is used as the exponential buffer)."""
        new = torch.maximum(self.m, tile.amax(dim=1))
        shift = torch.where(torch.isinf(new), torch.zeros_like(new), new)
        self.s = self.s * torch.exp(self.m - shift) + tile.sub_(shift[:, None]).exp_().sum(dim=1)
        self.m = new

    def result(self) -> Tensor:
        shift = torch.where(torch.isinf(self.m), torch.zeros_like(self.m), self.m)
        return shift + torch.log(self.s)


# --------------------------------------------------------------------------------------------
# ASCL soft-target statistics
# --------------------------------------------------------------------------------------------


@dataclass
class SoftTargetSpec:
    """What a tile needs to rebuild ASCL's un-normalised targets ``u_ij = min(1, s_i q_ij)``.

    ``q_ij = exp(<k_i, k_j> / tau' - log_norm_i)`` over the valid columns, ``s_i = c_i K``.
    All detached.
    """

    positive_keys: Tensor
    sharpen_temperature: float
    log_norm: Tensor
    scale: Tensor

    def tile(self, r0: int, r1: int, keys: Tensor, masks: tuple[Tensor | None, ...],
             c0: int, c1: int) -> Tensor:
        x = (self.positive_keys[r0:r1] @ keys.T).div_(self.sharpen_temperature)
        _mask_tile(x, masks, c0, c1)
        q = x.sub_(self.log_norm[r0:r1, None]).exp_()
        return torch.clamp(q.mul_(self.scale[r0:r1, None]), max=1.0)


@torch.no_grad()
def _neighbour_stats(c: Candidates, sharpen_temperature: float, tile: int, *, entropy: bool,
                     top: int) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Streamed statistics of ASCL's sharpened distribution ``q_i = softmax(d_i / tau')``.

    Returns ``(log_norm [A], entropy [A], top-K column indices [A, K])`` (``None`` when not
    asked for), from one pass over ``[A, C]`` tiles of ``d = <k_i, z_j>``. The entropy is
    accumulated in shifted coordinates, ``H = log S - T / S`` with ``S = sum e^(x - m)`` and
    ``T = sum e^(x - m) (x - m)``, both rescaled when the running max ``m`` moves, so no
    large logits cancel.
    """
    pk, keys = c.positive_keys.detach(), c.keys.detach()
    a, n = pk.shape[0], keys.shape[0]
    log_norm = torch.empty(a, dtype=pk.dtype, device=pk.device)
    ent = torch.empty_like(log_norm)
    top_idx = torch.empty(a, top, dtype=torch.long, device=pk.device) if top else None
    for r0, r1 in _blocks(a, tile):
        masks = (_row_slice(c.positive_index, r0, r1), _row_slice(c.self_index, r0, r1))
        m = torch.full((r1 - r0,), NEG_INF, dtype=pk.dtype, device=pk.device)
        s = torch.zeros_like(m)
        t = torch.zeros_like(m)
        best_v = best_i = None
        for c0, c1 in _blocks(n, tile):
            d = pk[r0:r1] @ keys[c0:c1].T
            _mask_tile(d, masks, c0, c1)
            if top:
                best_v, best_i = _merge_top(best_v, best_i, d, c0, top)
            if entropy:
                x = d.div_(sharpen_temperature)
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
        if entropy:
            shift = torch.where(torch.isinf(m), torch.zeros_like(m), m)
            log_norm[r0:r1] = shift + torch.log(s)
            ent[r0:r1] = torch.log(s) - t / s
        if top:
            top_idx[r0:r1] = best_i[:, :top]
    return (log_norm if entropy else None), (ent if entropy else None), top_idx


# --------------------------------------------------------------------------------------------
# The streamed log-sum-exp (and soft-target sums) with a recomputing backward
# --------------------------------------------------------------------------------------------


class _TiledRowStats(torch.autograd.Function):
    """``lse_neg [A]``, ``sum_j u_ij l_ij [A]`` and ``sum_j u_ij [A]`` of ``l = a @ k.T``."""

    @staticmethod
    def forward(ctx, a: Tensor, k: Tensor, tile: int, masks: tuple[Tensor | None, Tensor | None],
                soft: SoftTargetSpec | None) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        rows, cols = a.shape[0], k.shape[0]
        lse = torch.empty(rows, dtype=a.dtype, device=a.device)
        sum_ul = torch.zeros_like(lse)
        sum_u = torch.zeros_like(lse)
        for r0, r1 in _blocks(rows, tile):
            ab = a[r0:r1]
            row_masks = tuple(_row_slice(i, r0, r1) for i in masks)
            online = _OnlineLSE(r1 - r0, a)
            for c0, c1 in _blocks(cols, tile):
                kb = k[c0:c1]
                logits = ab @ kb.T
                if soft is not None:
                    u = soft.tile(r0, r1, kb, row_masks, c0, c1)
                    sum_ul[r0:r1] += (u * logits).sum(dim=1)
                    sum_u[r0:r1] += u.sum(dim=1)
                _mask_tile(logits, row_masks, c0, c1)
                online.update(logits)
            lse[r0:r1] = online.result()
        ctx.save_for_backward(a, k, lse)
        ctx.tile, ctx.masks, ctx.soft = tile, masks, soft
        ctx.mark_non_differentiable(sum_u)
        return lse, sum_ul, sum_u

    @staticmethod
    @once_differentiable
    def backward(ctx, g_lse: Tensor, g_ul: Tensor, _g_u: Tensor):  # type: ignore[override]
        a, k, lse = ctx.saved_tensors
        tile, masks, soft = ctx.tile, ctx.masks, ctx.soft
        ga = torch.zeros_like(a) if ctx.needs_input_grad[0] else None
        gk = torch.zeros_like(k) if ctx.needs_input_grad[1] else None
        use_soft = soft is not None and bool(g_ul.ne(0).any())
        for r0, r1 in _blocks(a.shape[0], tile):
            ab = a[r0:r1]
            row_masks = tuple(_row_slice(i, r0, r1) for i in masks)
            for c0, c1 in _blocks(k.shape[0], tile):
                kb = k[c0:c1]
                w = _mask_tile(ab @ kb.T, row_masks, c0, c1)
                w.sub_(lse[r0:r1, None]).exp_().mul_(g_lse[r0:r1, None])
                if use_soft:
                    w.add_(soft.tile(r0, r1, kb, row_masks, c0, c1).mul_(g_ul[r0:r1, None]))
                if ga is not None:
                    ga[r0:r1].addmm_(w, kb)
                if gk is not None:
                    gk[c0:c1].addmm_(w.T, ab)
        return ga, gk, None, None, None


def _scaled_anchors(c: Candidates, temperature: Tensor | float) -> tuple[Tensor, Tensor]:
    """Anchors with 1/temperature folded in, and the positive logits (as ``rows_logits``)."""
    t = torch.as_tensor(temperature, dtype=c.anchors.dtype, device=c.anchors.device)
    if t.ndim > 1:
        raise ValueError(f"temperature must be a scalar or have shape [anchors], got {tuple(t.shape)}")
    with torch.autocast(device_type=c.anchors.device.type, enabled=False):
        a = c.anchors / (t[:, None] if t.ndim == 1 else t)
        pos = c.positive_sim / t
    return a, pos


def tiled_negative_lse(c: Candidates, temperature: Tensor | float, tile_size: int) -> tuple[Tensor, Tensor]:
    """``(lse_neg [A], positive logit [A])`` of one direction, streamed over tiles.

    Equals ``(torch.logsumexp(neg, 1), pos)`` for ``neg, pos = rows_logits(c, temperature)``,
    value and gradient, without allocating ``neg``.
    """
    a, pos = _scaled_anchors(c, temperature)
    with torch.autocast(device_type=c.anchors.device.type, enabled=False):
        lse, _, _ = _TiledRowStats.apply(a, c.keys, tile_size, (c.positive_index, c.self_index), None)
    return lse, pos


def tiled_kernel(c: Candidates, temperature: Tensor | float, tile_size: int, *,
                 positive_in_denominator: bool = True,
                 log_weights: Tensor | Callable[[Tensor], Tensor] | None = None) -> KernelOutput:
    """One direction of :func:`~adaptcl.plugins.base.run_kernel` without the ``[A, C]`` matrix."""
    lse, pos = tiled_negative_lse(c, temperature, tile_size)
    return kernel_from_lse(lse, pos, positive_in_denominator=positive_in_denominator,
                           log_weights=log_weights)


# --------------------------------------------------------------------------------------------
# ASCL
# --------------------------------------------------------------------------------------------


def tiled_ascl(c: Candidates, temperature: float, tile_size: int, *, mode: str, num_neighbors: int,
               sharpen_temperature: float) -> tuple[KernelOutput, Tensor]:
    """ASCL's soft-target InfoNCE of one direction, streamed; returns ``(kernel output,
    confidence [A])``. Same values and gradients as
    :func:`~adaptcl.plugins.ascl.soft_labels` + :func:`~adaptcl.plugins.kernel.contrastive_kernel`.

    Two passes: the first (no gradient) streams the normaliser and entropy of the sharpened
    distribution (and merges the top-K columns across tiles for ``"hard"`` / ``"ahcl"``); the
    second streams ``lse_neg`` and, for ``"ascl"``, ``sum_j u_ij l_ij`` and ``sum_j u_ij``.
    """
    a, pos = _scaled_anchors(c, temperature)
    rows, dtype, device = a.shape[0], a.dtype, a.device
    masks = (c.positive_index, c.self_index)
    n = c.num_negatives
    if num_neighbors == 0:
        lse, _, _ = _TiledRowStats.apply(a, c.keys, tile_size, masks, None)
        out = kernel_from_lse(lse, pos, soft_targets=(torch.ones_like(pos), torch.zeros_like(pos)))
        return out, torch.zeros(rows, dtype=dtype, device=device)
    if n < num_neighbors:
        raise ValueError(f"num_neighbors={num_neighbors} is larger than the {n} negatives available")
    need_top = mode != "ascl"
    log_norm, entropy, top = _neighbour_stats(c, sharpen_temperature, tile_size, entropy=True,
                                              top=num_neighbors if need_top else 0)
    # log(n) with n = 1 is 0: a single negative carries no uncertainty, c = 1.
    log_n = torch.log(torch.full((rows,), float(n), dtype=dtype, device=device)).clamp(
        min=torch.finfo(dtype).tiny)
    confidence = (1 - entropy / log_n).clamp(0.0, 1.0)
    if mode == "ascl":
        spec = SoftTargetSpec(c.positive_keys.detach(), sharpen_temperature, log_norm,
                              confidence * num_neighbors)
        lse, sum_ul, sum_u = _TiledRowStats.apply(a, c.keys, tile_size, masks, spec)
        total = 1 + sum_u
        weighted = sum_ul / total
    else:
        fill = torch.ones_like(confidence) if mode == "hard" else confidence
        total = 1 + fill * num_neighbors
        lse, _, _ = _TiledRowStats.apply(a, c.keys, tile_size, masks, None)
        with torch.autocast(device_type=device.type, enabled=False):
            top_logits = torch.einsum("ad,akd->ak", a, c.keys[top])
        weighted = (fill / total) * top_logits.sum(dim=1)
    out = kernel_from_lse(lse, pos, soft_targets=(1 / total, weighted))
    return out, confidence


# --------------------------------------------------------------------------------------------
# AMCL
# --------------------------------------------------------------------------------------------


@dataclass
class PairTemperatureSpec:
    """The closed form of :class:`~adaptcl.plugins.amcl.PairTemperature` on a tile,
    ``tau = iota * sigmoid(-clamp(r)) + eta`` with ``r = <phi(a), phi(b)>``."""

    iota: float
    eta: float
    clamp: float
    beta: float
    dim: int


class _TiledPairLSE(torch.autograd.Function):
    """``logsumexp_j (s_ij / tau_ij - beta Omega(tau_ij))`` over the negatives, streamed, with
    ``s = a @ k.T`` and ``tau_ij`` from ``r = pa @ pk.T``; gradients to ``a, k, pa, pk``.
    Also returns the (non-differentiable) sum of ``tau`` over every entry, for statistics."""

    @staticmethod
    def _tile(ab, kb, pab, pkb, spec):
        s = ab @ kb.T
        r = pab @ pkb.T
        sig = torch.sigmoid(-r.clamp(-spec.clamp, spec.clamp))
        tau = sig * spec.iota + spec.eta
        return s, r, sig, tau

    @staticmethod
    def forward(ctx, a, k, pa, pk, tile, masks, spec):  # type: ignore[override]
        rows, cols = a.shape[0], k.shape[0]
        lse = torch.empty(rows, dtype=a.dtype, device=a.device)
        tau_sum = torch.zeros((), dtype=a.dtype, device=a.device)
        for r0, r1 in _blocks(rows, tile):
            row_masks = tuple(_row_slice(i, r0, r1) for i in masks)
            online = _OnlineLSE(r1 - r0, a)
            for c0, c1 in _blocks(cols, tile):
                s, _, _, tau = _TiledPairLSE._tile(a[r0:r1], k[c0:c1], pa[r0:r1], pk[c0:c1], spec)
                tau_sum = tau_sum + tau.sum()
                term = s / tau - spec.beta * (0.5 * spec.dim * torch.log(tau) + 1.0 / tau)
                online.update(_mask_tile(term, row_masks, c0, c1))
            lse[r0:r1] = online.result()
        ctx.save_for_backward(a, k, pa, pk, lse)
        ctx.tile, ctx.masks, ctx.spec = tile, masks, spec
        ctx.mark_non_differentiable(tau_sum)
        return lse, tau_sum

    @staticmethod
    @once_differentiable
    def backward(ctx, g_lse, _g_tau):  # type: ignore[override]
        a, k, pa, pk, lse = ctx.saved_tensors
        tile, masks, spec = ctx.tile, ctx.masks, ctx.spec
        ga, gk, gpa, gpk = (torch.zeros_like(t) for t in (a, k, pa, pk))
        for r0, r1 in _blocks(a.shape[0], tile):
            row_masks = tuple(_row_slice(i, r0, r1) for i in masks)
            for c0, c1 in _blocks(k.shape[0], tile):
                ab, kb, pab, pkb = a[r0:r1], k[c0:c1], pa[r0:r1], pk[c0:c1]
                s, r, sig, tau = _TiledPairLSE._tile(ab, kb, pab, pkb, spec)
                inv = 1.0 / tau
                term = s * inv - spec.beta * (0.5 * spec.dim * torch.log(tau) + inv)
                w = _mask_tile(term, row_masks, c0, c1)
                w.sub_(lse[r0:r1, None]).exp_().mul_(g_lse[r0:r1, None])
                g_s = w * inv
                # d term / d tau = -s / tau^2 - beta (dim / (2 tau) - 1 / tau^2)
                d_tau = -s * inv * inv - spec.beta * (0.5 * spec.dim * inv - inv * inv)
                # d tau / d r = -iota sig (1 - sig), zero where the clamp is active
                d_r = sig * (1 - sig) * (-spec.iota)
                d_r = d_r * ((r >= -spec.clamp) & (r <= spec.clamp))
                g_r = w * d_tau * d_r
                ga[r0:r1].addmm_(g_s, kb)
                gk[c0:c1].addmm_(g_s.T, ab)
                gpa[r0:r1].addmm_(g_r, pkb)
                gpk[c0:c1].addmm_(g_r.T, pab)
        return ga, gk, gpa, gpk, None, None, None


def _merge_top(best_v: Tensor | None, best_i: Tensor | None, tile: Tensor, c0: int,
               k: int) -> tuple[Tensor, Tensor]:
    """Merge the top-``k`` of a ``[rows, w]`` tile (columns offset by ``c0``) into the running
    ``(values, indices)``."""
    v, i = tile.topk(min(k, tile.shape[1]), dim=1)
    i = i + c0
    if best_v is not None:
        v, i = torch.cat([best_v, v], dim=1), torch.cat([best_i, i], dim=1)
        if v.shape[1] > k:
            v, j = v.topk(k, dim=1)
            i = i.gather(1, j)
    return v, i


@torch.no_grad()
def _merged_topk(a: Tensor, k: Tensor, tile: int, masks: tuple[Tensor | None, ...], kappa: int,
                 extra: Tensor | None = None) -> Tensor:
    """Column indices ``[A, kappa]`` of the largest entries of each row of the masked
    ``a @ k.T`` (with ``extra [A]`` appended as column ``C``), merged across tiles."""
    rows, cols = a.shape[0], k.shape[0]
    out = torch.empty(rows, kappa, dtype=torch.long, device=a.device)
    for r0, r1 in _blocks(rows, tile):
        row_masks = tuple(_row_slice(i, r0, r1) for i in masks)
        best_v = best_i = None
        if extra is not None:
            best_v = extra[r0:r1, None]
            best_i = torch.full((r1 - r0, 1), cols, dtype=torch.long, device=a.device)
        for c0, c1 in _blocks(cols, tile):
            d = _mask_tile(a[r0:r1] @ k[c0:c1].T, row_masks, c0, c1)
            best_v, best_i = _merge_top(best_v, best_i, d, c0, kappa)
        out[r0:r1] = best_i[:, :kappa]
    return out


def tiled_amcl_head(c: Candidates, net: torch.nn.Module, *, beta: float, dim: int,
                    negative_term: str, kappa: int, objective: str,
                    tile_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """One direction of :meth:`AMCLLoss._head_loss` streamed over tiles.

    Returns ``(per-anchor loss [A], positive temperatures [A] (detached), mean pair
    temperature over all ``A x C`` pairs (detached))``.
    """
    from .amcl import ConstantTemperature, PairTemperature, omega

    if isinstance(net, PairTemperature):
        constant = None
    elif isinstance(net, ConstantTemperature):
        constant = net.temperature
    else:
        raise ValueError(
            f"tile_size needs a PairTemperature or ConstantTemperature network to recompute pair "
            f"temperatures inside a tile; {type(net).__name__} cannot be tiled: pass tile_size=None")
    masks = (c.positive_index, c.self_index)
    tau_pos = net.pairwise(c.anchors, c.positive_keys)
    with torch.autocast(device_type=c.anchors.device.type, enabled=False):
        pos = c.positive_sim / tau_pos
        reg_pos = beta * omega(tau_pos, dim)
        if constant is None:
            wdtype = net.phi.weight.dtype
            pa, pk = net.phi(c.anchors.to(wdtype)), net.phi(c.keys.to(wdtype))
        if negative_term == "softmax":
            if constant is None:
                spec = PairTemperatureSpec(net.iota, net.eta, net.clamp, beta, dim)
                neg, tau_sum = _TiledPairLSE.apply(c.anchors, c.keys, pa.to(c.anchors.dtype),
                                                   pk.to(c.anchors.dtype), tile_size, masks, spec)
                tau_mean = tau_sum / (c.anchors.shape[0] * c.keys.shape[0])
            else:
                tau = torch.as_tensor(constant, dtype=c.anchors.dtype, device=c.anchors.device)
                lse, _, _ = _TiledRowStats.apply(c.anchors / tau, c.keys, tile_size, masks, None)
                neg = lse - beta * omega(tau, dim)
                tau_mean = tau
            if objective == "infonce":
                neg = torch.logaddexp(neg, pos - reg_pos)
        else:
            available = c.num_negatives + (objective == "infonce")
            if kappa > available:
                raise ValueError(f"kappa={kappa} is larger than the {available} "
                                 "candidates available to each anchor")
            extra = c.positive_sim.detach() if objective == "infonce" else None
            top = _merged_topk(c.anchors.detach(), c.keys.detach(), tile_size, masks, kappa, extra)
            is_pos = top == c.keys.shape[0]
            cols = top.clamp(max=c.keys.shape[0] - 1)
            s_k = torch.einsum("ad,akd->ak", c.anchors, c.keys[cols])
            s_k = torch.where(is_pos, c.positive_sim[:, None], s_k)
            if constant is None:
                r_k = torch.einsum("ad,akd->ak", pa, pk[cols])
                t_k = net._squash(r_k)
                t_k = torch.where(is_pos, tau_pos[:, None].to(t_k.dtype), t_k)
                tau_mean = _mean_pair_temperature(pa.detach(), pk.detach(), net, tile_size)
            else:
                t_k = torch.full_like(s_k, constant)
                tau_mean = torch.as_tensor(constant, dtype=s_k.dtype, device=s_k.device)
            neg = (s_k / t_k - beta * omega(t_k, dim)).mean(dim=1)
        loss = -pos + reg_pos + neg
    return loss, tau_pos.detach(), tau_mean.detach()


@torch.no_grad()
def _mean_pair_temperature(pa: Tensor, pk: Tensor, net: torch.nn.Module, tile: int) -> Tensor:
    total = torch.zeros((), dtype=pa.dtype, device=pa.device)
    for r0, r1 in _blocks(pa.shape[0], tile):
        for c0, c1 in _blocks(pk.shape[0], tile):
            total += net._squash(pa[r0:r1] @ pk[c0:c1].T).sum()
    return total / (pa.shape[0] * pk.shape[0])


def materialised_bytes(num_anchors: int, num_candidates: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of one ``[A, C]`` similarity matrix (the materialised path keeps at least one)."""
    return num_anchors * num_candidates * torch.empty((), dtype=dtype).element_size()


__all__ = ["check_tile_size", "tiled_negative_lse", "tiled_kernel", "kernel_from_lse", "tiled_ascl",
           "tiled_amcl_head", "materialised_bytes", "SoftTargetSpec", "PairTemperatureSpec",
]
