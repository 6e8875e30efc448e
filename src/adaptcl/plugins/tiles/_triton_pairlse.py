"""Triton kernels of AMCL's streamed pair log-sum-exp, imported by
:mod:`adaptcl.plugins.tiles` on first use only.

Per tile of anchors x columns they form two bilinear forms, ``s = a @ k.T`` (the cosines) and
``r = pa @ pk.T`` (the temperature network's features), the pair temperature
``tau = squash(r)`` (``scale sigmoid(-clamp(r)) + floor``, or a constant: ``SQUASH=0`` forms no
``r`` at all) and the term ``s / tau - beta Omega(tau)``, ``Omega(tau) = (dim / 2) log tau +
1 / tau``:

* ``pair_lse_fwd`` keeps the online log-sum-exp (base 2, as ``_triton_rowstats``) of the term
  over the unmasked columns and the sum of ``tau`` over every pair (AMCL's monitored mean
  temperature);
* ``pair_lse_dq`` (per anchor block) and ``pair_lse_dk`` (per column block) recompute each tile
  and accumulate the gradients of their side: the cosine side (``dA`` / ``dK``, weights
  ``W / tau``) and the temperature side (``dPA`` / ``dPK``, weights
  ``W d term / d tau  squash'(r)``).

How they are shaped for the hardware (ptxas' report and the SASS of ``triton.compile``'s
cubin say so on a CPU, ``tests/plugins/test_kernel_compile.py``; ``docs/large_batches.md``
gives the numbers):

* **one warpgroup per 64 rows of a backward tile** (up to ``_configs.PAIR_SPLIT_WIDEST``
  features). Triton gives a chained product (the tile
  ``s``, then ``W @ K``) all its warps along the rows, 16 rows each, so a backward program has
  ``16 x warps`` rows in its tile (``_configs._pair_rule``): 64 rows on 4 warps, never 64 rows
  on 8 warps (both warpgroups would compute the same rows). ``pair_lse_dk``'s own block is the
  transposed tile's row block, so it is 64 too: ``wgmma`` on sm_90, not ``mma.sync``;
* **the backward's outputs by side.** A program keeps both sides' float32 accumulators where
  they fit its registers (``_configs.pair_outputs``: D + P up to 256 columns on bf16 / fp16,
  255 registers a thread at D = P = 128); wider features give each program one output block
  of one side (``program_id(1)``, :func:`backward_parts`), each recomputing its tiles, up to
  ``_configs.PAIR_SPLIT_WIDEST`` features (sm_90: 256). Beyond it a 64-row tile cannot hold
  the accumulators and the split would recompute each tile for 8 blocks: one program keeps
  every output on 32-row blocks of 8 warps (``mma.sync``), as before this layout;
* **the temperature with one exp and one reciprocal per pair.** With ``x = clamp(r)``,
  ``e = exp(-|x|)`` (never overflows), ``u = 1 + e``, ``v = tau u = scale (e if x >= 0 else
  1) + floor u`` and ``q = 1 / (u v)``: ``tau = v^2 q``, ``1 / tau = u^2 q``, and the slope's
  ``sigmoid'(x) / tau = e q``. Every exp is ``exp2`` (``ex2.approx.ftz``; ``tl.sigmoid``'s is
  not ftz); the reciprocal and ``log2`` are ``rcp.approx.ftz`` / ``lg2.approx.ftz`` (one MUFU
  instruction each: 1 ulp, 2^-22 absolute; :func:`_rcp`, :func:`_log2`; ``tl.log2`` compiles
  to a software routine), exact under the interpreter. So four MUFU operations per pair in every
  pass, where InfoNCE has one: the term's exp, reciprocal and log, and the pass's exp.
  ``SQUASH=0`` folds its constant temperature into one multiply-add per pair (one MUFU);
* the column mask, and the forward's count of ``tau`` over existing columns, only in the blocks
  that hold an excluded or a missing column; an anchor block tests a column block against
  the span of its rows' excluded columns (:func:`_spans`, read once per program), not by a
  reduction over its rows per tile;
* the helpers take their arguments grouped: ``ops`` (the four operands), ``dims`` (their sizes),
  ``term`` (the term's scalars), ``cfg`` (the kernel's constexprs).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton_common import (
    INTERPRET,
    LOG2E,
    _accumulate,
    _finish_lse2,
    _gram,
    _kept,
    _needs_mask,
    _online_lse2,
    _per_row,
    _resident,
    _row_masks,
    _row_state,
    _store_block,
)

#: above any column index (an empty span's lowest column)
N_MAX: tl.constexpr = tl.constexpr(2**31 - 1)


@triton.constexpr_function
def backward_parts(squash: int, width: int, pair_width: int, out: int, pair_out: int) -> int:
    """The backward's programs per row block (``program_id(1)``) for padded feature widths
    ``width`` / ``pair_width`` and output blocks ``out`` / ``pair_out`` (the launch's choice,
    ``_configs.pair_outputs``): 1 where the blocks are the whole widths (one program keeps
    both sides' accumulators; ``SQUASH=0`` has the cosine side only), else one program per
    output block of each side, cosine blocks first. The launch's grid and the kernels read
    this one rule.

    >>> backward_parts(1, 128, 128, 128, 128), backward_parts(1, 256, 256, 128, 128)
    (1, 4)
    """
    parts = width // out
    if squash != 0:
        parts = 1 if parts == 1 and pair_width == pair_out else parts + pair_width // pair_out
    return parts


# --------------------------------------------------------------------------------------------
# The term, per pair
# --------------------------------------------------------------------------------------------


@triton.jit
def _rcp(x):
    """``1 / x``: ``rcp.approx.ftz.f32`` (one MUFU.RCP) on the GPU, exact under the
    interpreter (which runs no inline assembly)."""
    if INTERPRET:
        y = 1.0 / x
    else:
        y = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x],
                                      dtype=tl.float32, is_pure=True, pack=1)
    return y


@triton.jit
def _log2(x):
    """``log2 x``: ``lg2.approx.ftz.f32`` (one MUFU.LG2; ``tl.log2`` compiles to a software
    routine) on the GPU, exact under the interpreter."""
    if INTERPRET:
        y = tl.log2(x)
    else:
        y = tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=f,f", [x],
                                      dtype=tl.float32, is_pure=True, pack=1)
    return y


@triton.jit
def _sigmoid_temperature(r, t0, t1, t2):
    """``tau = t0 sigmoid(-clamp(r, -t2, t2)) + t1`` of pairs with features product ``r``,
    ``1 / tau``, and ``sigmoid'(x) / tau`` (0 where the clamp holds ``r``): one exp and one
    reciprocal (the module docstring says how). ``exp(-|clamp(r)|)`` is
    ``max(exp(-|r|), exp(-t2))``: one compare, not two."""
    e_r = tl.exp2(-tl.abs(r) * LOG2E)
    e_bound = tl.exp2(-t2 * LOG2E)
    e = tl.maximum(e_r, e_bound)
    u = 1.0 + e
    v = t0 * tl.where(r >= 0.0, e, 1.0) + t1 * u
    q = _rcp(u * v)
    slope = tl.where(e_r >= e_bound, e * q, 0.0)
    return v * v * q, u * u * q, slope


@triton.jit
def _pair_logits2(s, r, term, SQUASH: tl.constexpr):
    """The term ``s / tau - beta Omega(tau)`` in log2 units; ``tau``; ``1 / tau``; and
    ``(s - beta) / tau`` and ``sigmoid' / tau`` for the backward (``SQUASH=0``: the constant
    temperature's affine map of ``s``, the rest scalars)."""
    beta, half_dim, t0, t1, t2 = term
    if SQUASH == 0:
        inv = 1.0 / t0
        x2 = s * (inv * LOG2E) - (beta * inv * LOG2E + beta * half_dim * tl.log2(t0))
        tau, y, slope = t0, s, t0
    else:
        tau, inv, slope = _sigmoid_temperature(r, t0, t1, t2)
        y = (s - beta) * inv
        x2 = y * LOG2E + (beta * half_dim) * _log2(inv)  # log2 of 1 / tau: no tau in a backward
    return x2, tau, inv, y, slope


# --------------------------------------------------------------------------------------------
# Operands and tiles
# --------------------------------------------------------------------------------------------


@triton.jit
def _pair_resident(ops, dims, start, SIDE: tl.constexpr, B: tl.constexpr, cfg,
                   PRECISION: tl.constexpr):
    """``_resident``'s blocks of the ``B`` rows from ``start`` of the anchors' (``SIDE=0``) or
    the columns' (1) two operands (the features' a zero block where ``SQUASH=0`` forms no
    ``r``)."""
    SQUASH: tl.constexpr = cfg[2]
    BK: tl.constexpr = cfg[5]
    KCH: tl.constexpr = cfg[6]
    BP: tl.constexpr = cfg[7]
    PCH: tl.constexpr = cfg[8]
    X = ops[SIDE]
    PX = ops[2 + SIDE]
    n = dims[SIDE]
    idx = start + tl.arange(0, B)
    x = _resident(X, idx, n, dims[2], B, BK, KCH, PRECISION)
    px = tl.zeros((B, BP), dtype=PX.dtype.element_ty)
    if SQUASH != 0:
        px = _resident(PX, idx, n, dims[3], B, BP, PCH, PRECISION)
    return x, px


@triton.jit
def _pair_grams(ops, dims, rows, cols, blocks, cfg, PRECISION: tl.constexpr, T: tl.constexpr):
    """``s`` and ``r`` (0 for ``SQUASH=0``) of the tile ``rows x cols``, or with ``T`` of the
    transposed tile ``cols x rows`` (``blocks``: the resident ``a, k, pa, pk``)."""
    A, K, PA, PK = ops
    M, N, D, P = dims
    a, k, pa, pk = blocks
    SQUASH: tl.constexpr = cfg[2]
    BM: tl.constexpr = cfg[3]
    BN: tl.constexpr = cfg[4]
    BK: tl.constexpr = cfg[5]
    KCH: tl.constexpr = cfg[6]
    BP: tl.constexpr = cfg[7]
    PCH: tl.constexpr = cfg[8]
    if T:
        s = _gram(K, A, cols, rows, N, M, D, k, a, BN, BM, BK, KCH, PRECISION)
    else:
        s = _gram(A, K, rows, cols, M, N, D, a, k, BM, BN, BK, KCH, PRECISION)
    r = s
    if SQUASH != 0:
        if T:
            r = _gram(PK, PA, cols, rows, N, M, P, pk, pa, BN, BM, BP, PCH, PRECISION)
        else:
            r = _gram(PA, PK, rows, cols, M, N, P, pa, pk, BM, BN, BP, PCH, PRECISION)
    return s, r


@triton.jit
def _masked(x, fill, needs, mask_ptrs, rows, cols, dims, cfg, T: tl.constexpr):
    """``x`` with ``fill`` on the excluded and missing columns where ``needs`` (the column
    block holds one; every other block skips the compares). The rows' excluded columns are
    read here, from ``mask_ptrs`` (``POS, SELF``): no tile keeps them in registers."""
    POS, SELF = mask_ptrs
    M, N, D, P = dims
    HAS_POS: tl.constexpr = cfg[0]
    HAS_SELF: tl.constexpr = cfg[1]
    if needs:
        pos, own = _row_masks(POS, SELF, rows, M, HAS_POS, HAS_SELF)
        x = tl.where(_kept(cols, pos, own, N, HAS_POS, HAS_SELF, T), x, fill)
    return x


@triton.jit
def _spans(masks):
    """The lowest and highest excluded column of an anchor block's rows, per mask (none:
    an empty span), read once per program: :func:`_in_spans` then tests a column block with
    four scalar compares where ``_needs_mask`` reduces over the block's rows in every tile."""
    pos, own = masks  # column indices: int32 (``N`` is)
    pos, own = pos.to(tl.int32), own.to(tl.int32)
    return ((tl.min(tl.where(pos >= 0, pos, N_MAX)), tl.max(pos)),
            (tl.min(tl.where(own >= 0, own, N_MAX)), tl.max(own)))


@triton.jit
def _in_spans(spans, c0, N, cfg):
    """Whether the column block from ``c0`` may hold an excluded column of the block's rows (a
    span overlaps it) or runs past the last column."""
    HAS_POS: tl.constexpr = cfg[0]
    HAS_SELF: tl.constexpr = cfg[1]
    BN: tl.constexpr = cfg[4]
    (pos_lo, pos_hi), (own_lo, own_hi) = spans
    needs = c0 + BN > N
    if HAS_POS:
        needs = needs | ((pos_hi >= c0) & (pos_lo < c0 + BN))
    if HAS_SELF:
        needs = needs | ((own_hi >= c0) & (own_lo < c0 + BN))
    return needs


# --------------------------------------------------------------------------------------------
# The forward
# --------------------------------------------------------------------------------------------


@triton.jit
def pair_lse_fwd(A, K, PA, PK, POS, SELF, LSE, TAU_SUM, M, N, D, P, beta, half_dim, t0, t1, t2,
                 HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr, SQUASH: tl.constexpr,
                 PRECISION: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, KCH: tl.constexpr, BP: tl.constexpr, PCH: tl.constexpr):
    """Per anchor block: the log-sum-exp of the term over the kept columns and the sum of
    ``tau`` over every column (``SQUASH=0``: ``N t0``)."""
    cfg: tl.constexpr = (HAS_POS, HAS_SELF, SQUASH, BM, BN, BK, KCH, BP, PCH)
    ops, dims, term = (A, K, PA, PK), (M, N, D, P), (beta, half_dim, t0, t1, t2)
    r0 = tl.program_id(0) * BM
    rows = r0 + tl.arange(0, BM)
    a, pa = _pair_resident(ops, dims, r0, 0, BM, cfg, PRECISION)
    spans = _spans(_row_masks(POS, SELF, rows, M, HAS_POS, HAS_SELF))
    m2 = tl.full((BM,), float("-inf"), dtype=tl.float32)
    total = tl.zeros((BM,), dtype=tl.float32)
    tau_sum = tl.zeros((BM,), dtype=tl.float32)
    for c0 in range(0, N, BN):
        cols = c0 + tl.arange(0, BN)
        k, pk = _pair_resident(ops, dims, c0, 1, BN, cfg, PRECISION)
        s, r = _pair_grams(ops, dims, rows, cols, (a, k, pa, pk), cfg, PRECISION, False)
        x2, tau, _, _, _ = _pair_logits2(s, r, term, SQUASH)
        x2 = _masked(x2, float("-inf"), _in_spans(spans, c0, N, cfg), (POS, SELF), rows, cols,
                     dims, cfg, False)
        if SQUASH != 0:
            if c0 + BN > N:
                tau = tl.where(cols[None, :] < N, tau, 0.0)
            tau_sum += tl.sum(tau, axis=1)
        m2, total = _online_lse2(m2, total, x2)
    if SQUASH == 0:
        tau_sum += N * t0
    tl.store(LSE + rows, _finish_lse2(m2, total), mask=rows < M)
    tl.store(TAU_SUM + rows, tau_sum, mask=rows < M)


# --------------------------------------------------------------------------------------------
# The backward: one tile's step, a program's sweep, the two kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _pair_tile_grads(ops, dims, rows, cols, blocks, state, needs, term, accs, outs, cfg,
                     PRECISION: tl.constexpr, SIDE: tl.constexpr, T: tl.constexpr):
    """One recomputed tile of anchors ``rows`` x columns ``cols`` into the accumulators of a
    side (``SIDE``: 0 both, 1 the cosines', 2 the temperature's): ``acc + W_s @ K[cols]`` and
    ``acc_p + W_r @ PK[cols]`` (the anchors'), or with ``T`` the transposed tile and
    ``W_s.T @ A[rows]``, ``W_r.T @ PA[rows]`` (the columns'), over the output features
    ``outs``; the rows' ``state`` is ``(POS, SELF)`` and their ``lse2``, ``g``; ``needs``:
    whether to mask."""
    A, K, PA, PK = ops
    M, N, D, P = dims
    a, k, pa, pk = blocks
    mask_ptrs, lse2, g = state
    acc, acc_p = accs
    dout, pout = outs
    SQUASH: tl.constexpr = cfg[2]
    BK: tl.constexpr = cfg[5]
    KCH: tl.constexpr = cfg[6]
    BP: tl.constexpr = cfg[7]
    PCH: tl.constexpr = cfg[8]
    BDO: tl.constexpr = dout.shape[0]
    BPO: tl.constexpr = pout.shape[0]
    s, r = _pair_grams(ops, dims, rows, cols, blocks, cfg, PRECISION, T)
    x2, _, inv, y, slope = _pair_logits2(s, r, term, SQUASH)
    p = _masked(tl.exp2(x2 - _per_row(lse2, T)), 0.0, needs, mask_ptrs, rows, cols, dims, cfg,
                T)
    if SQUASH == 0:  # 1 / tau a scalar: into the rows' upstream gradient
        w = p
        w_s = p * _per_row(g * inv, T)
    else:
        w = p * _per_row(g, T)
        w_s = w * inv
    if SIDE != 2:
        if T:
            acc, _ = _accumulate(acc, w_s, A, rows, dout, M, D, a, BK, KCH, BDO, PRECISION)
        else:
            acc, _ = _accumulate(acc, w_s, K, cols, dout, N, D, k, BK, KCH, BDO, PRECISION)
    if SQUASH != 0 and SIDE != 1:
        # d term / d tau = -((s - beta) / tau + beta dim / 2) / tau; d tau / d r = -t0 sigmoid'
        beta, half_dim, t0, t1, t2 = term
        w_r = w * (t0 * (y + beta * half_dim)) * slope
        if T:
            acc_p, _ = _accumulate(acc_p, w_r, PA, rows, pout, M, P, pa, BP, PCH, BPO,
                                   PRECISION)
        else:
            acc_p, _ = _accumulate(acc_p, w_r, PK, cols, pout, N, P, pk, BP, PCH, BPO,
                                   PRECISION)
    return acc, acc_p


