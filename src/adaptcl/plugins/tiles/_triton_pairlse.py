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
  once and accumulate both gradients of their side at once: the cosine side (``dA`` / ``dK``,
  weights ``W / tau``) and the temperature side (``dPA`` / ``dPK``, weights
  ``W d term / d tau  squash'(r)``). Two backward launches of four products per tile, where
  one launch per gradient recomputed each tile four times.

The accumulators span the whole (padded) feature widths, so both stay below 1,024 features
(``_fused.pair_unsupported`` says so otherwise).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton_common import (
    LN2,
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


@triton.jit
def _squash(r, SQUASH: tl.constexpr, t0, t1, t2):
    """``tau`` of pairs with features product ``r``: ``t0`` (SQUASH 0) or
    ``t0 sigmoid(-clamp(r, -t2, t2)) + t1`` (1)."""
    if SQUASH == 0:
        tau = r * 0.0 + t0
    else:
        tau = t0 * tl.sigmoid(-tl.minimum(tl.maximum(r, -t2), t2)) + t1
    return tau


@triton.jit
def _squash_grad(r, t0, t2):
    """``d tau / d r`` of the sigmoid squash (0 where the clamp holds ``r``)."""
    sig = tl.sigmoid(-tl.minimum(tl.maximum(r, -t2), t2))
    return tl.where((r >= -t2) & (r <= t2), sig * (1.0 - sig) * (-t0), 0.0)


@triton.jit
def _pair_resident(X, PX, idx, n, D, P, SQUASH: tl.constexpr, B: tl.constexpr,
                   BK: tl.constexpr, KCH: tl.constexpr, BP: tl.constexpr, PCH: tl.constexpr,
                   PRECISION: tl.constexpr):
    """``_resident``'s blocks of the rows ``idx`` of ``X`` and of ``PX`` (zeros where
    ``SQUASH=0`` forms no ``r``)."""
    x = _resident(X, idx, n, D, B, BK, KCH, PRECISION)
    px = tl.zeros((B, BP), dtype=PX.dtype.element_ty)
    if SQUASH != 0:
        px = _resident(PX, idx, n, P, B, BP, PCH, PRECISION)
    return x, px


@triton.jit
def _pair_tile(A, K, PA, PK, xi, yi, nx, ny, D, P, x_res, y_res, px_res, py_res,
               t0, t1, t2, SQUASH: tl.constexpr, BX: tl.constexpr, BY: tl.constexpr,
               BK: tl.constexpr, KCH: tl.constexpr, BP: tl.constexpr, PCH: tl.constexpr,
               PRECISION: tl.constexpr):
    """``(s, r, tau)`` of one tile ``X[xi]`` against ``Y[yi]`` (``r`` is 0 for SQUASH 0)."""
    s = _gram(A, K, xi, yi, nx, ny, D, x_res, y_res, BX, BY, BK, KCH, PRECISION)
    r = s * 0.0
    if SQUASH != 0:
        r = _gram(PA, PK, xi, yi, nx, ny, P, px_res, py_res, BX, BY, BP, PCH, PRECISION)
    return s, r, _squash(r, SQUASH, t0, t1, t2)


@triton.jit
def _pair_term2(s, tau, beta, half_dim):
    """The term ``s / tau - beta Omega(tau)`` in log2 units, and ``1 / tau``."""
    inv = tl.fdiv(tau * 0.0 + 1.0, tau)
    term = s * inv - beta * (half_dim * LN2 * tl.log2(tau) + inv)
    return term * LOG2E, inv


@triton.jit
def pair_lse_fwd(A, K, PA, PK, POS, SELF, LSE, TAU_SUM, M, N, D, P, beta, half_dim, t0, t1, t2,
                 HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr, SQUASH: tl.constexpr,
                 PRECISION: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, KCH: tl.constexpr, BP: tl.constexpr, PCH: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    a, pa = _pair_resident(A, PA, rows, M, D, P, SQUASH, BM, BK, KCH, BP, PCH, PRECISION)
    pos, own = _row_masks(POS, SELF, rows, M, HAS_POS, HAS_SELF)
    m2 = tl.full((BM,), float("-inf"), dtype=tl.float32)
    total = tl.zeros((BM,), dtype=tl.float32)
    tau_sum = tl.zeros((BM,), dtype=tl.float32)
    for c0 in range(0, N, BN):
        cols = c0 + tl.arange(0, BN)
        k, pk = _pair_resident(K, PK, cols, N, D, P, SQUASH, BN, BK, KCH, BP, PCH, PRECISION)
        s, r, tau = _pair_tile(A, K, PA, PK, rows, cols, M, N, D, P, a, k, pa, pk, t0, t1, t2,
                               SQUASH, BM, BN, BK, KCH, BP, PCH, PRECISION)
        inside = (rows[:, None] < M) & (cols[None, :] < N)
        tau_sum += tl.sum(tl.where(inside, tau, 0.0), axis=1)
        x2, _ = _pair_term2(s, tau, beta, half_dim)
        if _needs_mask(pos, own, c0, N, BN, HAS_POS, HAS_SELF):
            x2 = tl.where(_kept(cols, pos, own, N, HAS_POS, HAS_SELF, False), x2,
                          float("-inf"))
        m2, total = _online_lse2(m2, total, x2)
    tl.store(LSE + rows, _finish_lse2(m2, total), mask=rows < M)
    tl.store(TAU_SUM + rows, tau_sum, mask=rows < M)


@triton.jit
def _pair_weights(s, r, tau, cols, N, pos, own, lse2, g, c0, beta, half_dim, t0, t2,
                  HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr, SQUASH: tl.constexpr,
                  BN: tl.constexpr, T: tl.constexpr):
    """``(d loss / d s, d loss / d r)`` of one recomputed tile (``[cols, rows]`` if ``T``)."""
    x2, inv = _pair_term2(s, tau, beta, half_dim)
    p = tl.exp2(x2 - _per_row(lse2, T))
    if _needs_mask(pos, own, c0, N, BN, HAS_POS, HAS_SELF):
        p = tl.where(_kept(cols, pos, own, N, HAS_POS, HAS_SELF, T), p, 0.0)
    w = p * _per_row(g, T)
    g_r = w * 0.0
    if SQUASH != 0:  # d term / d tau = -s / tau^2 - beta (dim / (2 tau) - 1 / tau^2)
        d_tau = -s * inv * inv - beta * (half_dim * inv - inv * inv)
        g_r = w * d_tau * _squash_grad(r, t0, t2)
    return w * inv, g_r


@triton.jit
def _pair_tile_grads(A, K, PA, PK, rows, cols, c0, dout, pout, a, k, pa, pk, acc, acc_p, pos,
                     own, lse2, g, M, N, D, P, beta, half_dim, t0, t1, t2,
                     HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr, SQUASH: tl.constexpr,
                     PRECISION: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                     BK: tl.constexpr, KCH: tl.constexpr, BP: tl.constexpr, PCH: tl.constexpr,
                     BDO: tl.constexpr, BPO: tl.constexpr, T: tl.constexpr):
    """One recomputed tile of anchors ``rows`` x columns ``cols`` into both accumulators of a
    side: ``acc + W_s @ K[cols]`` and ``acc_p + W_r @ PK[cols]`` (the anchors'), or with ``T``
    the transposed tile and ``W_s.T @ A[rows]``, ``W_r.T @ PA[rows]`` (the columns')."""
    if T:
        s, r, tau = _pair_tile(K, A, PK, PA, cols, rows, N, M, D, P, k, a, pk, pa, t0, t1, t2,
                               SQUASH, BN, BM, BK, KCH, BP, PCH, PRECISION)
    else:
        s, r, tau = _pair_tile(A, K, PA, PK, rows, cols, M, N, D, P, a, k, pa, pk, t0, t1, t2,
                               SQUASH, BM, BN, BK, KCH, BP, PCH, PRECISION)
    g_s, g_r = _pair_weights(s, r, tau, cols, N, pos, own, lse2, g, c0, beta, half_dim, t0, t2,
                             HAS_POS, HAS_SELF, SQUASH, BN, T)
    if T:
        acc, _ = _accumulate(acc, g_s, A, rows, dout, M, D, a, BK, KCH, BDO, PRECISION)
        if SQUASH != 0:
            acc_p, _ = _accumulate(acc_p, g_r, PA, rows, pout, M, P, pa, BP, PCH, BPO,
                                   PRECISION)
    else:
        acc, _ = _accumulate(acc, g_s, K, cols, dout, N, D, k, BK, KCH, BDO, PRECISION)
        if SQUASH != 0:
            acc_p, _ = _accumulate(acc_p, g_r, PK, cols, pout, N, P, pk, BP, PCH, BPO,
                                   PRECISION)
    return acc, acc_p


@triton.jit
def pair_lse_dq(A, K, PA, PK, POS, SELF, LSE, G, GA, GPA, M, N, D, P, beta, half_dim,
                t0, t1, t2, HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr,
                SQUASH: tl.constexpr, PRECISION: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, KCH: tl.constexpr, BP: tl.constexpr,
                PCH: tl.constexpr, BDO: tl.constexpr, BPO: tl.constexpr):
    """``dA = W_s @ K`` and ``dPA = W_r @ PK`` of one anchor block."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    dout, pout = tl.arange(0, BDO), tl.arange(0, BPO)
    a, pa = _pair_resident(A, PA, rows, M, D, P, SQUASH, BM, BK, KCH, BP, PCH, PRECISION)
    pos, own, lse2, g = _row_state(POS, SELF, LSE, G, rows, M, HAS_POS, HAS_SELF)
    acc_a = tl.zeros((BM, BDO), dtype=tl.float32)
    acc_p = tl.zeros((BM, BPO), dtype=tl.float32)
    for c0 in range(0, N, BN):
        cols = c0 + tl.arange(0, BN)
        k, pk = _pair_resident(K, PK, cols, N, D, P, SQUASH, BN, BK, KCH, BP, PCH, PRECISION)
        acc_a, acc_p = _pair_tile_grads(A, K, PA, PK, rows, cols, c0, dout, pout, a, k, pa, pk,
                                        acc_a, acc_p, pos, own, lse2, g, M, N, D, P, beta,
                                        half_dim, t0, t1, t2, HAS_POS, HAS_SELF, SQUASH,
                                        PRECISION, BM, BN, BK, KCH, BP, PCH, BDO, BPO, False)
    _store_block(GA, rows, dout, M, D, acc_a)
    _store_block(GPA, rows, pout, M, P, acc_p)


@triton.jit
def pair_lse_dk(A, K, PA, PK, POS, SELF, LSE, G, GK, GPK, M, N, D, P, beta, half_dim,
                t0, t1, t2, HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr,
                SQUASH: tl.constexpr, PRECISION: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, KCH: tl.constexpr, BP: tl.constexpr,
                PCH: tl.constexpr, BDO: tl.constexpr, BPO: tl.constexpr):
    """``dK = W_s.T @ A`` and ``dPK = W_r.T @ PA`` of one column block (transposed tiles)."""
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    c0 = tl.program_id(0) * BN
    dout, pout = tl.arange(0, BDO), tl.arange(0, BPO)
    k, pk = _pair_resident(K, PK, cols, N, D, P, SQUASH, BN, BK, KCH, BP, PCH, PRECISION)
    acc_k = tl.zeros((BN, BDO), dtype=tl.float32)
    acc_p = tl.zeros((BN, BPO), dtype=tl.float32)
    for r0 in range(0, M, BM):
        rows = r0 + tl.arange(0, BM)
        pos, own, lse2, g = _row_state(POS, SELF, LSE, G, rows, M, HAS_POS, HAS_SELF)
        a, pa = _pair_resident(A, PA, rows, M, D, P, SQUASH, BM, BK, KCH, BP, PCH, PRECISION)
        acc_k, acc_p = _pair_tile_grads(A, K, PA, PK, rows, cols, c0, dout, pout, a, k, pa, pk,
                                        acc_k, acc_p, pos, own, lse2, g, M, N, D, P, beta,
                                        half_dim, t0, t1, t2, HAS_POS, HAS_SELF, SQUASH,
                                        PRECISION, BM, BN, BK, KCH, BP, PCH, BDO, BPO, True)
    _store_block(GK, cols, dout, N, D, acc_k)
    _store_block(GPK, cols, pout, N, P, acc_p)
