"""Triton helpers the fused kernels share (``_triton_rowstats``, ``_triton_pairlse``), imported
on first use only: the operands (resident or chunked) and products at the caller's precision,
a backward's accumulation step, the masks of the excluded columns and what a backward reads per
row, the online log-sum-exp in base 2. Triton inlines every call, so a kernel built of these
steps compiles as if written out.

Every global a kernel reads is a ``tl.constexpr`` (the compiled path refuses any other; the
interpreter does not, which ``tests/plugins/test_kernel_compile.py`` catches).
"""

from __future__ import annotations

import math

import triton
import triton.language as tl
from triton import knobs

INTERPRET: tl.constexpr = tl.constexpr(bool(knobs.runtime.interpret))
LOG2E: tl.constexpr = tl.constexpr(1.0 / math.log(2.0))
LN2: tl.constexpr = tl.constexpr(math.log(2.0))


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
def _resident(X, idx, n, D, B: tl.constexpr, BK: tl.constexpr, KCH: tl.constexpr,
              PRECISION: tl.constexpr):
    """The ``[B, BK]`` block of rows ``idx`` of ``X`` kept in registers across a kernel's loop
    where the features fit one chunk (``KCH == 1``); zeros otherwise (the chunked products load
    their own)."""
    x = tl.zeros((B, BK), dtype=X.dtype.element_ty)
    if KCH == 1:
        x = _block(X, idx, tl.arange(0, BK), n, D, PRECISION)
    return x


@triton.jit
def _out_operand(X, idx, dout, n, D, x_res, BK: tl.constexpr, KCH: tl.constexpr,
                 BDO: tl.constexpr, PRECISION: tl.constexpr):
    """Rows ``idx``, output features ``dout`` of ``X``, a backward's product operand: the
    resident block ``x_res`` where it spans the whole output block (one chunk, ``BDO == BK``),
    else loaded."""
    if KCH == 1 and BDO == BK:
        out = x_res
    else:
        out = _block(X, idx, dout, n, D, PRECISION)
    return out


@triton.jit
def _accumulate(acc, w, X, idx, dout, n, D, x_res, BK: tl.constexpr, KCH: tl.constexpr,
                BDO: tl.constexpr, PRECISION: tl.constexpr):
    """A backward's step: ``acc + w @ X[idx, dout]`` (float32; the operand as
    ``_out_operand`` takes it), the tile weights ``w`` rounded to the operands' dtype; and
    the rounded weights."""
    out = _out_operand(X, idx, dout, n, D, x_res, BK, KCH, BDO, PRECISION)
    w_op = _as_operand(w, out, PRECISION)
    return _dot(w_op, out, acc, PRECISION), w_op


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
def _row_state(POS, SELF, LSE, G, rows, M, HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr):
    """What a backward reads per row: the excluded columns, the forward's log-sum-exp in log2
    units and its upstream gradient (0 for a row outside the problem)."""
    pos, own = _row_masks(POS, SELF, rows, M, HAS_POS, HAS_SELF)
    lse2 = tl.load(LSE + rows, mask=rows < M, other=0.0) * LOG2E
    g = tl.load(G + rows, mask=rows < M, other=0.0)
    return pos, own, lse2, g


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
# Spans: which blocks need the per-element masks and label targets
# --------------------------------------------------------------------------------------------

#: an empty span's ends (no int64 index or label reaches them)
NONE_LO: tl.constexpr = tl.constexpr(2**62)
NONE_HI: tl.constexpr = tl.constexpr(-2**62)
#: an empty index span's ends (int32: every index is below 2^31)
NO_FIRST: tl.constexpr = tl.constexpr(2**31 - 1)
NO_LAST: tl.constexpr = tl.constexpr(-1)
#: the rows a span's scan reads per step
SCAN: tl.constexpr = tl.constexpr(1024)


@triton.jit
def _value_span(X, idx, n, FLOOR: tl.constexpr):
    """The least and greatest ``X[idx]`` (int64 scalars) over ``idx < n`` and values of at
    least ``FLOOR``; ``(NONE_LO, NONE_HI)`` where there is none."""
    x = tl.load(X + idx, mask=idx < n, other=0).to(tl.int64)
    ok = (idx < n) & (x >= FLOOR)
    return (tl.min(tl.where(ok, x, NONE_LO), axis=0),
            tl.max(tl.where(ok, x, NONE_HI), axis=0))


@triton.jit
def _index_span(X, lo, hi, n):
    """The first and last index ``i < n`` (int32 scalars) whose ``X[i]`` lies in
    ``[lo, hi]``; ``(NO_FIRST, NO_LAST)`` where there is none. One scan of ``X``, ``SCAN`` rows
    a step, before a kernel's loop: it replaces a per-tile reduction."""
    first = tl.full((SCAN,), NO_FIRST, dtype=tl.int32)
    last = tl.full((SCAN,), NO_LAST, dtype=tl.int32)
    for i0 in range(0, n, SCAN):
        i = i0 + tl.arange(0, SCAN)
        x = tl.load(X + i, mask=i < n, other=0).to(tl.int64)
        hit = (i < n) & (x >= lo) & (x <= hi)
        first = tl.minimum(first, tl.where(hit, i, NO_FIRST))
        last = tl.maximum(last, tl.where(hit, i, NO_LAST))
    return tl.min(first, axis=0), tl.max(last, axis=0)


@triton.jit
def _index_span_of(span):
    """An int64 span of column indices (``_value_span`` of a mask) as an int32 index span."""
    lo, hi = span
    return (tl.minimum(lo, NO_FIRST).to(tl.int32), tl.maximum(hi, NO_LAST).to(tl.int32))


@triton.jit
def _meets(span, start, B: tl.constexpr):
    """Whether the span ``(lo, hi)`` meets ``[start, start + B)`` (a scalar)."""
    lo, hi = span
    return (lo < start + B) & (hi >= start)


# --------------------------------------------------------------------------------------------
# The online log-sum-exp, base 2
# --------------------------------------------------------------------------------------------


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
