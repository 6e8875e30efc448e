"""Triton kernels of AMCL's streamed pair log-sum-exp, imported by
:mod:`adaptcl.plugins.tiles` on first use only.

Per tile of anchors x columns they form two bilinear forms, ``s = a @ k.T`` (the cosines) and
``r = pa @ pk.T`` (the temperature network's features), the pair temperature
``tau = squash(r)`` (``iota sigmoid(-clamp(r)) + eta``, or a constant) and the term
``s / tau - beta Omega(tau)``, ``Omega(tau) = (dim / 2) log tau + 1 / tau``:

* ``pair_lse_fwd`` keeps the online log-sum-exp of the term over the unmasked columns and the
  sum of ``tau`` over every pair (AMCL's monitored mean temperature);
* ``pair_lse_dq`` (per anchor block) and ``pair_lse_dk`` (per column block) recompute the tile
  and accumulate either the gradient of the cosine side (``FEATURES=False``: ``a`` / ``k``,
  weights ``W / tau``) or of the temperature side (``True``: ``pa`` / ``pk``, weights
  ``W d term / d tau  squash'(r)``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton_rowstats import (
    INTERPRET,
    _block,
    _columns_kept,
    _configs,
    _finish_lse,
    _online_lse,
    _operand,
    _store_block,
    _tile,
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
def _squash_grad(r, SQUASH: tl.constexpr, t0, t1, t2):
    if SQUASH == 0:
        out = r * 0.0
    else:
        sig = tl.sigmoid(-tl.minimum(tl.maximum(r, -t2), t2))
        out = tl.where((r >= -t2) & (r <= t2), sig * (1.0 - sig) * (-t0), 0.0)
    return out


@triton.jit
def _pair_weights(A, K, PA, PK, rows, cols, M, N, D, P, POS, SELF, LSE, G, beta, half_dim,
                  t0, t1, t2, HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr,
                  SQUASH: tl.constexpr, FEATURES: tl.constexpr, PRECISION: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """``d loss / d s`` (FEATURES False) or ``d loss / d r`` (True) of one recomputed tile."""
    s = _tile(A, K, rows, cols, M, N, D, BM, BN, BK, PRECISION)
    r = _tile(PA, PK, rows, cols, M, N, P, BM, BN, BK, PRECISION)
    tau = _squash(r, SQUASH, t0, t1, t2)
    inv = 1.0 / tau
    term = s * inv - beta * (half_dim * tl.log(tau) + inv)
    keep = _columns_kept(rows, cols, M, N, POS, SELF, HAS_POS, HAS_SELF)
    lse = tl.load(LSE + rows, mask=rows < M, other=0.0)
    g = tl.load(G + rows, mask=rows < M, other=0.0)
    w = tl.where(keep, tl.exp(term - lse[:, None]), 0.0) * g[:, None]
    if FEATURES:
        d_tau = -s * inv * inv - beta * (half_dim * inv - inv * inv)
        out = w * d_tau * _squash_grad(r, SQUASH, t0, t1, t2)
    else:
        out = w * inv
    return out


_TUNE = {"key": ["D", "P", "SQUASH"]}  # per width, not per batch (see _triton_rowstats)


@triton.autotune(configs=_configs(INTERPRET, False), **_TUNE)
@triton.jit
def pair_lse_fwd(A, K, PA, PK, POS, SELF, LSE, TAU_SUM, M, N, D, P, beta, half_dim, t0, t1, t2,
                 HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr, SQUASH: tl.constexpr,
                 PRECISION: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    m_run = tl.full((BM,), float("-inf"), dtype=tl.float32)
    s_run = tl.zeros((BM,), dtype=tl.float32)
    tau_sum = tl.zeros((BM,), dtype=tl.float32)
    for c0 in range(0, N, BN):
        cols = c0 + tl.arange(0, BN)
        s = _tile(A, K, rows, cols, M, N, D, BM, BN, BK, PRECISION)
        tau = _squash(_tile(PA, PK, rows, cols, M, N, P, BM, BN, BK, PRECISION), SQUASH,
                      t0, t1, t2)
        inside = (rows[:, None] < M) & (cols[None, :] < N)
        tau_sum += tl.sum(tl.where(inside, tau, 0.0), axis=1)
        term = s / tau - beta * (half_dim * tl.log(tau) + 1.0 / tau)
        keep = _columns_kept(rows, cols, M, N, POS, SELF, HAS_POS, HAS_SELF)
        m_run, s_run = _online_lse(m_run, s_run, tl.where(keep, term, float("-inf")))
    tl.store(LSE + rows, _finish_lse(m_run, s_run), mask=rows < M)
    tl.store(TAU_SUM + rows, tau_sum, mask=rows < M)


@triton.autotune(configs=_configs(INTERPRET, True), **_TUNE)
@triton.jit
def pair_lse_dq(A, K, PA, PK, POS, SELF, LSE, G, OUT, M, N, D, P, beta, half_dim, t0, t1, t2,
                HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr, SQUASH: tl.constexpr,
                FEATURES: tl.constexpr, PRECISION: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, BDO: tl.constexpr):
    """``OUT = W @ K`` (``dA``) or ``W @ PK`` (``dPA``, FEATURES) for one anchor block."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    d = tl.program_id(1) * BDO + tl.arange(0, BDO)
    acc = tl.zeros((BM, BDO), dtype=tl.float32)
    for c0 in range(0, N, BN):
        cols = c0 + tl.arange(0, BN)
        w = _pair_weights(A, K, PA, PK, rows, cols, M, N, D, P, POS, SELF, LSE, G, beta,
                          half_dim, t0, t1, t2, HAS_POS, HAS_SELF, SQUASH, FEATURES, PRECISION,
                          BM, BN, BK)
        if FEATURES:
            other = _block(PK, cols, d, N, P)
        else:
            other = _block(K, cols, d, N, D)
        acc = tl.dot(_operand(w.to(other.dtype), PRECISION), _operand(other, PRECISION), acc,
                     input_precision=PRECISION)
    if FEATURES:
        _store_block(OUT, rows, d, M, P, acc)
    else:
        _store_block(OUT, rows, d, M, D, acc)


@triton.autotune(configs=_configs(INTERPRET, True), **_TUNE)
@triton.jit
def pair_lse_dk(A, K, PA, PK, POS, SELF, LSE, G, OUT, M, N, D, P, beta, half_dim, t0, t1, t2,
                HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr, SQUASH: tl.constexpr,
                FEATURES: tl.constexpr, PRECISION: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, BDO: tl.constexpr):
    """``OUT = W.T @ A`` (``dK``) or ``W.T @ PA`` (``dPK``, FEATURES) for one column block."""
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    d = tl.program_id(1) * BDO + tl.arange(0, BDO)
    acc = tl.zeros((BN, BDO), dtype=tl.float32)
    for r0 in range(0, M, BM):
        rows = r0 + tl.arange(0, BM)
        w = _pair_weights(A, K, PA, PK, rows, cols, M, N, D, P, POS, SELF, LSE, G, beta,
                          half_dim, t0, t1, t2, HAS_POS, HAS_SELF, SQUASH, FEATURES, PRECISION,
                          BM, BN, BK)
        if FEATURES:
            other = _block(PA, rows, d, M, P)
        else:
            other = _block(A, rows, d, M, D)
        acc = tl.dot(tl.trans(_operand(w.to(other.dtype), PRECISION)),
                     _operand(other, PRECISION), acc, input_precision=PRECISION)
    if FEATURES:
        _store_block(OUT, cols, d, N, P, acc)
    else:
        _store_block(OUT, cols, d, N, D, acc)
