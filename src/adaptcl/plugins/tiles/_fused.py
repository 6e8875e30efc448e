"""The fused (Triton) backend of :func:`~adaptcl.plugins.tiles.loop.streamed_row_stats`.

Reference:
    Cheng et al., "Breaking the Memory Barrier: Near Infinite Batch Size Scaling for Contrastive
    Loss" (Inf-CL, 2024, arXiv:2410.17243; ``inf_cl/flash.py``); Dao, "FlashAttention-2",
    2023 (arXiv:2307.08691), for the split of the backward into a query and a key pass.

The PyTorch tiled path is a Python loop over tiles; here the same row statistics are three
Triton kernels, one launch each (see ``_triton_rowstats.py``): a forward that keeps per anchor
block a running max and sum over every column block (and the label targets' two sums), and a
backward that recomputes each tile from the embeddings and the saved ``lse`` (``dA`` per anchor
block, ``dK`` per column block). Memory stays linear in the batch.

What the kernel covers (everything else keeps the PyTorch tiled path, the reference):

* the logits ``a @ k.T`` (any temperature folded into ``a``: InfoNCE in every form, DCL, MACL,
  the schedule, the learned temperature, a memory bank, gathered columns) with the positive
  and self columns masked by global index;
* multi-positive targets from labels (:class:`~adaptcl.plugins.targets.LabelTargets`, which
  exposes ``kernel_labels()``);
* DySTreSS's pair temperature ``s / tau(s)`` (its term exposes ``kernel_term()``);
* AMCL's softmax term ``logsumexp_j s_ij / tau(r_ij) - beta Omega(tau(r_ij))`` with the pair
  temperatures of a :class:`~adaptcl.plugins.PairTemperature` or
  :class:`~adaptcl.plugins.ConstantTemperature` (``_triton_pairlse.py``: the same structure,
  two products per tile, four gradients);
* float32, bfloat16 and float16 inputs (float32 accumulation; TF32 for float32 only where
  ``torch.backends.cuda.matmul.allow_tf32`` allows it).

Not covered: a hardness bias, ASCL's soft targets, AMCL's top-kappa term, float64, mixed
dtypes.

``tile_backend``: ``"torch"`` is the PyTorch loop; ``"triton"`` the kernel (on CPU tensors
only under Triton's interpreter, ``TRITON_INTERPRET=1``), refusing in one line where it cannot
run; ``"auto"`` is the PyTorch loop everywhere for now. The ops are registered with
:mod:`torch.library` (``adaptcl::row_stats`` and ``adaptcl::row_stats_backward``) so
``torch.compile`` keeps a loss in one graph.

Why ``"auto"`` does not take the kernel: its first run on a GPU (one H200, torch 2.11, Triton
3.6; docs/gpu.md) found it slower than the PyTorch loop (MACL, batch 65,536 in the 2N form,
bf16: 1,326 ms against 1,050 ms), the cross-view case not finished after a minute, and the
kernel's CUDA tests failing. Until a GPU run shows it correct and faster, the kernel is opt-in
(``tile_backend="triton"``), tested for values under the interpreter only.
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

import torch
from torch import Tensor

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# looked up once, without importing it (a CPU-only torch has no Triton)
_HAS_TRITON = importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET`` set and true)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def kernels() -> ModuleType:
    """The kernels (``_triton_rowstats.py``), imported on first use: Triton only then."""
    from . import _triton_rowstats

    return _triton_rowstats


def pair_kernels() -> ModuleType:
    """AMCL's pair kernels (``_triton_pairlse.py``), imported on first use."""
    from . import _triton_pairlse

    return _triton_pairlse


def _interpreter_ready() -> bool:
    """Whether Triton's own library was defined for the interpreter: ``TRITON_INTERPRET=1``
    must be set before Triton is first imported (``import torch._dynamo`` imports it)."""
    import triton.language as tl

    return type(tl.zeros).__name__ == "InterpretedFunction"