@triton.jit
def _store_sides(grads, idx, n, dims, outs, accs, SIDE: tl.constexpr):
    """A sweep's accumulators of ``SIDE`` into the rows ``idx`` (of ``n``) of its gradients
    (``grads``: the cosine side's, the temperature side's), output features ``outs``."""
    if SIDE != 2:
        _store_block(grads[0], idx, outs[0], n, dims[2], accs[0])
    if SIDE != 1:
        _store_block(grads[1], idx, outs[1], n, dims[3], accs[1])


@triton.jit
def _dq_sweep(ops, dims, r0, row_ptrs, term, outs, grads, cfg, PRECISION: tl.constexpr,
              SIDE: tl.constexpr):
    """The anchor block from ``r0`` over every column block into the accumulators of
    ``SIDE`` (output features ``outs``), stored into ``grads`` (``GA, GPA``) at the end."""
    M, N, D, P = dims
    POS, SELF, LSE, G = row_ptrs
    HAS_POS: tl.constexpr = cfg[0]
    HAS_SELF: tl.constexpr = cfg[1]
    BM: tl.constexpr = cfg[3]
    BN: tl.constexpr = cfg[4]
    rows = r0 + tl.arange(0, BM)
    a, pa = _pair_resident(ops, dims, r0, 0, BM, cfg, PRECISION)
    pos, own, lse2, g = _row_state(POS, SELF, LSE, G, rows, M, HAS_POS, HAS_SELF)
    spans = _spans((pos, own))
    acc = tl.zeros((BM, outs[0].shape[0]), dtype=tl.float32)
    acc_p = tl.zeros((BM, outs[1].shape[0]), dtype=tl.float32)
    for c0 in range(0, N, BN):
        cols = c0 + tl.arange(0, BN)
        k, pk = _pair_resident(ops, dims, c0, 1, BN, cfg, PRECISION)
        acc, acc_p = _pair_tile_grads(ops, dims, rows, cols, (a, k, pa, pk),
                                      ((POS, SELF), lse2, g), _in_spans(spans, c0, N, cfg),
                                      term, (acc, acc_p), outs, cfg, PRECISION, SIDE, False)
    _store_sides(grads, rows, M, dims, outs, (acc, acc_p), SIDE)


