"""Triton kernels of the fused row statistics, imported by :mod:`adaptcl.plugins.tiles` on
first use only (plugins import torch alone at import time).

Triton decides when a kernel is defined whether it is compiled or interpreted
(``TRITON_INTERPRET``), for its own library too: the interpreter needs the variable set before
Triton is first imported.

Three kernels, each one launch over the whole problem:

* ``row_stats_fwd``: one program per block of ``BM`` anchors walks over every block of ``BN``
  columns; per tile it forms ``s = a @ k.T`` (the feature dimension in chunks of ``BK``), the
  logits ``l = term(s)``, masks the excluded columns by their global index, and keeps per row
  the running max ``m`` and the rescaled sum ``sum exp(l - m)`` (online log-sum-exp), plus
  ``sum_j u_ij l_ij`` and ``sum_j u_ij`` of the label targets. It writes three ``[A]`` vectors.
* ``row_stats_dq``: one program per (anchor block, feature chunk) recomputes each tile and
  accumulates ``dA = W @ K`` with ``W_ij = (exp(l_ij - lse_i) g_i + u_ij g'_i) term'(s_ij)``.
* ``row_stats_dk``: one program per (column block, feature chunk) recomputes the same tiles
  and accumulates ``dK = W.T @ A`` (FlashAttention-2's split of the backward into a query
  pass and a key pass; nothing is atomic).

Products accumulate in float32; float32 inputs use TF32 only when the caller says so.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton import knobs

PI = 3.141592653589793
INTERPRET: tl.constexpr = tl.constexpr(bool(knobs.runtime.interpret))


@triton.jit
def _logits(s, TERM: tl.constexpr, t_min, t_max, threshold, width):
    """``term(s)``: ``s`` (TERM 0), ``s / tau(s)`` with DySTreSS's cosine (1) or piecewise (2) tau."""
    if TERM == 0:
        out = s
    else:
        half = 0.5 * (t_max - t_min)
        if TERM == 1:
            tau = t_min + half * (1.0 + tl.cos(PI * (1.0 + s)))
        else:
            ramp = t_min + half * (1.0 + tl.cos(PI * (s - threshold) / width))
            tau = tl.where(s > threshold, t_max, ramp)
        out = s / tau
    return out


@triton.jit
def _slope(s, TERM: tl.constexpr, DETACH: tl.constexpr, t_min, t_max, threshold, width):
    """``d term / d s`` (1 without a term; ``1 / tau`` when tau is detached)."""
    half = 0.5 * (t_max - t_min)
    if TERM == 1:
        tau = t_min + half * (1.0 + tl.cos(PI * (1.0 + s)))
        d_tau = -half * PI * tl.sin(PI * (1.0 + s))
    else:
        rate = PI / width
        ramp = t_min + half * (1.0 + tl.cos(rate * (s - threshold)))
        tau = tl.where(s > threshold, t_max, ramp)
        d_tau = tl.where(s > threshold, 0.0, -half * rate * tl.sin(rate * (s - threshold)))
    if DETACH:
        out = 1.0 / tau
    else:
        out = (tau - s * d_tau) / (tau * tau)
    return out


@triton.jit
def _tile(A, K, rows, cols, M, N, D, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
          PRECISION: tl.constexpr):
    """``s = a[rows] @ k[cols].T`` in float32, the feature dimension in chunks of ``BK``."""
    s = tl.zeros((BM, BN), dtype=tl.float32)
    for d0 in range(0, D, BK):
        d = d0 + tl.arange(0, BK)
        a = _block(A, rows, d, M, D)
        k = _block(K, cols, d, N, D)
        s = tl.dot(_operand(a, PRECISION), tl.trans(_operand(k, PRECISION)), s,
                   input_precision=PRECISION)
    return s


@triton.jit
def _operand(x, PRECISION: tl.constexpr):
    """A product's operand as loaded, or in float32 under the interpreter (whose ``dot`` of
    bfloat16/float16 operands is wrong): ``PRECISION`` is ``"ieee"`` there."""
    if INTERPRET:
        x = x.to(tl.float32)
    return x


@triton.jit
def _columns_kept(rows, cols, M, N, POS, SELF, HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr):
    """``[BM, BN]``: the column exists and is not the row's positive nor the row itself."""
    keep = (cols[None, :] < N) & (rows[:, None] < M)
    if HAS_POS:
        pos = tl.load(POS + rows, mask=rows < M, other=-1)
        keep = keep & (cols[None, :] != pos[:, None])
    if HAS_SELF:
        own = tl.load(SELF + rows, mask=rows < M, other=-1)
        keep = keep & (cols[None, :] != own[:, None])
    return keep