def unsupported(a: Tensor, k: Tensor, masks: tuple[Tensor | None, ...], weights: object,
                bias: object, term: object) -> str | None:
    """Why the kernel cannot compute this case (one phrase), or ``None`` when it can."""
    if not _HAS_TRITON:
        return "Triton is not installed"
    if a.device.type == "cpu":
        if not interpreting():
            return "the tensors are on the CPU and TRITON_INTERPRET=1 is not set"
        if not _interpreter_ready():
            return ("TRITON_INTERPRET=1 was set after Triton was imported (set it before the "
                    "first import of triton or torch._dynamo)")
    elif a.device.type != "cuda":
        return f"the tensors are on {a.device.type}, not CUDA"
    if a.dtype not in _DTYPES or k.dtype != a.dtype:
        return f"the dtypes are {a.dtype} and {k.dtype} (it takes one of float32, bfloat16, float16)"
    if len(masks) > 2:
        return f"it masks at most two columns per row, not {len(masks)}"
    if bias is not None:
        return f"it has no {type(bias).__name__} (a bias inside the log-sum-exp)"
    if weights is not None and not hasattr(weights, "kernel_labels"):
        return f"it has no {type(weights).__name__} weights (only label targets)"
    if term is not None and not hasattr(term, "kernel_term"):
        return f"it has no {type(term).__name__} term"
    return None


def use_kernel(backend: str, a: Tensor, k: Tensor, masks: tuple[Tensor | None, ...] = (),
               weights: object = None, bias: object = None, term: object = None) -> bool:
    """Whether ``backend`` runs this case on the kernel; ``"triton"`` refuses (``ValueError``,
    one line) a case the kernel cannot run. ``"auto"`` takes the PyTorch loop (see the module's
    docstring for why)."""
    return _choose(backend, lambda: unsupported(a, k, masks, weights, bias, term))


def _choose(backend: str, why) -> bool:
    """``backend``'s choice, ``why()`` saying what keeps the kernel from this case (or None)."""
    if backend != "triton":  # "auto": the PyTorch loop until the kernel wins on a GPU
        return False
    reason = why()
    if reason is not None:
        raise ValueError(f"tile_backend='triton' cannot run here: {reason}; use "
                         f"tile_backend='auto' or 'torch'")
    return True


# --------------------------------------------------------------------------------------------
# The torch.library ops
# --------------------------------------------------------------------------------------------

_NO_TERM = (0, (1.0, 1.0, 0.0, 1.0), True)


def _precision(x: Tensor) -> str:
    if x.dtype == torch.float32 and x.device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "ieee"


def _flags(pos, own, labels, term_kind):
    return {"HAS_POS": pos is not None, "HAS_SELF": own is not None,
            "HAS_LAB": labels is not None, "TERM": term_kind}