@triton.jit
def _dk_sweep(ops, dims, c0, row_ptrs, term, outs, grads, cfg, PRECISION: tl.constexpr,
              SIDE: tl.constexpr):
    """The column block from ``c0`` over every anchor block (transposed tiles) into the
    accumulators of ``SIDE``, stored into ``grads`` (``GK, GPK``) at the end."""
    M, N, D, P = dims
    POS, SELF, LSE, G = row_ptrs
    HAS_POS: tl.constexpr = cfg[0]
    HAS_SELF: tl.constexpr = cfg[1]
    BM: tl.constexpr = cfg[3]
    BN: tl.constexpr = cfg[4]
    cols = c0 + tl.arange(0, BN)
    k, pk = _pair_resident(ops, dims, c0, 1, BN, cfg, PRECISION)
    acc = tl.zeros((BN, outs[0].shape[0]), dtype=tl.float32)
    acc_p = tl.zeros((BN, outs[1].shape[0]), dtype=tl.float32)
    for r0 in range(0, M, BM):
        rows = r0 + tl.arange(0, BM)
        pos, own, lse2, g = _row_state(POS, SELF, LSE, G, rows, M, HAS_POS, HAS_SELF)
        a, pa = _pair_resident(ops, dims, r0, 0, BM, cfg, PRECISION)
        needs = _needs_mask(pos, own, c0, N, BN, HAS_POS, HAS_SELF)
        acc, acc_p = _pair_tile_grads(ops, dims, rows, cols, (a, k, pa, pk),
                                      ((POS, SELF), lse2, g), needs, term, (acc, acc_p), outs,
                                      cfg, PRECISION, SIDE, True)
    _store_sides(grads, cols, N, dims, outs, (acc, acc_p), SIDE)


