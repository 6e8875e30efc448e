"""Triton kernels of the fused row statistics, imported by :mod:`adaptcl.plugins.tiles` on
first use only (plugins import torch alone at import time).

Triton decides when a kernel is defined whether it is compiled or interpreted
(``TRITON_INTERPRET``), for its own library too: the interpreter needs the variable set before
Triton is first imported.

Three kernels, each one launch over the whole problem (FlashAttention-2's split of the backward
into a query and a key pass: no atomics, so the gradients are deterministic):

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
from triton import knobs

INTERPRET: tl.constexpr = tl.constexpr(bool(knobs.runtime.interpret))
LOG2E: tl.constexpr = tl.constexpr(1.0 / math.log(2.0))
LN2: tl.constexpr = tl.constexpr(math.log(2.0))
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
# Operands and products
# --------------------------------------------------------------------------------------------


@triton.jit
def _tf32(x):
    """``x`` (float32) rounded to TF32's 10 mantissa bits, to nearest, ties away from zero."""
    bits = x.to(tl.int32, bitcast=True)
    return ((bits + 4096) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def _block(X, idx, d, n, D, PRECISION: tl.constexpr):
    """Rows ``idx`` (of ``n``), features ``d`` (of ``D``) of a row-major ``[n, D]`` operand,
    as the products read it (0 outside the problem). Offsets in int64: ``n * D`` passes 2^31
    at two million rows of 1,024 features."""
    x = tl.load(X + idx.to(tl.int64)[:, None] * D + d[None, :],
                mask=(idx[:, None] < n) & (d[None, :] < D), other=0.0)
    if PRECISION == "tf32":
        x = _tf32(x)
    return x


@triton.jit
def _bf16_rne(x):
    """``x`` (float32) rounded to bf16's 7 mantissa bits, to nearest, ties to even (the GPU's
    cast; the interpreter's truncates)."""
    bits = x.to(tl.int32, bitcast=True)
    bits = bits + (32767 + ((bits >> 16) & 1))
    return (bits & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _as_operand(w, like, PRECISION: tl.constexpr):
    """Float32 tile weights in the operands' dtype (``like``'s), rounded as the products read
    them (to nearest, as PyTorch's casts)."""
    if INTERPRET and PRECISION == "bf16":
        w = _bf16_rne(w)
    w = w.to(like.dtype)
    if PRECISION == "tf32":
        w = _tf32(w)
    return w


@triton.jit
def _dot(x, y, acc, PRECISION: tl.constexpr):
    """``acc + x @ y``, float32 accumulation. Under the interpreter (whose ``dot`` of bf16 /
    fp16 operands is wrong) the operands, already rounded, are multiplied in float32."""
    if INTERPRET:
        x = x.to(tl.float32)
        y = y.to(tl.float32)
    if PRECISION == "tf32":
        acc = tl.dot(x, y, acc, input_precision="tf32")
    else:
        acc = tl.dot(x, y, acc, input_precision="ieee")
    return acc


@triton.jit
def _gram(X, Y, xi, yi, nx, ny, D, x_res, y_res, BX: tl.constexpr, BY: tl.constexpr,
          BK: tl.constexpr, KCH: tl.constexpr, PRECISION: tl.constexpr):
    """``[BX, BY]`` float32 ``X[xi] @ Y[yi].T``: from the resident blocks ``x_res`` /
    ``y_res`` (``[B, BK]``) when the features fit one chunk, else in ``KCH`` chunks."""
    s = tl.zeros((BX, BY), dtype=tl.float32)
    if KCH == 1:
        s = _dot(x_res, tl.trans(y_res), s, PRECISION)
    else:
        for c in range(KCH):  # a loop, not unrolled: one chunk's buffers per pipeline stage
            d = c * BK + tl.arange(0, BK)
            s = _dot(_block(X, xi, d, nx, D, PRECISION),
                     tl.trans(_block(Y, yi, d, ny, D, PRECISION)), s, PRECISION)
    return s


@triton.jit
def _store_block(X, idx, d, n, D, value):
    tl.store(X + idx.to(tl.int64)[:, None] * D + d[None, :], value.to(X.dtype.element_ty),
             mask=(idx[:, None] < n) & (d[None, :] < D))


# --------------------------------------------------------------------------------------------
# Masks
# --------------------------------------------------------------------------------------------


@triton.jit
def _row_masks(POS, SELF, rows, M, HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr):
    """The rows' excluded columns (``-1``: none, or a row outside the problem)."""
    pos = tl.full(rows.shape, -1, dtype=tl.int64)
    own = tl.full(rows.shape, -1, dtype=tl.int64)
    if HAS_POS:
        pos = tl.load(POS + rows, mask=rows < M, other=-1).to(tl.int64)
    if HAS_SELF:
        own = tl.load(SELF + rows, mask=rows < M, other=-1).to(tl.int64)
    return pos, own


@triton.jit
def _needs_mask(pos, own, c0, N, BN: tl.constexpr, HAS_POS: tl.constexpr,
                HAS_SELF: tl.constexpr):
    """Whether the column block ``[c0, c0 + BN)`` holds an excluded column of one of the rows
    or runs past the last column (a scalar)."""
    needs = c0 + BN > N
    if HAS_POS:
        needs = needs | (tl.max(((pos >= c0) & (pos < c0 + BN)).to(tl.int32), axis=0) > 0)
    if HAS_SELF:
        needs = needs | (tl.max(((own >= c0) & (own < c0 + BN)).to(tl.int32), axis=0) > 0)
    return needs


@triton.jit
def _kept(cols, pos, own, N, HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr,
          T: tl.constexpr):
    """``[rows, cols]`` (``[cols, rows]`` if ``T``): the column exists and is neither the
    row's positive nor the row itself."""
    c = _per_col(cols, T)
    keep = c < N
    if HAS_POS:
        keep = keep & (_per_row(pos, T) != c)
    if HAS_SELF:
        keep = keep & (_per_row(own, T) != c)
    return keep


@triton.jit
def _per_row(x, T: tl.constexpr):
    """A per-row vector broadcast over a tile (``[rows, cols]``, or ``[cols, rows]`` if ``T``)."""
    if T:
        out = x[None, :]
    else:
        out = x[:, None]
    return out


@triton.jit
def _per_col(x, T: tl.constexpr):
    if T:
        out = x[:, None]
    else:
        out = x[None, :]
    return out


# --------------------------------------------------------------------------------------------
# The term: s -> logits
# --------------------------------------------------------------------------------------------


@triton.jit
def _sinpi(v):
    """``sin(pi v)`` for ``|v| <= 1/2``."""
    v2 = v * v
    p = S5 * v2 + S4
    p = p * v2 + S3
    p = p * v2 + S2
    p = p * v2 + S1
    p = p * v2 + S0
    return v * p


@triton.jit
def _cospi(v):
    """``cos(pi v)`` for ``|v| <= 1/2``."""
    v2 = v * v
    p = C6 * v2 + C5
    p = p * v2 + C4
    p = p * v2 + C3
    p = p * v2 + C2
    p = p * v2 + C1
    return p * v2 + 1.0


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
    d0 = tl.arange(0, BK)
    a = tl.zeros((BM, BK), dtype=A.dtype.element_ty)
    if KCH == 1:
        a = _block(A, rows, d0, M, D, PRECISION)
    pos, own = _row_masks(POS, SELF, rows, M, HAS_POS, HAS_SELF)
    if HAS_LAB:
        rl = tl.load(RLAB + rows, mask=rows < M, other=-2)
    m2 = tl.full((BM,), float("-inf"), dtype=tl.float32)  # running max, in log2 units
    total = tl.zeros((BM,), dtype=tl.float32)
    sum_ul = tl.zeros((BM,), dtype=tl.float32)
    sum_u = tl.zeros((BM,), dtype=tl.float32)
    for c0 in range(0, N, BN):
        cols = c0 + tl.arange(0, BN)
        k = tl.zeros((BN, BK), dtype=K.dtype.element_ty)
        if KCH == 1:
            k = _block(K, cols, d0, N, D, PRECISION)
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


@triton.jit
def _online_lse2(m2, total, x2):
    """One tile of log2-unit logits ``x2`` (``-inf``: excluded) into the running max ``m2`` and
    sum ``total`` of ``2^(x2 - m2)`` per row (the shift is 0 while a row has seen nothing)."""
    m_new = tl.maximum(m2, tl.max(x2, axis=1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    total = total * tl.exp2(m2 - shift) + tl.sum(tl.exp2(x2 - shift[:, None]), axis=1)
    return m_new, total


@triton.jit
def _finish_lse2(m2, total):
    """The rows' natural log-sum-exp; ``-inf`` where every column was excluded."""
    shift = tl.where(m2 == float("-inf"), 0.0, m2)
    return tl.where(total > 0, (shift + tl.log2(tl.where(total > 0, total, 1.0))) * LN2,
                    float("-inf"))


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
def _row_grads(LSE, G_LSE, G_UL, RLAB, rows, M, HAS_LAB: tl.constexpr):
    """Per row: ``lse`` in log2 units, the upstream gradients and the label (float32)."""
    ok = rows < M
    lse2 = tl.load(LSE + rows, mask=ok, other=0.0) * LOG2E
    g = tl.load(G_LSE + rows, mask=ok, other=0.0)
    g_ul = g
    rl = rows
    if HAS_LAB:
        g_ul = tl.load(G_UL + rows, mask=ok, other=0.0)
        rl = tl.load(RLAB + rows, mask=ok, other=-2)
    return lse2, g, g_ul, rl


@triton.jit
def row_stats_dq(A, K, POS, SELF, RLAB, KLAB, LSE, G_LSE, G_UL, GA, M, N, D,
                 t_min, t_max, threshold, width,
                 HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr, HAS_LAB: tl.constexpr,
                 TERM: tl.constexpr, DETACH: tl.constexpr, PRECISION: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, KCH: tl.constexpr,
                 BDO: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    dout = tl.program_id(1) * BDO + tl.arange(0, BDO)
    d0 = tl.arange(0, BK)
    a = tl.zeros((BM, BK), dtype=A.dtype.element_ty)
    if KCH == 1:
        a = _block(A, rows, d0, M, D, PRECISION)
    pos, own = _row_masks(POS, SELF, rows, M, HAS_POS, HAS_SELF)
    lse2, g, g_ul, rl = _row_grads(LSE, G_LSE, G_UL, RLAB, rows, M, HAS_LAB)
    acc = tl.zeros((BM, BDO), dtype=tl.float32)
    for c0 in range(0, N, BN):
        cols = c0 + tl.arange(0, BN)
        k = tl.zeros((BN, BK), dtype=K.dtype.element_ty)
        if KCH == 1:
            k = _block(K, cols, d0, N, D, PRECISION)
        s = _gram(A, K, rows, cols, M, N, D, a, k, BM, BN, BK, KCH, PRECISION)
        w = _weights(s, rows, cols, N, pos, own, lse2, g, g_ul, rl, KLAB, c0, t_min, t_max,
                     threshold, width, HAS_POS, HAS_SELF, HAS_LAB, TERM, DETACH, BN, False)
        if KCH == 1 and BDO == BK:  # the tile's own key block is the output's operand
            out_k = k
        else:
            out_k = _block(K, cols, dout, N, D, PRECISION)
        acc = _dot(_as_operand(w, out_k, PRECISION), out_k, acc, PRECISION)
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
    d0 = tl.arange(0, BK)
    k = tl.zeros((BN, BK), dtype=K.dtype.element_ty)
    if KCH == 1:
        k = _block(K, cols, d0, N, D, PRECISION)
    c0 = tl.program_id(0) * BN
    acc = tl.zeros((BN, BDO), dtype=tl.float32)
    for r0 in range(0, M, BM):
        rows = r0 + tl.arange(0, BM)
        pos, own = _row_masks(POS, SELF, rows, M, HAS_POS, HAS_SELF)
        lse2, g, g_ul, rl = _row_grads(LSE, G_LSE, G_UL, RLAB, rows, M, HAS_LAB)
        a = tl.zeros((BM, BK), dtype=A.dtype.element_ty)
        if KCH == 1:
            a = _block(A, rows, d0, M, D, PRECISION)
        s_t = _gram(K, A, cols, rows, N, M, D, k, a, BN, BM, BK, KCH, PRECISION)
        w_t = _weights(s_t, rows, cols, N, pos, own, lse2, g, g_ul, rl, KLAB, c0, t_min,
                       t_max, threshold, width, HAS_POS, HAS_SELF, HAS_LAB, TERM, DETACH, BN,
                       True)
        if KCH == 1 and BDO == BK:
            out_a = a
        else:
            out_a = _block(A, rows, dout, M, D, PRECISION)
        acc = _dot(_as_operand(w_t, out_a, PRECISION), out_a, acc, PRECISION)
    _store_block(GK, cols, dout, N, D, acc)
