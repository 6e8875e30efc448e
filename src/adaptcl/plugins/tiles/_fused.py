"""The fused (Triton) backend of :func:`~adaptcl.plugins.tiles._loop.streamed_row_stats`.

Reference:
    Cheng et al., "Breaking the Memory Barrier: Near Infinite Batch Size Scaling for Contrastive
    Loss" (Inf-CL, 2024, arXiv:2410.17243; ``inf_cl/flash.py``); Dao, "FlashAttention-2",
    2023 (arXiv:2307.08691), for the split of the backward into a query and a key pass; Shah et
    al., "FlashAttention-3", 2024 (arXiv:2407.08608), for ``exp2`` with the scale folded in.

The PyTorch tiled path is a Python loop over tiles; here the same row statistics are three
Triton kernels, one launch each (see ``_triton_rowstats.py``): a forward that keeps per anchor
block a running max and sum over every column block (and the label targets' two sums), and a
backward that recomputes each tile from the embeddings and the saved ``lse`` (``dA`` per anchor
block, ``dK`` per column block). Memory stays linear in the batch.

What the kernel covers (:func:`why_not` says why not, in one phrase, for anything else):

* the logits ``a @ k.T`` (any temperature folded into ``a``: InfoNCE in every form, DCL, MACL,
  the schedule, the learned temperature, a memory bank, gathered columns) with the positive
  and self columns masked by global index;
* multi-positive targets from labels (weights describing
  :class:`~adaptcl.plugins.tiles._terms.SameClassTargets`);
* DySTreSS's pair temperature ``s / tau(s)`` (a term describing
  :class:`~adaptcl.plugins.tiles._terms.SimilarityTemperature`);
* AMCL's softmax term ``logsumexp_j s_ij / tau(r_ij) - beta Omega(tau(r_ij))`` (a pair term
  describing :class:`~adaptcl.plugins.tiles._terms.RegularisedPairTerm`; ``_triton_pairlse.py``:
  the same structure, two products per tile);
* float32, bfloat16 and float16 inputs, the products at the precision policy's precision
  (:mod:`~adaptcl.plugins._products`: bf16 / fp16 operands on tensor cores, TF32, or
  IEEE float32), float32 accumulation, log-sum-exp and gradients.

Not covered: a hardness bias, ASCL's soft targets, AMCL's top-kappa term, float64, mixed
dtypes.

Which calls run here is the dispatcher's decision (:mod:`~adaptcl.plugins.tiles._dispatch`,
through the backend of :mod:`~adaptcl.plugins.tiles._kernel_backend`); this module only answers
whether the kernel can compute a problem (:func:`why_not`) and computes it. On CPU tensors the kernels run only under Triton's
interpreter (``TRITON_INTERPRET=1``). The methods never name the kernels' codes: they describe
their math with the typed values of :mod:`~adaptcl.plugins.tiles._terms`, which this module
translates. Block sizes come from a fixed table per GPU architecture (``_configs.py``); nothing
is autotuned, and nothing synchronises with the host, unless ``tiling(autotune=True)`` asks
(:mod:`~adaptcl.plugins.execution`). The ops are registered with :mod:`torch.library` (``adaptcl::row_stats``,
``adaptcl::row_stats_backward``, ``adaptcl::pair_lse``, ``adaptcl::pair_lse_backward``) so
``torch.compile`` keeps a loss in one graph.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import NamedTuple

import torch
from torch import Tensor

from ..execution import current_tiling
from . import _configs as configs
from ._backend import Problem
from ._terms import (
    RegularisedPairTerm,
    SameClassTargets,
    SigmoidPairTemperature,
    SimilarityTemperature,
    description,
)

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


def why_not(problem: Problem) -> str | None:
    """Why the kernels cannot compute ``problem`` (one phrase), or ``None`` when they can: the
    kernel backend's answer (:mod:`~adaptcl.plugins.tiles._kernel_backend`)."""
    if problem.op == "row_blocks":
        return f"{problem.method} has no kernel path"
    if problem.op not in ("row_stats", "pair_lse"):
        return _missing(problem.pair, "selection")
    if not _HAS_TRITON:
        return "Triton is not installed"
    device = problem.device.type
    if device == "cpu":
        if not interpreting():
            return "the tensors are on the CPU and TRITON_INTERPRET=1 is not set"
        if not _interpreter_ready():
            return ("TRITON_INTERPRET=1 was set after Triton was imported (set it before the "
                    "first import of triton or torch._dynamo)")
    elif device != "cuda":
        return f"the tensors are on {device}, not CUDA"
    if problem.dtype not in _DTYPES or problem.key_dtype != problem.dtype:
        return (f"the dtypes are {problem.dtype} and {problem.key_dtype} (it takes one of "
                f"float32, bfloat16, float16)")
    if problem.masks > 2:
        return f"it masks at most two columns per row, not {problem.masks}"
    if problem.bias is not None:
        return _missing(problem.bias, "bias (a bias inside the log-sum-exp)")
    if problem.weights is not None and not isinstance(problem.weights, SameClassTargets):
        return _missing(problem.weights, "weights (only label targets)")
    if problem.term is not None and not isinstance(problem.term, SimilarityTemperature):
        return _missing(problem.term, "term")
    if problem.op == "pair_lse":
        widest = configs.pair_width(problem.precision, configs.arch_of(problem.device))
        if problem.width > widest:
            return (f"its feature width {problem.width} exceeds {widest} at "
                    f"{problem.precision} products (wider features split the backward into "
                    f"more output blocks, each recomputing every tile)")
        if not isinstance(problem.pair, RegularisedPairTerm):
            return _missing(problem.pair, "pair temperature")
    return None