@triton.jit
def _part_outputs(cfg, BDO: tl.constexpr, BPO: tl.constexpr):
    """Where the backward's outputs are split (:func:`backward_parts`), ``program_id(1)``'s
    block: whether it is the cosine side's (cosine blocks first) and its output features on
    each side (the other side's unused)."""
    BK: tl.constexpr = cfg[5]
    KCH: tl.constexpr = cfg[6]
    COSINE_PARTS: tl.constexpr = KCH * BK // BDO
    part = tl.program_id(1)
    cosine = part < COSINE_PARTS
    d0 = tl.where(cosine, part, 0) * BDO
    p0 = tl.where(cosine, 0, part - COSINE_PARTS) * BPO
    return cosine, (d0 + tl.arange(0, BDO), p0 + tl.arange(0, BPO))


@triton.jit
def _backward(sweep: tl.constexpr, args, grads, cfg, PRECISION: tl.constexpr, BDO: tl.constexpr,
              BPO: tl.constexpr):
    """``sweep`` (:func:`_dq_sweep` or :func:`_dk_sweep`) over this program's outputs: both
    sides whole in one program, or ``program_id(1)``'s output block of one side
    (:func:`backward_parts`)."""
    SQUASH: tl.constexpr = cfg[2]
    BK: tl.constexpr = cfg[5]
    KCH: tl.constexpr = cfg[6]
    BP: tl.constexpr = cfg[7]
    PCH: tl.constexpr = cfg[8]
    if backward_parts(SQUASH, KCH * BK, PCH * BP, BDO, BPO) == 1:  # one program, every output
        sweep(*args, (tl.arange(0, BDO), tl.arange(0, BPO)), grads, cfg, PRECISION, 1 - SQUASH)
    else:
        cosine, outs = _part_outputs(cfg, BDO, BPO)
        if SQUASH == 0:
            sweep(*args, outs, grads, cfg, PRECISION, 1)
        elif cosine:
            sweep(*args, outs, grads, cfg, PRECISION, 1)
        else:
            sweep(*args, outs, grads, cfg, PRECISION, 2)


