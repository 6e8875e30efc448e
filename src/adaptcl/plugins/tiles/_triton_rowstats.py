"""Triton kernels of the fused row statistics, imported by :mod:`adaptcl.plugins.tiles` on
first use only (plugins import torch alone at import time).

Triton decides when a kernel is defined whether it is compiled or interpreted
(``TRITON_INTERPRET``), for its own library too: the interpreter needs the variable set before
Triton is first imported.

Three kernels, each one launch over the whole problem (FlashAttention-2's split of the backward
into a query and a key pass: no atomics, so the gradients are deterministic), and a fourth that
replaces the two backward ones on request (``row_stats_bwd_onepass``, below):

* ``row_stats_fwd``: one program per block of ``BM`` anchors walks over every block of ``BN``
  columns; per tile it forms ``s = a @ k.T``, the logits ``l = term(s)``, masks the excluded
  columns by their global index, and keeps per row the running max and the rescaled sum of
  ``2^(l log2 e - max)`` (online log-sum-exp in base 2), plus ``sum_j u_ij l_ij`` and
  ``sum_j u_ij`` of the label targets. It writes three ``[A]`` vectors.
* ``row_stats_dq``: one program per anchor block recomputes each tile and accumulates the
  whole ``dA`` row block, ``W @ K``, ``W_ij = (p_ij g_i + u_ij g'_i) term'(s_ij)``.
* ``row_stats_dk``: one program per column block recomputes the transposed tiles
  ``s.T = k @ a.T`` and accumulates ``dK = W.T @ A``.

How they are laid out for speed:

* the anchor block (``dq``: the anchor block; ``dk``: the column block) stays resident in
  registers across the loop when the feature width fits one chunk (``KCH == 1``: up to 256
  features); wider features are multiplied in ``KCH`` chunks of ``BK``;
* the backward's accumulator spans ``BDO`` output features, the whole padded width up to the
  configuration's cap (1,024), so a tile is recomputed once per pass, not once per feature
  chunk; only wider features split the output (``program_id(1)``);
* ``exp2`` with ``log2 e`` folded into one multiply-add per entry; the log-sum-exp is stored in
  natural units;
* the positive / self masks are applied only to the column blocks that hold a masked column of
  some row of the block (or the batch's last, partial block); every other tile skips them;
* products at the caller's precision: the operands arrive in bf16 / fp16 (tensor cores,
  float32 accumulation), float32 with ``PRECISION="tf32"`` (rounded to TF32 to nearest, as the
  CPU's emulation does, :mod:`~adaptcl.plugins.tiles.precision`) or ``"ieee"``; the backward's
  tile weights are rounded to the operands' dtype, as the PyTorch loop's products round them.

DySTreSS's temperature uses ``sin(pi v)`` / ``cos(pi v)`` as odd / even polynomials on
``|v| <= 1/2`` (Taylor to degree 11 / 12, remainders below 1e-7) instead of the libdevice
calls, and fast division: a few fused multiply-adds per entry.

Block sizes are constexprs chosen per GPU architecture from a fixed table (``_configs.py``);
nothing is autotuned unless ``ADAPTCL_TRITON_AUTOTUNE=1`` asks.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from ._triton_common import (
    LOG2E,
    _accumulate,
    _dot,
    _finish_lse2,
    _gram,
    _kept,
    _needs_mask,
    _online_lse2,
    _out_operand,
    _per_col,
    _per_row,
    _resident,
    _row_masks,
    _row_state,
    _store_block,
)

PI: tl.constexpr = tl.constexpr(math.pi)
# sin(pi v) = v (S0 + S1 v^2 + ... + S5 v^10), cos(pi v) = C0 + C1 v^2 + ... + C6 v^12
S0: tl.constexpr = tl.constexpr(math.pi)
S1: tl.constexpr = tl.constexpr(-math.pi**3 / 6)
S2: tl.constexpr = tl.constexpr(math.pi**5 / 120)
S3: tl.constexpr = tl.constexpr(-math.pi**7 / 5040)
S4: tl.constexpr = tl.constexpr(math.pi**9 / 362880)
S5: tl.constexpr = tl.constexpr(-math.pi**11 / 39916800)
C1: tl.constexpr = tl.constexpr(-math.pi**2 / 2)
C2: tl.constexpr = tl.constexpr(math.pi**4 / 24)
C3: tl.constexpr = tl.constexpr(-math.pi**6 / 720)
C4: tl.constexpr = tl.constexpr(math.pi**8 / 40320)
C5: tl.constexpr = tl.constexpr(-math.pi**10 / 3628800)
C6: tl.constexpr = tl.constexpr(math.pi**12 / 479001600)


# --------------------------------------------------------------------------------------------
# The term: s -> logits
# --------------------------------------------------------------------------------------------


@triton.jit
def _horner5(x, c5: tl.constexpr, c4: tl.constexpr, c3: tl.constexpr, c2: tl.constexpr,
             c1: tl.constexpr, c0: tl.constexpr):
    """``c5 x^5 + ... + c0`` by Horner's rule: five multiply-adds."""
    p = c5 * x + c4
    p = p * x + c3
    p = p * x + c2
    p = p * x + c1
    return p * x + c0