def _missing(part: object, what: str) -> str:
    """``"it has no X"``: a part by its own name, or by its description's type."""
    if isinstance(part, str):
        return f"it has no {part}"
    return f"it has no {type(part).__name__} {what}"


# --------------------------------------------------------------------------------------------
# Launching: operands at the products' precision, blocks from the fixed table
# --------------------------------------------------------------------------------------------

#: the operands' dtype per precision (TF32 and IEEE products read float32)
_OPERAND = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32,
            "ieee": torch.float32}


def _operands(precision: str, *xs: Tensor) -> list[Tensor]:
    """``xs`` as the kernels read them: contiguous, in the precision's operand dtype (a cast
    of ``[N, D]``, O(N D); the gradients stay in the inputs' dtype)."""
    return [x.to(_OPERAND[precision]).contiguous() for x in xs]


#: When set, :func:`_launch` calls ``launch_observer(kernel, name, args, meta, block,
#: precision, width)`` before each launch, with what it would launch (``args``: the runtime
#: arguments by name; ``meta``: the constexprs but the block's), and
#: skips the launch when it returns true. The kernel report (``benchmarks/kernel_reach.py``)
#: enumerates the launches the losses can make with it; keep the call where every launch
#: passes.
launch_observer: Callable[..., bool] | None = None


def _launch(kernel, name: str, precision: str, width: int, grid, args: dict,
            meta: dict, device: torch.device, sizes: tuple[int, int], reset=None) -> None:
    """``kernel[grid(block)](**args, **meta)`` with the table's block for ``name`` (or the
    autotuned one where ``tiling(autotune=True)`` asks; ``reset()`` before each launch
    clears what a kernel accumulates into). ``args``: the kernel's runtime arguments by name."""
    heavy = bool(meta.get("HAS_LAB")) or bool(meta.get("TERM"))
    block = configs.block(name, precision, width, configs.arch_of(device), heavy)
    if launch_observer is not None and launch_observer(kernel, name, args, meta, block,
                                                       precision, width):
        return

    def run(b: configs.Block) -> None:
        if reset is not None:
            reset()
        kernel[grid(b)](**args, **meta, BM=b.bm, BN=b.bn, num_warps=b.warps,
                        num_stages=b.stages)

    if current_tiling().autotune and device.type == "cuda":
        key = (name, precision, configs.padded(width), *sorted(meta.items()),
               *(configs.size_bin(n) for n in sizes))
        block = configs.tuned(key, block, run)
    run(block)


# --------------------------------------------------------------------------------------------
# The row statistics' inputs: in label order where label targets are asked for
# --------------------------------------------------------------------------------------------