@triton.jit
def _same_class(rows, cols, M, N, RLAB, KLAB, keep):
    """``[BM, BN]`` float32 targets ``u_ij = [label_i == key_label_j]`` on the kept columns."""
    rl = tl.load(RLAB + rows, mask=rows < M, other=-2)
    kl = tl.load(KLAB + cols, mask=cols < N, other=-3)
    return tl.where(keep & (rl[:, None] == kl[None, :]), 1.0, 0.0)


@triton.jit
def _weights(A, K, rows, cols, M, N, D, POS, SELF, RLAB, KLAB, LSE, G_LSE, G_UL,
             t_min, t_max, threshold, width, HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr,
             HAS_LAB: tl.constexpr, TERM: tl.constexpr, DETACH: tl.constexpr,
             PRECISION: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """The backward's ``W = d loss / d s`` of one recomputed tile (float32, 0 off the problem)."""
    s = _tile(A, K, rows, cols, M, N, D, BM, BN, BK, PRECISION)
    keep = _columns_kept(rows, cols, M, N, POS, SELF, HAS_POS, HAS_SELF)
    lse = tl.load(LSE + rows, mask=rows < M, other=0.0)
    g = tl.load(G_LSE + rows, mask=rows < M, other=0.0)
    logits = _logits(s, TERM, t_min, t_max, threshold, width)
    w = tl.where(keep, tl.exp(logits - lse[:, None]), 0.0) * g[:, None]
    if HAS_LAB:
        g_ul = tl.load(G_UL + rows, mask=rows < M, other=0.0)
        w += _same_class(rows, cols, M, N, RLAB, KLAB, keep) * g_ul[:, None]
    if TERM != 0:
        w = w * _slope(s, TERM, DETACH, t_min, t_max, threshold, width)
    return w


@triton.jit
def _block(X, idx, d, n, D):
    """Rows ``idx`` (of ``n``), features ``d`` (of ``D``) of a row-major ``[n, D]`` tensor."""
    return tl.load(X + idx[:, None] * D + d[None, :], mask=(idx[:, None] < n) & (d[None, :] < D),
                   other=0.0)


@triton.jit
def _store_block(X, idx, d, n, D, value):
    tl.store(X + idx[:, None] * D + d[None, :], value.to(X.dtype.element_ty),
             mask=(idx[:, None] < n) & (d[None, :] < D))


@triton.jit
def _online_lse(m_run, s_run, logits):
    """One column block into the running max ``m_run`` and sum ``s_run`` of ``exp(l - m)``
    per row (``-inf`` entries add nothing; the shift is 0 while a row has seen nothing)."""
    m_new = tl.maximum(m_run, tl.max(logits, axis=1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    s_new = s_run * tl.exp(m_run - shift) + tl.sum(tl.exp(logits - shift[:, None]), axis=1)
    return m_new, s_new


@triton.jit
def _finish_lse(m_run, s_run):
    """``log sum exp`` of the rows; ``-inf`` where every column was masked (``s_run = 0``)."""
    shift = tl.where(m_run == float("-inf"), 0.0, m_run)
    return tl.where(s_run > 0, shift + tl.log(tl.where(s_run > 0, s_run, 1.0)), float("-inf"))


def _configs(interpret: bool, bwd: bool) -> list[triton.Config]:
    """One small block under the interpreter; Hopper/Ampere candidates on a GPU."""
    if interpret:
        return [triton.Config({"BM": 16, "BN": 16, "BK": 16, "BDO": 16}, num_warps=1)]
    # Few candidates: each is compiled and timed once per key on first use (12 per kernel
    # took minutes at a batch of 65,536 on an H200 and timed out the GPU check).
    extra = {"BDO": 128} if bwd else {}
    return [triton.Config({"BM": bm, "BN": bn, "BK": bk, **extra}, num_warps=warps,
                          num_stages=stages)
            for bm, bn, bk, warps, stages in ((128, 64, 64, 8, 3), (64, 64, 64, 4, 3),
                                              (128, 128, 64, 8, 3), (64, 64, 128, 4, 4))]


def _prune(configs, named_args, **kwargs):
    """Drop feature chunks wider than the (power-of-two rounded) feature dimension."""
    width = max(16, triton.next_power_of_2(named_args["D"]))
    kept = [c for c in configs if c.kwargs["BK"] <= max(width, 64)
            and c.kwargs.get("BDO", 0) <= max(width, 64)]
    return kept or configs[:1]


# Tuned once per feature width and variant, not per batch: a key on the batch sizes re-tunes
# at every new size (a last, smaller batch; each tile of another shape).
_TUNE = {"key": ["D", "HAS_LAB", "TERM"], "prune_configs_by": {"early_config_prune": _prune}}


@triton.autotune(configs=_configs(INTERPRET, False), **_TUNE)
@triton.jit
def row_stats_fwd(A, K, POS, SELF, RLAB, KLAB, LSE, SUM_UL, SUM_U, M, N, D,
                  t_min, t_max, threshold, width,
                  HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr, HAS_LAB: tl.constexpr,
                  TERM: tl.constexpr, PRECISION: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    m_run = tl.full((BM,), float("-inf"), dtype=tl.float32)
    s_run = tl.zeros((BM,), dtype=tl.float32)
    sum_ul = tl.zeros((BM,), dtype=tl.float32)
    sum_u = tl.zeros((BM,), dtype=tl.float32)
    for c0 in range(0, N, BN):
        cols = c0 + tl.arange(0, BN)
        logits = _logits(_tile(A, K, rows, cols, M, N, D, BM, BN, BK, PRECISION),
                         TERM, t_min, t_max, threshold, width)
        keep = _columns_kept(rows, cols, M, N, POS, SELF, HAS_POS, HAS_SELF)
        if HAS_LAB:
            u = _same_class(rows, cols, M, N, RLAB, KLAB, keep)
            sum_ul += tl.sum(u * logits, axis=1)
            sum_u += tl.sum(u, axis=1)
        m_run, s_run = _online_lse(m_run, s_run, tl.where(keep, logits, float("-inf")))
    ok = rows < M
    tl.store(LSE + rows, _finish_lse(m_run, s_run), mask=ok)
    if HAS_LAB:
        tl.store(SUM_UL + rows, sum_ul, mask=ok)
        tl.store(SUM_U + rows, sum_u, mask=ok)


@triton.autotune(configs=_configs(INTERPRET, True), **_TUNE)
@triton.jit
def row_stats_dq(A, K, POS, SELF, RLAB, KLAB, LSE, G_LSE, G_UL, GA, M, N, D,
                 t_min, t_max, threshold, width,
                 HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr, HAS_LAB: tl.constexpr,
                 TERM: tl.constexpr, DETACH: tl.constexpr, PRECISION: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BDO: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    d = tl.program_id(1) * BDO + tl.arange(0, BDO)
    acc = tl.zeros((BM, BDO), dtype=tl.float32)
    for c0 in range(0, N, BN):
        cols = c0 + tl.arange(0, BN)
        w = _weights(A, K, rows, cols, M, N, D, POS, SELF, RLAB, KLAB, LSE, G_LSE, G_UL,
                     t_min, t_max, threshold, width, HAS_POS, HAS_SELF, HAS_LAB, TERM, DETACH,
                     PRECISION, BM, BN, BK)
        k = _block(K, cols, d, N, D)
        acc = tl.dot(_operand(w.to(k.dtype), PRECISION), _operand(k, PRECISION), acc,
                     input_precision=PRECISION)
    _store_block(GA, rows, d, M, D, acc)


@triton.autotune(configs=_configs(INTERPRET, True), **_TUNE)
@triton.jit
def row_stats_dk(A, K, POS, SELF, RLAB, KLAB, LSE, G_LSE, G_UL, GK, M, N, D,
                 t_min, t_max, threshold, width,
                 HAS_POS: tl.constexpr, HAS_SELF: tl.constexpr, HAS_LAB: tl.constexpr,
                 TERM: tl.constexpr, DETACH: tl.constexpr, PRECISION: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BDO: tl.constexpr):
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    d = tl.program_id(1) * BDO + tl.arange(0, BDO)
    acc = tl.zeros((BN, BDO), dtype=tl.float32)
    for r0 in range(0, M, BM):
        rows = r0 + tl.arange(0, BM)
        w = _weights(A, K, rows, cols, M, N, D, POS, SELF, RLAB, KLAB, LSE, G_LSE, G_UL,
                     t_min, t_max, threshold, width, HAS_POS, HAS_SELF, HAS_LAB, TERM, DETACH,
                     PRECISION, BM, BN, BK)
        a = _block(A, rows, d, M, D)
        acc = tl.dot(tl.trans(_operand(w.to(a.dtype), PRECISION)), _operand(a, PRECISION), acc,
                     input_precision=PRECISION)
    _store_block(GK, cols, d, N, D, acc)