@torch.library.custom_op("adaptcl::row_stats", mutates_args=())
def row_stats_op(a: Tensor, k: Tensor, positive_index: Tensor | None, self_index: Tensor | None,
                 labels: Tensor | None, key_labels: Tensor | None, term_kind: int,
                 term_params: list[float], detach: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``(lse, sum_ul, sum_u)`` [A] float32 of the masked ``term(a @ k.T)`` (one launch)."""
    lib = kernels()
    rows, cols, dim = a.shape[0], k.shape[0], a.shape[1]
    lse = torch.empty(rows, dtype=torch.float32, device=a.device)
    sum_ul, sum_u = torch.zeros_like(lse), torch.zeros_like(lse)
    if rows == 0:
        return lse, sum_ul, sum_u
    dummy = lse
    grid = lambda meta: (_cdiv(rows, meta["BM"]),)  # noqa: E731
    lib.row_stats_fwd[grid](
        a, k, _or(positive_index, dummy), _or(self_index, dummy), _or(labels, dummy),
        _or(key_labels, dummy), lse, sum_ul, sum_u, rows, cols, dim, *term_params,
        PRECISION=_precision(a), **_flags(positive_index, self_index, labels, term_kind))
    return lse, sum_ul, sum_u


@row_stats_op.register_fake
def _(a, k, positive_index, self_index, labels, key_labels, term_kind, term_params, detach):
    lse = a.new_empty(a.shape[0], dtype=torch.float32)
    return lse, torch.empty_like(lse), torch.empty_like(lse)


@torch.library.custom_op("adaptcl::row_stats_backward", mutates_args=())
def row_stats_backward_op(a: Tensor, k: Tensor, lse: Tensor, g_lse: Tensor, g_ul: Tensor,
                          positive_index: Tensor | None, self_index: Tensor | None,
                          labels: Tensor | None, key_labels: Tensor | None, term_kind: int,
                          term_params: list[float], detach: bool) -> tuple[Tensor, Tensor]:
    """``(dA, dK)`` of :func:`row_stats_op` for the upstream ``(g_lse, g_ul)`` (two launches)."""
    lib = kernels()
    rows, cols, dim = a.shape[0], k.shape[0], a.shape[1]
    ga, gk = torch.empty_like(a), torch.empty_like(k)
    if rows == 0 or cols == 0:
        return ga.zero_(), gk.zero_()
    args = (a, k, _or(positive_index, lse), _or(self_index, lse), _or(labels, lse),
            _or(key_labels, lse), lse, g_lse.float().contiguous(), g_ul.float().contiguous())
    options = {"PRECISION": _precision(a), "DETACH": detach,
               **_flags(positive_index, self_index, labels, term_kind)}
    lib.row_stats_dq[lambda m: (_cdiv(rows, m["BM"]), _cdiv(dim, m["BDO"]))](
        *args, ga, rows, cols, dim, *term_params, **options)
    lib.row_stats_dk[lambda m: (_cdiv(cols, m["BN"]), _cdiv(dim, m["BDO"]))](
        *args, gk, rows, cols, dim, *term_params, **options)
    return ga, gk


@row_stats_backward_op.register_fake
def _(a, k, lse, g_lse, g_ul, positive_index, self_index, labels, key_labels, term_kind,
      term_params, detach):
    return torch.empty_like(a), torch.empty_like(k)


def _setup_context(ctx, inputs, output):
    a, k, positive_index, self_index, labels, key_labels, term_kind, term_params, detach = inputs
    ctx.save_for_backward(a, k, output[0], positive_index, self_index, labels, key_labels)
    ctx.term = (term_kind, term_params, detach)


def _backward(ctx, g_lse, g_ul, _g_u):
    a, k, lse, positive_index, self_index, labels, key_labels = ctx.saved_tensors
    g_lse = torch.zeros_like(lse) if g_lse is None else g_lse
    g_ul = torch.zeros_like(lse) if g_ul is None else g_ul
    ga, gk = row_stats_backward_op(a, k, lse, g_lse, g_ul, positive_index, self_index, labels,
                                   key_labels, *ctx.term)
    return ga, gk, None, None, None, None, None, None, None


row_stats_op.register_autograd(_backward, setup_context=_setup_context)


def _cdiv(x: int, y: int) -> int:
    return -(-x // y)


def _or(x: Tensor | None, default: Tensor) -> Tensor:
    return default if x is None else x


def fused_row_stats(a: Tensor, k: Tensor, masks: tuple[Tensor | None, ...], weights: object = None,
                    term: object = None, precision: str = "ieee") -> tuple[Tensor, Tensor, Tensor]:
    """The kernel's ``(lse, sum_ul, sum_u)``, as :func:`~adaptcl.plugins.tiles.loop.streamed_row_stats`
    returns them (``lse`` and ``sum_ul`` differentiable in ``a`` and ``k``; float32)."""
    positive_index, self_index = (tuple(masks) + (None, None))[:2]
    labels, key_labels = (None, None) if weights is None else weights.kernel_labels()
    kind, params, detach = _NO_TERM if term is None else term.kernel_term()
    lse, sum_ul, sum_u = row_stats_op(a.contiguous(), k.contiguous(), positive_index, self_index,
                                      labels, key_labels, kind, list(params), bool(detach))
    return lse, sum_ul, sum_u.detach()


# --------------------------------------------------------------------------------------------
# AMCL's pair log-sum-exp
# --------------------------------------------------------------------------------------------


def pair_unsupported(a: Tensor, k: Tensor, pa: Tensor, pk: Tensor,
                     masks: tuple[Tensor | None, ...], pair: object) -> str | None:
    """Why the pair kernel cannot compute this case, or ``None``."""
    why = unsupported(a, k, masks, None, None, None)
    if why is None and (pa.dtype != a.dtype or pk.dtype != a.dtype):
        why = f"the temperature features are {pa.dtype} and {pk.dtype}, not {a.dtype}"
    if why is None and (not hasattr(pair, "kernel_pair") or pair.kernel_pair() is None):
        net = getattr(pair, "net", pair)
        why = f"it has no pair temperature of {type(net).__name__}"
    return why


def use_pair_kernel(backend: str, a: Tensor, k: Tensor, pa: Tensor, pk: Tensor,
                    masks: tuple[Tensor | None, ...], pair: object) -> bool:
    """:func:`use_kernel` for AMCL's pair log-sum-exp."""
    return _choose(backend, lambda: pair_unsupported(a, k, pa, pk, masks, pair))


def _pair_args(a, k, pa, pk, positive_index, self_index, params):
    """The kernels' leading arguments and scalars: ``params = (squash kind, t0, t1, t2, beta,
    dim)``."""
    kind, t0, t1, t2, beta, dim = params
    scalars = (a.shape[0], k.shape[0], a.shape[1], pa.shape[1], beta, 0.5 * dim, t0, t1, t2)
    flags = {"HAS_POS": positive_index is not None, "HAS_SELF": self_index is not None,
             "SQUASH": int(kind), "PRECISION": _precision(a)}
    return scalars, flags


@torch.library.custom_op("adaptcl::pair_lse", mutates_args=())
def pair_lse_op(a: Tensor, k: Tensor, pa: Tensor, pk: Tensor, positive_index: Tensor | None,
                self_index: Tensor | None, params: list[float]) -> tuple[Tensor, Tensor]:
    """``(lse [A], per-row sum of tau [A])`` of AMCL's ``s / tau(r) - beta Omega(tau(r))``."""
    lse = torch.empty(a.shape[0], dtype=torch.float32, device=a.device)
    tau_sum = torch.zeros_like(lse)
    if a.shape[0] == 0:
        return lse, tau_sum
    scalars, flags = _pair_args(a, k, pa, pk, positive_index, self_index, params)
    pair_kernels().pair_lse_fwd[lambda m: (_cdiv(a.shape[0], m["BM"]),)](
        a, k, pa, pk, _or(positive_index, lse), _or(self_index, lse), lse, tau_sum, *scalars,
        **flags)
    return lse, tau_sum


@pair_lse_op.register_fake
def _(a, k, pa, pk, positive_index, self_index, params):
    lse = a.new_empty(a.shape[0], dtype=torch.float32)
    return lse, torch.empty_like(lse)


@torch.library.custom_op("adaptcl::pair_lse_backward", mutates_args=())
def pair_lse_backward_op(a: Tensor, k: Tensor, pa: Tensor, pk: Tensor, lse: Tensor, g: Tensor,
                         positive_index: Tensor | None, self_index: Tensor | None,
                         params: list[float]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dA, dK, dPA, dPK)`` of :func:`pair_lse_op` (four launches, one per gradient)."""
    outs = [torch.zeros_like(x) for x in (a, k, pa, pk)]
    if a.shape[0] == 0 or k.shape[0] == 0:
        return tuple(outs)
    lib = pair_kernels()
    scalars, flags = _pair_args(a, k, pa, pk, positive_index, self_index, params)
    args = (a, k, pa, pk, _or(positive_index, lse), _or(self_index, lse), lse,
            g.float().contiguous())
    launches = ((lib.pair_lse_dq, "BM", False), (lib.pair_lse_dk, "BN", False),
                (lib.pair_lse_dq, "BM", True), (lib.pair_lse_dk, "BN", True))
    for out, (kernel, block, features) in zip(outs, launches, strict=True):
        n, width = out.shape
        kernel[lambda m, n=n, b=block, w=width: (_cdiv(n, m[b]), _cdiv(w, m["BDO"]))](
            *args, out, *scalars, FEATURES=features, **flags)
    return tuple(outs)


@pair_lse_backward_op.register_fake
def _(a, k, pa, pk, lse, g, positive_index, self_index, params):
    return tuple(torch.empty_like(x) for x in (a, k, pa, pk))


def _pair_setup_context(ctx, inputs, output):
    a, k, pa, pk, positive_index, self_index, params = inputs
    ctx.save_for_backward(a, k, pa, pk, output[0], positive_index, self_index)
    ctx.params = params


def _pair_backward(ctx, g, _g_tau_sum):
    a, k, pa, pk, lse, positive_index, self_index = ctx.saved_tensors
    g = torch.zeros_like(lse) if g is None else g
    grads = pair_lse_backward_op(a, k, pa, pk, lse, g, positive_index, self_index, ctx.params)
    return (*grads, None, None, None)


pair_lse_op.register_autograd(_pair_backward, setup_context=_pair_setup_context)


def fused_pair_lse(a: Tensor, k: Tensor, pa: Tensor, pk: Tensor,
                   masks: tuple[Tensor | None, ...], pair: object,
                   precision: str = "ieee") -> tuple[Tensor, Tensor]:
    """The kernel's ``(lse [A], sum of tau over every pair)``, as
    :func:`~adaptcl.plugins.tiles.loop.streamed_pair_lse` returns them."""
    positive_index, self_index = (tuple(masks) + (None, None))[:2]
    lse, tau_sum = pair_lse_op(a.contiguous(), k.contiguous(), pa.contiguous(), pk.contiguous(),
                               positive_index, self_index, [float(x) for x in pair.kernel_pair()])
    return lse, tau_sum.sum().detach()