#: the names of DySTreSS's four parameters in the row kernels
_TERM_ARGS = ("t_min", "t_max", "threshold", "width")


class _RowInputs(NamedTuple):
    """The row kernels' inputs, and where they were reordered the orders (position in the
    kernel's problem -> row of the caller's): ``None`` without labels."""

    a: Tensor
    k: Tensor
    positive_index: Tensor | None
    self_index: Tensor | None
    labels: Tensor | None
    key_labels: Tensor | None
    anchor_order: Tensor | None
    key_order: Tensor | None

    def kernel_args(self, placeholder: Tensor) -> dict[str, Tensor | int]:
        """The kernels' shared arguments by name (``placeholder`` for an absent mask or
        label: never read, its flag is off)."""
        return {"A": self.a, "K": self.k, "POS": _or(self.positive_index, placeholder),
                "SELF": _or(self.self_index, placeholder), "RLAB": _or(self.labels, placeholder),
                "KLAB": _or(self.key_labels, placeholder), "M": self.a.shape[0],
                "N": self.k.shape[0], "D": self.a.shape[1]}

    def to_anchors(self, x: Tensor) -> Tensor:
        """``x`` (per row of the kernel's problem) in the caller's row order."""
        return x if self.anchor_order is None else _placed(x, self.anchor_order)

    def to_keys(self, x: Tensor) -> Tensor:
        return x if self.key_order is None else _placed(x, self.key_order)

    def of_anchors(self, x: Tensor) -> Tensor:
        """``x`` (per caller's row) in the kernel's row order."""
        return x if self.anchor_order is None else x[self.anchor_order]


def _row_inputs(a: Tensor, k: Tensor, positive_index: Tensor | None, self_index: Tensor | None,
                labels: Tensor | None, key_labels: Tensor | None, precision: str) -> _RowInputs:
    """The operands at ``precision``, the masks and the labels as the row kernels take them.

    With label targets, the anchors and the keys are sorted by label (stable), the masks
    renumbered to the sorted keys and the labels replaced by their dense ranks over every
    label present (the kernels compare them in int32). A block of sorted anchors then meets the
    keys of its own few classes only: the kernels test per block whether its labels can meet
    (and whether it holds an excluded column) and do the per-element label and mask work in
    those blocks alone (``_triton_rowstats.py``). One sort of ``A + C`` labels and a gather of
    the rows, O((A + C) D); without labels nothing moves.
    """
    a, k = _operands(precision, a, k)
    if labels is None:
        return _RowInputs(a, k, positive_index, self_index, None, None, None, None)
    ranks = _dense_ranks(torch.cat([labels, key_labels]))
    anchor_ranks, key_ranks = ranks[:labels.numel()], ranks[labels.numel():]
    anchor_order = torch.argsort(anchor_ranks, stable=True)
    key_order = torch.argsort(key_ranks, stable=True)
    key_position = _placed(torch.arange(k.shape[0], device=k.device), key_order)
    return _RowInputs(a[anchor_order], k[key_order],
                      _renumbered(positive_index, anchor_order, key_position),
                      _renumbered(self_index, anchor_order, key_position),
                      anchor_ranks[anchor_order], key_ranks[key_order], anchor_order, key_order)


_SPLIT_SAID: set[tuple[str, int]] = set()


def _one_pass_laid_out(precision: str, arch: str, dim: int) -> bool:
    """Whether the one-pass backward the setting asks for runs at ``precision`` and ``dim``
    features (``_configs.ONE_PASS_WIDEST``); where it does not, the split backward runs and a
    warning says so once per precision and width."""
    if configs.one_pass(precision, arch, dim):
        return True
    key = (precision, configs.padded(dim))
    if key not in _SPLIT_SAID:
        _SPLIT_SAID.add(key)
        widest = {k: v for k, v in configs.ONE_PASS_WIDEST.items() if v and k != "interpreter"}
        warnings.warn(f"tiling(backward='onepass'): the split backward runs at {precision} "
                      f"products and {dim} features; the one-pass backward is laid out for "
                      f"bf16/fp16 up to {widest['half']} features and IEEE up to "
                      f"{widest['ieee']} (its accumulators spill beyond)", stacklevel=2)
    return False