@triton.jit
def _sinpi(v):
    """``sin(pi v)`` for ``|v| <= 1/2``."""
    return v * _horner5(v * v, S5, S4, S3, S2, S1, S0)


@triton.jit
def _cospi(v):
    """``cos(pi v)`` for ``|v| <= 1/2``."""
    v2 = v * v
    return _horner5(v2, C6, C5, C4, C3, C2, C1) * v2 + 1.0


@triton.jit
def _phase(s, TERM: tl.constexpr, threshold, width):
    """``v`` with ``|v| <= 1/2`` whose ``sin(pi v)^2`` (cosine shape) or ``cos(pi v)^2``
    (piecewise ramp) is the temperature's share of ``max - min``."""
    if TERM == 1:  # 1/2 (1 + cos(pi (1 + s))) = sin(pi s / 2)^2, |s / 2| <= 1/2 for cosines
        v = 0.5 * s
    else:  # 1/2 (1 + cos(pi x)) = cos(pi x / 2)^2, periodic in x / 2: reduce it
        u = (s - threshold) / (2.0 * width)
        v = u - tl.floor(u + 0.5)
    return v


@triton.jit
def _temperature(s, TERM: tl.constexpr, t_min, t_max, threshold, width):
    """DySTreSS's ``tau(s)``: the cosine (TERM 1) or piecewise (2) shape."""
    sv = _sinpi(_phase(s, TERM, threshold, width))
    if TERM == 1:
        tau = t_min + (t_max - t_min) * sv * sv
    else:
        tau = tl.where(s > threshold, t_max, t_max - (t_max - t_min) * sv * sv)
    return tau


@triton.jit
def _logits(s, TERM: tl.constexpr, t_min, t_max, threshold, width):
    """``term(s)``: ``s`` (TERM 0) or ``s / tau(s)``."""
    if TERM == 0:
        out = s
    else:
        out = tl.fdiv(s, _temperature(s, TERM, t_min, t_max, threshold, width))
    return out


