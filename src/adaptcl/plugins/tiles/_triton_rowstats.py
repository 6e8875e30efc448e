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

DySTreSS's temperature is ``t_min + (t_max - t_min) sin(pi y / 2)^2`` with ``y = s`` (cosine
shape) or the piecewise ramp's phase reduced to ``[-1, 1]``; ``sin(pi y / 2)^2 = w E(w)``,
``w = y^2``, with ``E`` a fitted polynomial of degree 5 (``_share``), and the reciprocal of the
temperature is the square of ``rsqrt`` (one ``MUFU.RSQ``). The term thus costs about 10
instructions per element on the FMA pipe plus one on the special-function pipe, which the GPU
runs at an eighth of the rate (16 per SM and clock on sm_80 / sm_90, against 128 fused
multiply-adds on sm_90): a ``MUFU.SIN`` for the sine would save four instructions and cost the
time of eight. One temperature per entry serves the logit and its slope (``_term_log2``).

Block sizes are constexprs chosen per GPU architecture from a fixed table (``_configs.py``);
nothing is autotuned unless ``tiling(autotune=True)`` asks.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton_common import (
    LN2,
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

# sin(pi sqrt(w) / 2)^2 / w = E0 + E1 w + ... + E5 w^5 on 0 <= w <= 1.0404 (|y| <= 1.02: the
# cosines and the products that round past 1), a minimax fit by iteratively reweighted least
# squares (``tests/plugins/test_term_polynomial.py`` refits it): error below 2.8e-8, so the
# temperature's relative error is float32's rounding, a few 1e-7
E0: tl.constexpr = tl.constexpr(2.467401072388052)
E1: tl.constexpr = tl.constexpr(-2.029354119417251)
E2: tl.constexpr = tl.constexpr(0.6676094146157767)
E3: tl.constexpr = tl.constexpr(-0.11757430547187109)
E4: tl.constexpr = tl.constexpr(0.012732160269007808)
E5: tl.constexpr = tl.constexpr(-0.0008142023594915545)
# adding and subtracting 1.5 * 2^24 rounds a float32 below 2^23 in magnitude to the nearest
# even integer (the spacing there is 2): two additions on the FMA pipe, no FRND
EVEN: tl.constexpr = tl.constexpr(25165824.0)


# --------------------------------------------------------------------------------------------
# The term: s -> logits
# --------------------------------------------------------------------------------------------


@triton.jit
def _horner5(x, c5, c4, c3, c2, c1, c0):
    """``c5 x^5 + ... + c0`` by Horner's rule: five multiply-adds (the coefficients are scalars
    of the program, computed once per tile)."""
    p = c5 * x + c4
    p = p * x + c3
    p = p * x + c2
    p = p * x + c1
    return p * x + c0


@triton.jit
def _phase(s, TERM: tl.constexpr, threshold, width):
    """``y`` in ``[-1, 1]`` whose ``sin(pi y / 2)^2`` is the temperature's share of
    ``max - min``, and ``dy / ds``."""
    if TERM == 1:  # 1/2 (1 + cos(pi (1 + s))) = sin(pi s / 2)^2
        y = s
        rate = 1.0
    else:  # 1/2 (1 + cos(pi x)) = sin(pi (x + 1) / 2)^2, x = (s - t) / w, of period 2 in x + 1
        rate = 1.0 / width  # one division per program, not per entry
        z = s * rate + (1.0 - threshold * rate)  # x + 1; |x + 1| < 2^23
        y = z - ((z + EVEN) - EVEN)
    return y, rate


@triton.jit
def _term_log2(s, TERM: tl.constexpr, DETACH: tl.constexpr, tau):
    """``(term(s) log2 e, term'(s) log2 e)``, the logits in the base-2 units the exponentials
    take and their slope in the same units: ``s log2 e`` for TERM 0 (its slope is 1, unused),
    else DySTreSS's ``s / tau(s)`` with the cosine (TERM 1) or piecewise (2) temperature and
    its slope (``1 / tau`` when tau is detached). ``log2 e`` is folded into the temperature
    (``ln 2 tau``, its coefficients scaled once per tile), so the units cost nothing per entry,
    and one temperature and one reciprocal per entry serve the logit and its slope."""
    if TERM == 0:
        x2 = s * LOG2E
        slope2 = s * 0.0 + 1.0
    else:
        t_min, t_max, threshold, width = tau
        span = (t_max - t_min) * LN2
        y, rate = _phase(s, TERM, threshold, width)
        w = y * y
        t = w * _horner5(w, span * E5, span * E4, span * E3, span * E2, span * E1,
                         span * E0) + t_min * LN2
        if TERM == 2:
            above = s > threshold
            t = tl.where(above, t_max * LN2, t)
        q = tl.math.rsqrt(t)  # MUFU.RSQ: log2 e / tau = q^2
        r = q * q
        x2 = s * r
        if DETACH:
            slope2 = r
        else:
            # d tau / d s = span (d/dy y^2 E(y^2)) dy/ds = 2 y rate span (E + w E'), and the
            # slope (tau - s tau') / tau^2 = r (1 - s tau' r) with r = 1 / tau; in base-2 units
            # r = q^2 ln 2, and the ln 2 of s tau' is in ``span``
            k = 2.0 * span * rate
            d = _horner5(w, (6.0 * E5) * k, (5.0 * E4) * k, (4.0 * E3) * k, (3.0 * E2) * k,
                         (2.0 * E1) * k, E0 * k)
            if TERM == 1:
                m = w * d  # s y = s^2
            else:
                m = (s * y) * d
            slope2 = r * (1.0 - m * r)
            if TERM == 2:
                slope2 = tl.where(above, r, slope2)
    return x2, slope2


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
        x2, _ = _term_log2(s, TERM, True, (t_min, t_max, threshold, width))
        if _slow(spans, c0, BN, c0 + BN > N):
            keep = _kept_here(POS, SELF, rows, cols, M, N, HAS_POS, HAS_SELF, False)
            x2 = tl.where(keep, x2, float("-inf"))
            if HAS_LAB:  # the kept columns are those with a finite logit now
                same = (x2 != float("-inf")) & _same_class(RLAB, KLAB, rows, cols, M, N, False)
                # the logits: s itself without a term, else in base 2 (ln 2 at the end)
                sum_ul += tl.sum(tl.where(same, s if TERM == 0 else x2, 0.0), axis=1)
                sum_u += tl.sum(tl.where(same, 1.0, 0.0), axis=1)
        m2, total = _online_lse2(m2, total, x2)
    ok = rows < M
    tl.store(LSE + rows, _finish_lse2(m2, total), mask=ok)
    if HAS_LAB:
        tl.store(SUM_UL + rows, sum_ul if TERM == 0 else sum_ul * LN2, mask=ok)
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
    x2, slope2 = _term_log2(s, TERM, DETACH, tau)
    if TERM != 0:  # the slope is in base-2 units: ln 2 on the row's upstream gradients
        g = g * LN2
    w = tl.exp2(x2 - _per_row(lse2, T)) * _per_row(g, T)
    if slow:
        keep = _kept_here(POS, SELF, rows, cols, M, N, HAS_POS, HAS_SELF, T)
        w = tl.where(keep, w, 0.0)
        if HAS_LAB:
            g_ul = tl.load(G_UL + rows, mask=rows < M, other=0.0)
            if TERM != 0:
                g_ul = g_ul * LN2
            same = keep & _same_class(RLAB, KLAB, rows, cols, M, N, T)
            w += tl.where(same, _per_row(g_ul, T), 0.0)
    if TERM != 0:
        w = w * slope2
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