def _dense_ranks(x: Tensor) -> Tensor:
    """Each entry's rank among the distinct values of ``x`` (``0`` the smallest), as
    ``torch.unique(x, return_inverse=True)[1]`` gives it, but from a sort and a running count:
    every shape is known in advance, so nothing waits for the GPU (``unique`` reads its number
    of values back to the host) and ``torch.compile`` keeps one graph."""
    values, order = torch.sort(x, stable=True)
    new = torch.ones_like(values, dtype=torch.bool)
    new[1:] = values[1:] != values[:-1]
    return _placed(torch.cumsum(new, 0) - 1, order)


def _placed(x: Tensor, order: Tensor) -> Tensor:
    """``y`` with ``y[order[i]] = x[i]``: rows of a sorted problem back in place."""
    out = torch.empty_like(x)
    out[order] = x
    return out


def _renumbered(index: Tensor | None, anchor_order: Tensor,
                key_position: Tensor) -> Tensor | None:
    """A mask's column per anchor, for the anchors and keys in their sorted orders (``-1``,
    no column, stays)."""
    if index is None:
        return None
    index = index[anchor_order]
    return torch.where(index >= 0, key_position[index.clamp(min=0)], index)


# --------------------------------------------------------------------------------------------
# The torch.library ops
# --------------------------------------------------------------------------------------------

_NO_TERM = (0, [1.0, 1.0, 0.0, 1.0], True)
_SHAPES = {"cosine": 1, "piecewise": 2}


def _term_codes(term: object) -> tuple[int, list[float], bool]:
    """A :class:`~adaptcl.plugins.tiles._terms.SimilarityTemperature` as the kernels' ``TERM``
    code, its four parameters and whether it is detached (no term: the identity)."""
    d = None if term is None else description(term)
    if d is None:
        return _NO_TERM
    return (_SHAPES[d.shape], [d.min_temperature, d.max_temperature, d.threshold, d.width],
            d.detach)


def _flags(pos, own, labels, term_kind):
    return {"HAS_POS": pos is not None, "HAS_SELF": own is not None,
            "HAS_LAB": labels is not None, "TERM": term_kind}


@torch.library.custom_op("adaptcl::row_stats", mutates_args=())
def row_stats_op(a: Tensor, k: Tensor, positive_index: Tensor | None, self_index: Tensor | None,
                 labels: Tensor | None, key_labels: Tensor | None, term_kind: int,
                 term_params: list[float], detach: bool,
                 precision: str) -> tuple[Tensor, Tensor, Tensor]:
    """``(lse, sum_ul, sum_u)`` [A] float32 of the masked ``term(a @ k.T)`` (one launch)."""
    rows, cols, dim = a.shape[0], k.shape[0], a.shape[1]
    lse = torch.empty(rows, dtype=torch.float32, device=a.device)
    sum_ul, sum_u = torch.zeros_like(lse), torch.zeros_like(lse)
    if rows == 0:
        return lse, sum_ul, sum_u
    inputs = _row_inputs(a, k, positive_index, self_index, labels, key_labels, precision)
    args = {**inputs.kernel_args(lse), "LSE": lse, "SUM_UL": sum_ul, "SUM_U": sum_u,
            **dict(zip(_TERM_ARGS, term_params, strict=True))}
    feats = configs.features(dim, precision, configs.arch_of(a.device), "fwd")
    meta = {"PRECISION": precision, "BK": feats["BK"], "KCH": feats["KCH"],
            **_flags(positive_index, self_index, labels, term_kind)}
    _launch(kernels().row_stats_fwd, "fwd", precision, dim, lambda b: (_cdiv(rows, b.bm),),
            args, meta, a.device, (rows, cols))
    return inputs.to_anchors(lse), inputs.to_anchors(sum_ul), inputs.to_anchors(sum_u)


@row_stats_op.register_fake
def _(a, k, positive_index, self_index, labels, key_labels, term_kind, term_params, detach,
      precision):
    lse = a.new_empty(a.shape[0], dtype=torch.float32)
    return lse, torch.empty_like(lse), torch.empty_like(lse)