@triton.jit
def _slope(s, TERM: tl.constexpr, DETACH: tl.constexpr, t_min, t_max, threshold, width):
    """``d term / d s`` (``1 / tau`` when tau is detached)."""
    v = _phase(s, TERM, threshold, width)
    sv = _sinpi(v)
    span = t_max - t_min
    if TERM == 1:
        tau = t_min + span * sv * sv
        d_tau = (span * PI) * sv * _cospi(v)
    else:
        tau = tl.where(s > threshold, t_max, t_max - span * sv * sv)
        d_tau = tl.where(s > threshold, 0.0, -(span * PI / width) * sv * _cospi(v))
    if DETACH:
        out = tl.fdiv(tau * 0.0 + 1.0, tau)
    else:
        out = tl.fdiv(tau - s * d_tau, tau * tau)
    return out


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def row_stats_fwd(A, K, POS, SELF, RLAB, KLAB, LSE, SUM_UL, SUM_U, M, N, D,
                  t_min, t_max, threshold, width,
                  HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr, HAS_LAB: tl.constexpr,
                  TERM: tl.constexpr, PRECISION: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, KCH: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    a = _resident(A, rows, M, D, BM, BK, KCH, PRECISION)
    pos, own = _row_masks(POS, SELF, rows, M, HAS_POS, HAS_SELF)
    if HAS_LAB:
        rl = tl.load(RLAB + rows, mask=rows < M, other=-2)
    m2 = tl.full((BM,), float("-inf"), dtype=tl.float32)  # running max, in log2 units
    total = tl.zeros((BM,), dtype=tl.float32)
    sum_ul = tl.zeros((BM,), dtype=tl.float32)
    sum_u = tl.zeros((BM,), dtype=tl.float32)
    for c0 in range(0, N, BN):
        cols = c0 + tl.arange(0, BN)
        k = _resident(K, cols, N, D, BN, BK, KCH, PRECISION)
        s = _gram(A, K, rows, cols, M, N, D, a, k, BM, BN, BK, KCH, PRECISION)
        logits = _logits(s, TERM, t_min, t_max, threshold, width)
        x2 = logits * LOG2E
        if HAS_LAB:
            keep = _kept(cols, pos, own, N, HAS_POS, HAS_SELF, False)
            kl = tl.load(KLAB + cols, mask=cols < N, other=-3)
            u = tl.where(keep & (rl[:, None] == kl[None, :]), 1.0, 0.0)
            sum_ul += tl.sum(u * logits, axis=1)
            sum_u += tl.sum(u, axis=1)
            x2 = tl.where(keep, x2, float("-inf"))
        else:
            if _needs_mask(pos, own, c0, N, BN, HAS_POS, HAS_SELF):
                x2 = tl.where(_kept(cols, pos, own, N, HAS_POS, HAS_SELF, False), x2,
                              float("-inf"))
        m2, total = _online_lse2(m2, total, x2)
    ok = rows < M
    tl.store(LSE + rows, _finish_lse2(m2, total), mask=ok)
    if HAS_LAB:
        tl.store(SUM_UL + rows, sum_ul, mask=ok)
        tl.store(SUM_U + rows, sum_u, mask=ok)


# --------------------------------------------------------------------------------------------
# The backward's steps: each kernel below is its own loop around them
# --------------------------------------------------------------------------------------------


@triton.jit
def _weights(s, rows, cols, N, pos, own, lse2, g, g_ul, rl, KLAB, c0, t_min, t_max,
             threshold, width, HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr,
             HAS_LAB: tl.constexpr, TERM: tl.constexpr, DETACH: tl.constexpr,
             BN: tl.constexpr, T: tl.constexpr):
    """The backward's ``W = d loss / d s`` of one recomputed tile (``[rows, cols]``, or
    ``[cols, rows]`` if ``T``; float32; 0 on the excluded columns)."""
    logits = _logits(s, TERM, t_min, t_max, threshold, width)
    p = tl.exp2(logits * LOG2E - _per_row(lse2, T))
    if HAS_LAB:
        keep = _kept(cols, pos, own, N, HAS_POS, HAS_SELF, T)
        p = tl.where(keep, p, 0.0)
    else:
        if _needs_mask(pos, own, c0, N, BN, HAS_POS, HAS_SELF):
            p = tl.where(_kept(cols, pos, own, N, HAS_POS, HAS_SELF, T), p, 0.0)
    w = p * _per_row(g, T)
    if HAS_LAB:
        kl = tl.load(KLAB + cols, mask=cols < N, other=-3)
        same = keep & (_per_row(rl, T) == _per_col(kl, T))
        w += tl.where(same, _per_row(g_ul, T), 0.0)
    if TERM != 0:
        w = w * _slope(s, TERM, DETACH, t_min, t_max, threshold, width)
    return w




@triton.jit
def _row_grads(POS, SELF, LSE, G_LSE, G_UL, RLAB, rows, M, HAS_POS: tl.constexpr,
               HAS_SELF: tl.constexpr, HAS_LAB: tl.constexpr):
    """Per row: the excluded columns, ``lse`` in log2 units, the upstream gradients and the
    label (float32; ``_row_state``'s, and the label targets')."""
    pos, own, lse2, g = _row_state(POS, SELF, LSE, G_LSE, rows, M, HAS_POS, HAS_SELF)
    g_ul = g
    rl = rows
    if HAS_LAB:
        g_ul = tl.load(G_UL + rows, mask=rows < M, other=0.0)
        rl = tl.load(RLAB + rows, mask=rows < M, other=-2)
    return pos, own, lse2, g, g_ul, rl


@triton.jit
def _tile_grad(A, K, KLAB, rows, cols, c0, dout, a, k, acc, pos, own, lse2, g, g_ul, rl, M, N,
               D, t_min, t_max, threshold, width, HAS_POS: tl.constexpr,
               HAS_SELF: tl.constexpr, HAS_LAB: tl.constexpr, TERM: tl.constexpr,
               DETACH: tl.constexpr, PRECISION: tl.constexpr, BM: tl.constexpr,
               BN: tl.constexpr, BK: tl.constexpr, KCH: tl.constexpr, BDO: tl.constexpr,
               T: tl.constexpr):
    """One recomputed tile of anchors ``rows`` x columns ``cols`` into a backward's
    accumulator: ``acc + W @ K[cols]`` (the anchors' side), or with ``T`` the transposed tile
    ``s.T = k @ a.T`` and ``acc + W.T @ A[rows]`` (the columns'); and the tile's weights as
    operands (``W.T`` if ``T``)."""
    if T:
        s = _gram(K, A, cols, rows, N, M, D, k, a, BN, BM, BK, KCH, PRECISION)
    else:
        s = _gram(A, K, rows, cols, M, N, D, a, k, BM, BN, BK, KCH, PRECISION)
    w = _weights(s, rows, cols, N, pos, own, lse2, g, g_ul, rl, KLAB, c0, t_min, t_max,
                 threshold, width, HAS_POS, HAS_SELF, HAS_LAB, TERM, DETACH, BN, T)
    if T:
        acc, w_op = _accumulate(acc, w, A, rows, dout, M, D, a, BK, KCH, BDO, PRECISION)
    else:
        acc, w_op = _accumulate(acc, w, K, cols, dout, N, D, k, BK, KCH, BDO, PRECISION)
    return acc, w_op


@triton.jit
def _anchor_block_grad(A, K, POS, SELF, RLAB, KLAB, LSE, G_LSE, G_UL, r0, cols, c0, dout, k,
                       acc, M, N, D, t_min, t_max, threshold, width, HAS_POS: tl.constexpr,
                       HAS_SELF: tl.constexpr, HAS_LAB: tl.constexpr, TERM: tl.constexpr,
                       DETACH: tl.constexpr, PRECISION: tl.constexpr, BM: tl.constexpr,
                       BN: tl.constexpr, BK: tl.constexpr, KCH: tl.constexpr,
                       BDO: tl.constexpr):
    """A column pass's step: the anchor block from ``r0`` (its rows' state and features read
    here) against the pass's column block, ``_tile_grad`` transposed. Also its rows and the
    tile's weights ``W.T`` as operands."""
    rows = r0 + tl.arange(0, BM)
    pos, own, lse2, g, g_ul, rl = _row_grads(POS, SELF, LSE, G_LSE, G_UL, RLAB, rows, M, HAS_POS,
                                             HAS_SELF, HAS_LAB)
    a = _resident(A, rows, M, D, BM, BK, KCH, PRECISION)
    acc, w_op = _tile_grad(A, K, KLAB, rows, cols, c0, dout, a, k, acc, pos, own, lse2, g, g_ul,
                           rl, M, N, D, t_min, t_max, threshold, width, HAS_POS, HAS_SELF,
                           HAS_LAB, TERM, DETACH, PRECISION, BM, BN, BK, KCH, BDO, True)
    return acc, rows, w_op


# --------------------------------------------------------------------------------------------
# The backward kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def row_stats_dq(A, K, POS, SELF, RLAB, KLAB, LSE, G_LSE, G_UL, GA, M, N, D,
                 t_min, t_max, threshold, width,
                 HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr, HAS_LAB: tl.constexpr,
                 TERM: tl.constexpr, DETACH: tl.constexpr, PRECISION: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, KCH: tl.constexpr,
                 BDO: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    dout = tl.program_id(1) * BDO + tl.arange(0, BDO)
    a = _resident(A, rows, M, D, BM, BK, KCH, PRECISION)
    pos, own, lse2, g, g_ul, rl = _row_grads(POS, SELF, LSE, G_LSE, G_UL, RLAB, rows, M, HAS_POS,
                                             HAS_SELF, HAS_LAB)
    acc = tl.zeros((BM, BDO), dtype=tl.float32)
    for c0 in range(0, N, BN):
        cols = c0 + tl.arange(0, BN)
        k = _resident(K, cols, N, D, BN, BK, KCH, PRECISION)
        acc, _ = _tile_grad(A, K, KLAB, rows, cols, c0, dout, a, k, acc, pos, own, lse2, g,
                            g_ul, rl, M, N, D, t_min, t_max, threshold, width, HAS_POS,
                            HAS_SELF, HAS_LAB, TERM, DETACH, PRECISION, BM, BN, BK, KCH, BDO,
                            False)
    _store_block(GA, rows, dout, M, D, acc)


@triton.jit
def row_stats_dk(A, K, POS, SELF, RLAB, KLAB, LSE, G_LSE, G_UL, GK, M, N, D,
                 t_min, t_max, threshold, width,
                 HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr, HAS_LAB: tl.constexpr,
                 TERM: tl.constexpr, DETACH: tl.constexpr, PRECISION: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, KCH: tl.constexpr,
                 BDO: tl.constexpr):
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    dout = tl.program_id(1) * BDO + tl.arange(0, BDO)
    k = _resident(K, cols, N, D, BN, BK, KCH, PRECISION)
    c0 = tl.program_id(0) * BN
    acc = tl.zeros((BN, BDO), dtype=tl.float32)
    for r0 in range(0, M, BM):
        acc, _, _ = _anchor_block_grad(A, K, POS, SELF, RLAB, KLAB, LSE, G_LSE, G_UL, r0, cols,
                                       c0, dout, k, acc, M, N, D, t_min, t_max, threshold,
                                       width, HAS_POS, HAS_SELF, HAS_LAB, TERM, DETACH,
                                       PRECISION, BM, BN, BK, KCH, BDO)
    _store_block(GK, cols, dout, N, D, acc)


@triton.jit
def row_stats_bwd_onepass(A, K, POS, SELF, RLAB, KLAB, LSE, G_LSE, G_UL, GA32, GK, M, N, D,
                          t_min, t_max, threshold, width,
                          HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr, HAS_LAB: tl.constexpr,
                          TERM: tl.constexpr, DETACH: tl.constexpr, PRECISION: tl.constexpr,
                          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                          KCH: tl.constexpr, BDO: tl.constexpr):
    """The backward in one pass (FlashAttention-3's): per column block, ``dK`` as
    ``row_stats_dk`` accumulates it, and each tile's share of ``dA``, ``W @ K``, added to a
    float32 ``dA`` with atomics (their order varies: the gradient is not deterministic). Each
    tile is recomputed once, not twice; ``BDO`` spans the whole width."""
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    c0 = tl.program_id(0) * BN
    dout = tl.arange(0, BDO)
    k = _resident(K, cols, N, D, BN, BK, KCH, PRECISION)
    out_k = _out_operand(K, cols, dout, N, D, k, BK, KCH, BDO, PRECISION)
    acc = tl.zeros((BN, BDO), dtype=tl.float32)
    for r0 in range(0, M, BM):
        acc, rows, w_op = _anchor_block_grad(A, K, POS, SELF, RLAB, KLAB, LSE, G_LSE, G_UL, r0,
                                             cols, c0, dout, k, acc, M, N, D, t_min, t_max,
                                             threshold, width, HAS_POS, HAS_SELF, HAS_LAB, TERM,
                                             DETACH, PRECISION, BM, BN, BK, KCH, BDO)
        share = _dot(tl.trans(w_op), out_k, tl.zeros((BM, BDO), dtype=tl.float32), PRECISION)
        tl.atomic_add(GA32 + rows.to(tl.int64)[:, None] * D + dout[None, :], share,
                      mask=(rows[:, None] < M) & (dout[None, :] < D), sem="relaxed")
    _store_block(GK, cols, dout, N, D, acc)