@triton.jit
def pair_lse_dq(A, K, PA, PK, POS, SELF, LSE, G, GA, GPA, M, N, D, P, beta, half_dim,
                t0, t1, t2, HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr,
                SQUASH: tl.constexpr, PRECISION: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, KCH: tl.constexpr, BP: tl.constexpr,
                PCH: tl.constexpr, BDO: tl.constexpr, BPO: tl.constexpr):
    """``dA = W_s @ K`` and ``dPA = W_r @ PK`` of one anchor block, both in one program or one
    output block of one side per ``program_id(1)`` (:func:`backward_parts`)."""
    cfg: tl.constexpr = (HAS_POS, HAS_SELF, SQUASH, BM, BN, BK, KCH, BP, PCH)
    _backward(_dq_sweep, ((A, K, PA, PK), (M, N, D, P), tl.program_id(0) * BM,
                          (POS, SELF, LSE, G), (beta, half_dim, t0, t1, t2)),
              (GA, GPA), cfg, PRECISION, BDO, BPO)


@triton.jit
def pair_lse_dk(A, K, PA, PK, POS, SELF, LSE, G, GK, GPK, M, N, D, P, beta, half_dim,
                t0, t1, t2, HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr,
                SQUASH: tl.constexpr, PRECISION: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, KCH: tl.constexpr, BP: tl.constexpr,
                PCH: tl.constexpr, BDO: tl.constexpr, BPO: tl.constexpr):
    """``dK = W_s.T @ A`` and ``dPK = W_r.T @ PA`` of one column block (transposed tiles),
    split as :func:`pair_lse_dq`."""
    cfg: tl.constexpr = (HAS_POS, HAS_SELF, SQUASH, BM, BN, BK, KCH, BP, PCH)
    _backward(_dk_sweep, ((A, K, PA, PK), (M, N, D, P), tl.program_id(0) * BN,
                          (POS, SELF, LSE, G), (beta, half_dim, t0, t1, t2)),
              (GK, GPK), cfg, PRECISION, BDO, BPO)