@torch.library.custom_op("adaptcl::row_stats_backward", mutates_args=())
def row_stats_backward_op(a: Tensor, k: Tensor, lse: Tensor, g_lse: Tensor, g_ul: Tensor,
                          positive_index: Tensor | None, self_index: Tensor | None,
                          labels: Tensor | None, key_labels: Tensor | None, term_kind: int,
                          term_params: list[float], detach: bool,
                          precision: str) -> tuple[Tensor, Tensor]:
    """``(dA, dK)`` of :func:`row_stats_op` for the upstream ``(g_lse, g_ul)``: two launches,
    FlashAttention-2's query and key passes, or one where ``tiling(backward="onepass")`` asks
    and the precision and width take it (``_configs.ONE_PASS_WIDEST``; ``dA`` then by float32
    atomics)."""
    rows, cols, dim = a.shape[0], k.shape[0], a.shape[1]
    if rows == 0 or cols == 0:
        return torch.zeros_like(a), torch.zeros_like(k)
    inputs = _row_inputs(a, k, positive_index, self_index, labels, key_labels, precision)
    ga, gk = torch.empty_like(a), torch.empty_like(k)
    args = {**inputs.kernel_args(lse), "LSE": inputs.of_anchors(lse),
            "G_LSE": inputs.of_anchors(g_lse.float()).contiguous(),
            "G_UL": inputs.of_anchors(g_ul.float()).contiguous(),
            **dict(zip(_TERM_ARGS, term_params, strict=True))}
    flags = {"PRECISION": precision, "DETACH": detach,
             **_flags(positive_index, self_index, labels, term_kind)}
    arch = configs.arch_of(a.device)
    lib = kernels()
    if current_tiling().backward == "onepass" and _one_pass_laid_out(precision, arch, dim):
        onepass = configs.features(dim, precision, arch, "bwd")
        ga32 = torch.zeros(a.shape, dtype=torch.float32, device=a.device)
        _launch(lib.row_stats_bwd_onepass, "bwd", precision, dim,
                lambda b: (_cdiv(cols, b.bn),), {**args, "GA32": ga32, "GK": gk},
                {**flags, **onepass}, a.device, (rows, cols), reset=ga32.zero_)
        return inputs.to_anchors(ga32.to(a.dtype)), inputs.to_keys(gk)
    feats = configs.features(dim, precision, arch, "dq")
    outputs = _cdiv(configs.padded(dim), feats["BDO"])
    _launch(lib.row_stats_dq, "dq", precision, dim, lambda b: (_cdiv(rows, b.bm), outputs),
            {**args, "GA": ga}, {**flags, **feats}, a.device, (rows, cols))
    _launch(lib.row_stats_dk, "dk", precision, dim, lambda b: (_cdiv(cols, b.bn), outputs),
            {**args, "GK": gk}, {**flags, **feats}, a.device, (rows, cols))
    return inputs.to_anchors(ga), inputs.to_keys(gk)


@row_stats_backward_op.register_fake
def _(a, k, lse, g_lse, g_ul, positive_index, self_index, labels, key_labels, term_kind,
      term_params, detach, precision):
    return torch.empty_like(a), torch.empty_like(k)


def _setup_context(ctx, inputs, output):
    (a, k, positive_index, self_index, labels, key_labels, term_kind, term_params, detach,
     precision) = inputs
    ctx.save_for_backward(a, k, output[0], positive_index, self_index, labels, key_labels)
    ctx.term = (term_kind, term_params, detach, precision)


def _backward(ctx, g_lse, g_ul, _g_u):
    a, k, lse, positive_index, self_index, labels, key_labels = ctx.saved_tensors
    g_lse = torch.zeros_like(lse) if g_lse is None else g_lse
    g_ul = torch.zeros_like(lse) if g_ul is None else g_ul
    ga, gk = row_stats_backward_op(a, k, lse, g_lse, g_ul, positive_index, self_index, labels,
                                   key_labels, *ctx.term)
    return ga, gk, None, None, None, None, None, None, None, None


row_stats_op.register_autograd(_backward, setup_context=_setup_context)


