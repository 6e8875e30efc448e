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

How they are laid out for the hardware (sm_90 first; ``python -m benchmarks.kernel_report``
and the compile gate read the result from ptxas' report and the SASS):

* the program's block (``dq``: its anchors; ``dk``: its columns) stays resident in shared
  memory, where wgmma reads it, across the loop when the feature width fits one chunk
  (``KCH == 1``; the split backward on sm_90: up to 512 features, ``_configs.features``);
  wider features are multiplied in ``KCH`` chunks of ``BK``;
* the backward's accumulator spans ``BDO`` output features, the whole padded width up to the
  layout's cap, so a tile is recomputed once per pass, not once per feature chunk; only wider
  features split the output (``program_id(1)``);
* ``dq`` and ``dk`` run at two programs per SM (their registers, ``_configs._row_rule``), so
  one program's products overlap another's exponentials; each loop has at least one step
  (``tl.assume``), so the compiler builds no path that zeroes an accumulator while its last
  product is in flight (ptxas would serialise every wgmma, its warning C7515);
* the per-element masks and label targets run only on a *slow* tile. Before its loop a
  program reads which blocks can need them: in ``fwd`` / ``dq`` the span of columns its rows
  exclude (positive, self) and of the keys whose label lies within its rows' labels; in ``dk``
  (one scan of the anchors) the span of anchors that exclude one of its columns or whose label
  lies within its keys'. A tile is slow where a span meets it or it is the batch's partial
  last column block; every other tile is InfoNCE's. ``_fused`` sorts a labelled problem by
  label, so the label spans are a few blocks wide; the masks of the 2N, cross-view and
  gathered forms are contiguous runs of columns;
* ``exp2`` with ``log2 e`` folded into one multiply-add per entry; the log-sum-exp is stored in
  natural units;
* products at the caller's precision: the operands arrive in bf16 / fp16 (tensor cores,
  float32 accumulation), float32 with ``PRECISION="tf32"`` (rounded to TF32 to nearest, as the
  CPU's emulation does, :mod:`~adaptcl.plugins._products`) or ``"ieee"``; the backward's
  tile weights are rounded to the operands' dtype, as the PyTorch loop's products round them.

DySTreSS's temperature uses ``sin(pi v)`` / ``cos(pi v)`` as odd / even polynomials on
``|v| <= 1/2`` (Taylor to degree 11 / 12, remainders below 1e-7) instead of the libdevice
calls, and its reciprocal Newton's iteration in fused multiply-adds (``_reciprocal``): no
division and no ``MUFU`` operation beyond the exponential's; one temperature per entry serves
the logit and its slope (``_term``).

Block sizes are constexprs chosen per GPU architecture from a fixed table (``_configs.py``);
nothing is autotuned unless ``tiling(autotune=True)`` asks.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from ._triton_common import (
    LOG2E,
    NO_FIRST,
    NO_LAST,
    NONE_HI,
    _accumulate,
    _dot,
    _finish_lse2,
    _gram,
    _index_span,
    _index_span_of,
    _kept,
    _meets,
    _online_lse2,
    _out_operand,
    _per_col,
    _per_row,
    _resident,
    _row_masks,
    _store_block,
    _value_span,
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
        u = (s - threshold) * (0.5 / width)  # one division per program, not per entry
        v = u - tl.floor(u + 0.5)
    return v


@triton.jit
def _reciprocal(t):
    """``1 / t`` for a positive normal float32 ``t`` in fused multiply-adds, no division (no
    ``MUFU.RCP``): Newton's ``r <- r + r (1 - t r)`` three times from the guess that flips
    ``t``'s exponent bits (relative error below 5.1e-2, squared each step: below 1e-7)."""
    r = (0x7EF311C3 - t.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
    for _ in tl.static_range(3):
        r = tl.fma(r, tl.fma(-t, r, 1.0), r)
    return r


@triton.jit
def _term(s, TERM: tl.constexpr, DETACH: tl.constexpr, tau):
    """``(term(s), d term / d s)``: ``(s, 1)`` for TERM 0, else DySTreSS's ``s / tau(s)``
    with the cosine (TERM 1) or piecewise (2) temperature and its slope (``1 / tau`` when tau
    is detached). One temperature and one reciprocal per entry serve both."""
    if TERM == 0:
        logits = s
        slope = s * 0.0 + 1.0
    else:
        t_min, t_max, threshold, width = tau
        v = _phase(s, TERM, threshold, width)
        sv = _sinpi(v)
        span = t_max - t_min
        if TERM == 1:
            t = t_min + span * sv * sv
        else:
            t = tl.where(s > threshold, t_max, t_max - span * sv * sv)
        r = _reciprocal(t)
        logits = s * r
        if DETACH:
            slope = r
        else:
            if TERM == 1:
                d_tau = (span * PI) * sv * _cospi(v)
            else:
                d_tau = tl.where(s > threshold, 0.0, -(span * PI / width) * sv * _cospi(v))
            slope = (t - s * d_tau) * (r * r)
    return logits, slope


# --------------------------------------------------------------------------------------------
# Which blocks take the per-element masks and label targets
# --------------------------------------------------------------------------------------------


@triton.jit
def _columns_to_mask(POS, SELF, RLAB, KLAB, rows, M, N, HAS_POS: tl.constexpr,
                     HAS_SELF: tl.constexpr, HAS_LAB: tl.constexpr):
    """An anchor block's three column spans, read once before its loop: the columns its rows
    exclude as positives and as themselves, and the columns whose key label lies within the
    block's labels (the only columns that can hold a same-class key)."""
    pos = (NO_FIRST, NO_LAST)
    own = (NO_FIRST, NO_LAST)
    lab = (NO_FIRST, NO_LAST)
    if HAS_POS:
        pos = _index_span_of(_value_span(POS, rows, M, 0))
    if HAS_SELF:
        own = _index_span_of(_value_span(SELF, rows, M, 0))
    if HAS_LAB:
        lo, hi = _value_span(RLAB, rows, M, NONE_HI)
        lab = _index_span(KLAB, lo, hi, N)
    return pos, own, lab


@triton.jit
def _anchors_to_mask(POS, SELF, RLAB, KLAB, cols, c0, M, N, HAS_POS: tl.constexpr,
                     HAS_SELF: tl.constexpr, HAS_LAB: tl.constexpr, BN: tl.constexpr):
    """A column block's three anchor spans, from one scan of the anchors before its loop: the
    anchors that exclude one of its columns as their positive or as themselves, and the
    anchors whose label lies within the block's key labels."""
    pos = (NO_FIRST, NO_LAST)
    own = (NO_FIRST, NO_LAST)
    lab = (NO_FIRST, NO_LAST)
    if HAS_POS:
        pos = _index_span(POS, c0, c0 + BN - 1, M)
    if HAS_SELF:
        own = _index_span(SELF, c0, c0 + BN - 1, M)
    if HAS_LAB:
        lo, hi = _value_span(KLAB, cols, N, NONE_HI)
        lab = _index_span(RLAB, lo, hi, M)
    return pos, own, lab


@triton.jit
def _kept_here(POS, SELF, rows, cols, M, N, HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr,
               T: tl.constexpr):
    """``_kept`` of a slow tile, its rows' excluded columns read here (not held across the
    loop) and compared in int32 (columns are below 2^31): half the registers of int64."""
    pos, own = _row_masks(POS, SELF, rows, M, HAS_POS, HAS_SELF)
    return _kept(cols, pos.to(tl.int32), own.to(tl.int32), N, HAS_POS, HAS_SELF, T)


@triton.jit
def _slow(spans, start, B: tl.constexpr, partial):
    """Whether a block ``[start, start + B)`` along the spans' axis (or a ``partial`` block)
    takes the per-element masks and targets (a scalar)."""
    pos, own, lab = spans
    return partial | _meets(pos, start, B) | _meets(own, start, B) | _meets(lab, start, B)


# --------------------------------------------------------------------------------------------
# The forward
# --------------------------------------------------------------------------------------------


@triton.jit
def row_stats_fwd(A, K, POS, SELF, RLAB, KLAB, LSE, SUM_UL, SUM_U, M, N, D,
                  t_min, t_max, threshold, width,
                  HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr, HAS_LAB: tl.constexpr,
                  TERM: tl.constexpr, PRECISION: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, KCH: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    a = _resident(A, rows, M, D, BM, BK, KCH, PRECISION)
    spans = _columns_to_mask(POS, SELF, RLAB, KLAB, rows, M, N, HAS_POS, HAS_SELF, HAS_LAB)
    m2 = tl.full((BM,), float("-inf"), dtype=tl.float32)  # running max, in log2 units
    total = tl.zeros((BM,), dtype=tl.float32)
    sum_ul = tl.zeros((BM,), dtype=tl.float32)
    sum_u = tl.zeros((BM,), dtype=tl.float32)
    for c0 in range(0, N, BN):
        cols = c0 + tl.arange(0, BN)
        k = _resident(K, cols, N, D, BN, BK, KCH, PRECISION)
        s = _gram(A, K, rows, cols, M, N, D, a, k, BM, BN, BK, KCH, PRECISION)
        logits, _ = _term(s, TERM, True, (t_min, t_max, threshold, width))
        x2 = logits * LOG2E
        if _slow(spans, c0, BN, c0 + BN > N):
            keep = _kept_here(POS, SELF, rows, cols, M, N, HAS_POS, HAS_SELF, False)
            x2 = tl.where(keep, x2, float("-inf"))
            if HAS_LAB:  # the kept columns are those with a finite logit now
                same = (x2 != float("-inf")) & _same_class(RLAB, KLAB, rows, cols, M, N, False)
                sum_ul += tl.sum(tl.where(same, logits, 0.0), axis=1)
                sum_u += tl.sum(tl.where(same, 1.0, 0.0), axis=1)
        m2, total = _online_lse2(m2, total, x2)
    ok = rows < M
    tl.store(LSE + rows, _finish_lse2(m2, total), mask=ok)
    if HAS_LAB:
        tl.store(SUM_UL + rows, sum_ul, mask=ok)
        tl.store(SUM_U + rows, sum_u, mask=ok)


@triton.jit
def _same_class(RLAB, KLAB, rows, cols, M, N, T: tl.constexpr):
    """``[rows, cols]`` (``[cols, rows]`` if ``T``): the key has the anchor's label (rows and
    columns outside the problem never match). The labels are dense ranks (``_fused`` numbers
    them), so int32 holds them: half the registers of int64."""
    rl = tl.load(RLAB + rows, mask=rows < M, other=-2).to(tl.int32)
    kl = tl.load(KLAB + cols, mask=cols < N, other=-3).to(tl.int32)
    return _per_row(rl, T) == _per_col(kl, T)


# --------------------------------------------------------------------------------------------
# The backward's steps: each kernel below is its own loop around them
#
# Their arguments travel in groups: ``X`` the kernel's input pointers ``(A, K, POS, SELF,
# RLAB, KLAB, LSE, G_LSE, G_UL)``, ``sizes`` ``(M, N, D)``, ``tau`` DySTreSS's four
# parameters, ``F`` the flags ``(HAS_POS, HAS_SELF, HAS_LAB, TERM, DETACH)`` and
# ``B`` the blocks ``(BM, BN, BK, KCH, BDO)``, the last two constexpr, written at each call
# (Triton 3.8 keeps a tuple's elements constexpr only there, not through a name, and a string
# not at all: ``PRECISION`` travels apart); a helper names their elements.
# --------------------------------------------------------------------------------------------


@triton.jit
def _anchor_state(X, rows, M):
    """What a backward reads per anchor on every tile: ``lse`` in log2 units and its upstream
    gradient (0 for an anchor outside the problem)."""
    LSE, G_LSE = X[6], X[7]
    lse2 = tl.load(LSE + rows, mask=rows < M, other=0.0) * LOG2E
    g = tl.load(G_LSE + rows, mask=rows < M, other=0.0)
    return lse2, g


@triton.jit
def _weights(X, s, rows, cols, lse2, g, slow, sizes, tau, F: tl.constexpr, T: tl.constexpr):
    """The backward's ``W = d loss / d s`` of one recomputed tile (``[rows, cols]``, or
    ``[cols, rows]`` if ``T``; float32; 0 on the excluded columns): ``(p g + u g') term'(s)``.
    The masks and label targets only on a ``slow`` tile."""
    HAS_POS: tl.constexpr = F[0]
    HAS_SELF: tl.constexpr = F[1]
    HAS_LAB: tl.constexpr = F[2]
    TERM: tl.constexpr = F[3]
    DETACH: tl.constexpr = F[4]
    POS, SELF, RLAB, KLAB, G_UL = X[2], X[3], X[4], X[5], X[8]
    M, N, D = sizes
    logits, slope = _term(s, TERM, DETACH, tau)
    w = tl.exp2(logits * LOG2E - _per_row(lse2, T)) * _per_row(g, T)
    if slow:
        keep = _kept_here(POS, SELF, rows, cols, M, N, HAS_POS, HAS_SELF, T)
        w = tl.where(keep, w, 0.0)
        if HAS_LAB:
            g_ul = tl.load(G_UL + rows, mask=rows < M, other=0.0)
            same = keep & _same_class(RLAB, KLAB, rows, cols, M, N, T)
            w += tl.where(same, _per_row(g_ul, T), 0.0)
    if TERM != 0:
        w = w * slope
    return w


@triton.jit
def _tile_grad(X, rows, cols, dout, a, k, lse2, g, slow, acc, sizes, tau, F: tl.constexpr,
               B: tl.constexpr, PRECISION: tl.constexpr, T: tl.constexpr):
    """One recomputed tile of anchors ``rows`` x columns ``cols`` into a backward's
    accumulator: ``acc + W @ K[cols]`` (the anchors' side), or with ``T`` the transposed tile
    ``s.T = k @ a.T`` and ``acc + W.T @ A[rows]`` (the columns'); and the tile's weights as
    operands (``W.T`` if ``T``)."""
    BM: tl.constexpr = B[0]
    BN: tl.constexpr = B[1]
    BK: tl.constexpr = B[2]
    KCH: tl.constexpr = B[3]
    BDO: tl.constexpr = B[4]
    A, K = X[0], X[1]
    M, N, D = sizes
    if T:
        s = _gram(K, A, cols, rows, N, M, D, k, a, BN, BM, BK, KCH, PRECISION)
    else:
        s = _gram(A, K, rows, cols, M, N, D, a, k, BM, BN, BK, KCH, PRECISION)
    w = _weights(X, s, rows, cols, lse2, g, slow, sizes, tau, F, T)
    if T:
        acc, w_op = _accumulate(acc, w, A, rows, dout, M, D, a, BK, KCH, BDO, PRECISION)
    else:
        acc, w_op = _accumulate(acc, w, K, cols, dout, N, D, k, BK, KCH, BDO, PRECISION)
    return acc, w_op


@triton.jit
def _column_block_grad(X, r0, cols, dout, k, spans, partial, acc, sizes, tau, F: tl.constexpr,
                       B: tl.constexpr, PRECISION: tl.constexpr):
    """A column pass's step: the anchor block from ``r0`` (its rows' state and features read
    here) against the pass's column block, ``_tile_grad`` transposed (the masks and targets
    where ``spans`` meet the anchors, or on the ``partial`` last column block). Also its rows
    and the tile's weights ``W.T`` as operands."""
    BM: tl.constexpr = B[0]
    BK: tl.constexpr = B[2]
    KCH: tl.constexpr = B[3]
    M, N, D = sizes
    rows = r0 + tl.arange(0, BM)
    lse2, g = _anchor_state(X, rows, M)
    a = _resident(X[0], rows, M, D, BM, BK, KCH, PRECISION)
    slow = _slow(spans, r0, BM, partial)
    acc, w_op = _tile_grad(X, rows, cols, dout, a, k, lse2, g, slow, acc, sizes, tau, F, B,
                           PRECISION, True)
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
    X = (A, K, POS, SELF, RLAB, KLAB, LSE, G_LSE, G_UL)
    sizes = (M, N, D)
    tau = (t_min, t_max, threshold, width)
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    dout = tl.program_id(1) * BDO + tl.arange(0, BDO)
    a = _resident(A, rows, M, D, BM, BK, KCH, PRECISION)
    lse2, g = _anchor_state(X, rows, M)
    spans = _columns_to_mask(POS, SELF, RLAB, KLAB, rows, M, N, HAS_POS, HAS_SELF, HAS_LAB)
    acc = tl.zeros((BM, BDO), dtype=tl.float32)
    # at least one tile: the compiler then has no path that zeroes the accumulator while its
    # last product is in flight (ptxas would serialise every wgmma, warning C7515)
    tl.assume(N > 0)
    for c0 in range(0, N, BN):
        cols = c0 + tl.arange(0, BN)
        k = _resident(K, cols, N, D, BN, BK, KCH, PRECISION)
        slow = _slow(spans, c0, BN, c0 + BN > N)
        acc, _ = _tile_grad(X, rows, cols, dout, a, k, lse2, g, slow, acc, sizes, tau,
                            (HAS_POS, HAS_SELF, HAS_LAB, TERM, DETACH), (BM, BN, BK, KCH, BDO),
                            PRECISION, False)
    _store_block(GA, rows, dout, M, D, acc)


@triton.jit
def row_stats_dk(A, K, POS, SELF, RLAB, KLAB, LSE, G_LSE, G_UL, GK, M, N, D,
                 t_min, t_max, threshold, width,
                 HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr, HAS_LAB: tl.constexpr,
                 TERM: tl.constexpr, DETACH: tl.constexpr, PRECISION: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, KCH: tl.constexpr,
                 BDO: tl.constexpr):
    X = (A, K, POS, SELF, RLAB, KLAB, LSE, G_LSE, G_UL)
    sizes = (M, N, D)
    tau = (t_min, t_max, threshold, width)
    c0 = tl.program_id(0) * BN
    cols = c0 + tl.arange(0, BN)
    dout = tl.program_id(1) * BDO + tl.arange(0, BDO)
    k = _resident(K, cols, N, D, BN, BK, KCH, PRECISION)
    spans = _anchors_to_mask(POS, SELF, RLAB, KLAB, cols, c0, M, N, HAS_POS, HAS_SELF, HAS_LAB,
                             BN)
    acc = tl.zeros((BN, BDO), dtype=tl.float32)
    tl.assume(M > 0)  # as in row_stats_dq: no zero-trip path, no serialised wgmma
    for r0 in range(0, M, BM):
        acc, _, _ = _column_block_grad(X, r0, cols, dout, k, spans, c0 + BN > N, acc, sizes,
                                       tau, (HAS_POS, HAS_SELF, HAS_LAB, TERM, DETACH),
                                       (BM, BN, BK, KCH, BDO), PRECISION)
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
    X = (A, K, POS, SELF, RLAB, KLAB, LSE, G_LSE, G_UL)
    sizes = (M, N, D)
    tau = (t_min, t_max, threshold, width)
    c0 = tl.program_id(0) * BN
    cols = c0 + tl.arange(0, BN)
    dout = tl.arange(0, BDO)
    k = _resident(K, cols, N, D, BN, BK, KCH, PRECISION)
    out_k = _out_operand(K, cols, dout, N, D, k, BK, KCH, BDO, PRECISION)
    spans = _anchors_to_mask(POS, SELF, RLAB, KLAB, cols, c0, M, N, HAS_POS, HAS_SELF, HAS_LAB,
                             BN)
    acc = tl.zeros((BN, BDO), dtype=tl.float32)
    tl.assume(M > 0)
    for r0 in range(0, M, BM):
        acc, rows, w_op = _column_block_grad(X, r0, cols, dout, k, spans, c0 + BN > N, acc,
                                             sizes, tau, (HAS_POS, HAS_SELF, HAS_LAB, TERM, DETACH),
                                             (BM, BN, BK, KCH, BDO), PRECISION)
        share = _dot(tl.trans(w_op), out_k, tl.zeros((BM, BDO), dtype=tl.float32), PRECISION)
        tl.atomic_add(GA32 + rows.to(tl.int64)[:, None] * D + dout[None, :], share,
                      mask=(rows[:, None] < M) & (dout[None, :] < D), sem="relaxed")
    _store_block(GK, cols, dout, N, D, acc)