def _cdiv(x: int, y: int) -> int:
    return -(-x // y)


def _or(x: Tensor | None, default: Tensor) -> Tensor:
    return default if x is None else x


def fused_row_stats(a: Tensor, k: Tensor, masks: tuple[Tensor | None, ...], weights: object = None,
                    term: object = None, precision: str = "ieee") -> tuple[Tensor, Tensor, Tensor]:
    """The kernel's ``(lse, sum_ul, sum_u)``, as :func:`~adaptcl.plugins.tiles._loop.streamed_row_stats`
    returns them (``lse`` and ``sum_ul`` differentiable in ``a`` and ``k``; float32), with the
    products at ``precision``."""
    positive_index, self_index = (tuple(masks) + (None, None))[:2]
    targets = None if weights is None else description(weights)
    labels, key_labels = (None, None) if targets is None else (targets.labels, targets.key_labels)
    kind, params, detach = _term_codes(term)
    lse, sum_ul, sum_u = row_stats_op(a, k, positive_index, self_index, labels, key_labels, kind,
                                      list(params), bool(detach), precision)
    return lse, sum_ul, sum_u.detach()


# --------------------------------------------------------------------------------------------
# AMCL's pair log-sum-exp
# --------------------------------------------------------------------------------------------

def _pair_codes(pair: object) -> list[float]:
    """A :class:`~adaptcl.plugins.tiles._terms.RegularisedPairTerm` as the kernels' parameters
    ``(squash kind, t0, t1, t2, beta, dim)``."""
    d = description(pair)
    tau = d.temperature
    if isinstance(tau, SigmoidPairTemperature):
        squash = [1.0, tau.scale, tau.floor, tau.bound]
    else:
        squash = [0.0, tau.temperature, 0.0, 0.0]
    return [*squash, float(d.beta), float(d.dim)]


def _pair_args(a, k, pa, pk, positive_index, self_index, params, precision):
    """The kernels' sizes and term scalars by name, their flags and feature layout, and the
    width their block is looked up at (``params``: :func:`_pair_codes`)."""
    kind, t0, t1, t2, beta, dim = params
    scalars = {"M": a.shape[0], "N": k.shape[0], "D": a.shape[1], "P": pa.shape[1],
               "beta": beta, "half_dim": 0.5 * dim, "t0": t0, "t1": t1, "t2": t2}
    arch = configs.arch_of(a.device)
    feats = configs.features(a.shape[1], precision, arch)
    pfeats = configs.features(pa.shape[1], precision, arch)
    meta = {"HAS_POS": positive_index is not None, "HAS_SELF": self_index is not None,
            "SQUASH": int(kind), "PRECISION": precision, "BK": feats["BK"], "KCH": feats["KCH"],
            "BP": pfeats["BK"], "PCH": pfeats["KCH"]}
    width = max(a.shape[1], pa.shape[1] * (int(kind) != 0))
    return scalars, meta, width


@torch.library.custom_op("adaptcl::pair_lse", mutates_args=())
def pair_lse_op(a: Tensor, k: Tensor, pa: Tensor, pk: Tensor, positive_index: Tensor | None,
                self_index: Tensor | None, params: list[float],
                precision: str) -> tuple[Tensor, Tensor]:
    """``(lse [A], per-row sum of tau [A])`` of AMCL's ``s / tau(r) - beta Omega(tau(r))``."""
    lse = torch.empty(a.shape[0], dtype=torch.float32, device=a.device)
    tau_sum = torch.zeros_like(lse)
    if a.shape[0] == 0:
        return lse, tau_sum
    scalars, meta, width = _pair_args(a, k, pa, pk, positive_index, self_index, params, precision)
    ops = dict(zip(("A", "K", "PA", "PK"), _operands(precision, a, k, pa, pk), strict=True))
    fwd = pair_kernels().pair_lse_fwd
    args = dict(**ops, POS=_or(positive_index, lse), SELF=_or(self_index, lse), LSE=lse,
                TAU_SUM=tau_sum, **scalars)
    _launch(fwd, "pair_fwd", precision, width, lambda b: (_cdiv(a.shape[0], b.bm),), args, meta,
            a.device, (a.shape[0], k.shape[0]))
    return lse, tau_sum


@pair_lse_op.register_fake
def _(a, k, pa, pk, positive_index, self_index, params, precision):
    lse = a.new_empty(a.shape[0], dtype=torch.float32)
    return lse, torch.empty_like(lse)


@torch.library.custom_op("adaptcl::pair_lse_backward", mutates_args=())
def pair_lse_backward_op(a: Tensor, k: Tensor, pa: Tensor, pk: Tensor, lse: Tensor, g: Tensor,
                         positive_index: Tensor | None, self_index: Tensor | None,
                         params: list[float],
                         precision: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dA, dK, dPA, dPK)`` of :func:`pair_lse_op`: two launches (the anchors' and the
    columns'), each recomputing a tile once for both gradients of its side where their
    accumulators fit one program, else once per output block
    (``_triton_pairlse.backward_parts``)."""
    outs = [torch.zeros_like(x) for x in (a, k, pa, pk)]
    if a.shape[0] == 0 or k.shape[0] == 0:
        return tuple(outs)
    lib = pair_kernels()
    scalars, meta, width = _pair_args(a, k, pa, pk, positive_index, self_index, params, precision)
    bdo, bpo = configs.pair_outputs(precision, configs.arch_of(a.device), a.shape[1],
                                    pa.shape[1], meta["SQUASH"] != 0)
    parts = lib.backward_parts(meta["SQUASH"], configs.padded(a.shape[1]),
                               configs.padded(pa.shape[1]), bdo, bpo)
    meta |= {"BDO": bdo, "BPO": bpo}
    ops = dict(zip(("A", "K", "PA", "PK"), _operands(precision, a, k, pa, pk), strict=True))
    rows = {"POS": _or(positive_index, lse), "SELF": _or(self_index, lse), "LSE": lse,
            "G": g.float().contiguous()}
    sizes = (a.shape[0], k.shape[0])
    _launch(lib.pair_lse_dq, "pair_dq", precision, width,
            lambda b: (_cdiv(a.shape[0], b.bm), parts),
            dict(**ops, **rows, GA=outs[0], GPA=outs[2], **scalars),
            meta, a.device, sizes)
    _launch(lib.pair_lse_dk, "pair_dk", precision, width,
            lambda b: (_cdiv(k.shape[0], b.bn), parts),
            dict(**ops, **rows, GK=outs[1], GPK=outs[3], **scalars),
            meta, a.device, sizes)
    return tuple(outs)


@pair_lse_backward_op.register_fake
def _(a, k, pa, pk, lse, g, positive_index, self_index, params, precision):
    return tuple(torch.empty_like(x) for x in (a, k, pa, pk))


def _pair_setup_context(ctx, inputs, output):
    a, k, pa, pk, positive_index, self_index, params, precision = inputs
    ctx.save_for_backward(a, k, pa, pk, output[0], positive_index, self_index)
    ctx.params, ctx.precision = params, precision


def _pair_backward(ctx, g, _g_tau_sum):
    a, k, pa, pk, lse, positive_index, self_index = ctx.saved_tensors
    g = torch.zeros_like(lse) if g is None else g
    grads = pair_lse_backward_op(a, k, pa, pk, lse, g, positive_index, self_index, ctx.params,
                                 ctx.precision)
    return (*grads, None, None, None, None)


pair_lse_op.register_autograd(_pair_backward, setup_context=_pair_setup_context)


def fused_pair_lse(a: Tensor, k: Tensor, pa: Tensor, pk: Tensor,
                   masks: tuple[Tensor | None, ...], pair: object,
                   precision: str = "ieee") -> tuple[Tensor, Tensor]:
    """The kernel's ``(lse [A], sum of tau over every pair)``, as
    :func:`~adaptcl.plugins.tiles._loop.streamed_pair_lse` returns them."""
    positive_index, self_index = (tuple(masks) + (None, None))[:2]
    lse, tau_sum = pair_lse_op(a, k, pa, pk, positive_index, self_index, _pair_codes(pair),
                               precision)
    return lse, tau_sum.sum().detach()
