"""The precision of the products ``a @ k.T``: one policy for every path and backend.

The tiles' cost is their products; on a GPU they are fast only on tensor cores, whose operands
are bf16, fp16 or TF32. The policy, as PyTorch's own matmuls and Apple's Cut Cross-Entropy:

* bfloat16 / float16 inputs (autocast, the usual GPU case) multiply in that dtype, with float32
  accumulation, on every device;
* float32 inputs on CUDA follow :func:`torch.get_float32_matmul_precision`: ``"highest"``
  (PyTorch's default) is IEEE float32, ``"high"`` TF32, ``"medium"`` bf16;
* float32 inputs on the CPU (and every other device) are IEEE whatever that setting says, as
  PyTorch's own CPU matmul is; ``tiling(emulate_tensor_cores=True)``
  (:mod:`~adaptcl.plugins.execution`) makes them follow it as CUDA does, emulated (the switch the
  tests of the tensor-core paths use; off by default);
* float64 is exact.

Normalisation, temperatures, the log-sum-exp and every gradient stay float32 (float64 when
given): only the operands of the products are rounded.

One function forms every product that makes logits, :func:`product` (and
:func:`logits_product` for ``a @ k.T``, differentiable): the materialised path, the PyTorch
tile loop (forward and its recomputing backward) and the fused kernel's launch (which hands
the kernel its operands in the same precision) all go through it, so the backends agree to the
precision's own error. What it computes:

* on CUDA, the real thing: bf16/fp16 operands in cuBLAS with a float32 output
  (``torch.mm(..., out_dtype=torch.float32)``: the output is never rounded to the operands'
  dtype, which would cost 0.06 on a logit of 20 in bf16), TF32 through PyTorch's own float32
  matmul where :func:`torch.get_float32_matmul_precision` allows it;
* elsewhere (the CPU, and Triton's interpreter), what tensor cores compute, emulated: the
  operands rounded to bf16 / fp16 (to nearest, ties to even, as a cast on the GPU) or to TF32's
  10-bit mantissa (to nearest, ties away from zero: PTX's ``cvt.rna.tf32.f32``), then
  multiplied in float32; the products of two such operands are exact in float32, so only the
  accumulation rounds, as on the GPU.

``"ieee"`` is the plain ``x @ y`` of the inputs' dtype, bit for bit what the losses computed
before this policy.

This module is the core's ground floor (the candidates, every method and both backends use it;
it imports nothing of theirs). Private: the losses' ``last_stats.plan.precision`` says which
precision a call's products had.

Example:
    >>> import torch
    >>> product_precision(torch.bfloat16, torch.device("cpu"))
    'bf16'
    >>> product_precision(torch.float32, torch.device("cpu"))  # IEEE on the CPU (no emulation)
    'ieee'
    >>> a, k = torch.randn(4, 8), torch.randn(6, 8)
    >>> torch.equal(logits_product(a, k, "ieee"), a @ k.T)
    True
    >>> logits_product(a, k, "bf16").dtype  # operands rounded, float32 accumulation and output
    torch.float32
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ._trace import constant_under_compile
from .execution import current_tiling

#: the operands of the products: IEEE (float32 or float64 as given), TF32, bf16 or fp16
ProductPrecision = Literal["ieee", "tf32", "bf16", "fp16"]

_FLOAT32 = {"highest": "ieee", "high": "tf32", "medium": "bf16"}


def product_precision(input_dtype: torch.dtype, device: torch.device) -> ProductPrecision:
    """The precision of the products for embeddings that came in as ``input_dtype`` (the dtype
    the caller passed, before the loss normalised them in float32) on ``device``."""
    if input_dtype == torch.bfloat16:
        return "bf16"
    if input_dtype == torch.float16:
        return "fp16"
    if input_dtype == torch.float32 and (torch.device(device).type == "cuda"
                                         or current_tiling().emulate_tensor_cores):
        return _FLOAT32[_float32_matmul_precision()]
    return "ieee"


@constant_under_compile
def _float32_matmul_precision() -> str:
    """PyTorch's float32 matmul setting; read once while ``torch.compile`` traces (a string
    is no graph value), so a compiled loss keeps the setting it was compiled under, as
    inductor's own matmuls do."""
    return torch.get_float32_matmul_precision()


def on_tensor_cores(precision: ProductPrecision) -> bool:
    """Whether products at ``precision`` run on a GPU's tensor cores (all but IEEE)."""
    return precision != "ieee"


PRECISIONS: tuple[ProductPrecision, ...] = ("ieee", "tf32", "bf16", "fp16")
#: the dtype each rounded precision's operands take on a GPU
OPERAND_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# TF32 keeps 10 of float32's 23 mantissa bits: add half of the dropped range, then clear it
_TF32_HALF, _TF32_MASK = 1 << 12, -(1 << 13)


def rounded(x: Tensor, precision: ProductPrecision) -> Tensor:
    """``x`` (float32, or float64) as products at ``precision`` read it, in ``x``'s dtype.

    bf16 / fp16: a round trip through that dtype (to nearest, ties to even). TF32: the mantissa
    cut to 10 bits, to nearest with ties away from zero (``cvt.rna.tf32.f32``; a float32 of
    that mantissa is exact in float64 too). IEEE: ``x`` itself.
    """
    if precision in OPERAND_DTYPES:
        return x.to(OPERAND_DTYPES[precision]).to(x.dtype)
    if precision == "tf32":
        bits = x.float().contiguous().view(torch.int32)
        return ((bits + _TF32_HALF) & _TF32_MASK).view(torch.float32).to(x.dtype)
    return x


def _tensor_cores_here(x: Tensor, precision: ProductPrecision) -> bool:
    """Whether ``x``'s device computes ``precision`` natively (CUDA): bf16/fp16 operands with a
    float32 output (``aten::mm.dtype``), or TF32 where PyTorch's float32 matmul uses it."""
    if x.device.type != "cuda":
        return False
    if precision == "tf32":
        return _float32_matmul_precision() != "highest" and x.dtype == torch.float32
    return hasattr(torch.ops.aten.mm, "dtype")


def _mm(x: Tensor, y: Tensor, precision: ProductPrecision) -> Tensor:
    """``x @ y`` with both operands at ``precision`` and a float32 (float64) result."""
    if precision == "ieee":
        return x @ y
    if _tensor_cores_here(x, precision):
        if precision == "tf32":
            return x @ y
        dtype = OPERAND_DTYPES[precision]
        return torch.mm(x.to(dtype), y.to(dtype), out_dtype=torch.float32)
    return rounded(x, precision) @ rounded(y, precision)


def product(x: Tensor, y: Tensor, precision: ProductPrecision, *,
            out: Tensor | None = None) -> Tensor:
    """``x @ y`` (``[m, d] x [d, n]``) with the operands at ``precision`` and float32 (or
    float64) accumulation and result; with ``out``, ``out += x @ y`` in place (returned).

    Not differentiable where it rounds (the tile loop calls it inside its own autograd
    function); :func:`logits_product` is.
    """
    if out is None:
        return _mm(x, y, precision)
    if precision == "ieee":
        return out.addmm_(x, y)
    return out.add_(_mm(x, y, precision))


class _Product(torch.autograd.Function):
    """``a @ k.T`` at a rounded precision, whose backward products take the same precision
    (``dA = G @ K``, ``dK = G.T @ A``), as the tile loop's and the kernel's do."""

    @staticmethod
    def forward(ctx, a: Tensor, k: Tensor, precision: str) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(a, k)
        ctx.precision = precision
        return _mm(a, k.T, precision)

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        a, k = ctx.saved_tensors
        ga = _mm(g, k, ctx.precision).to(a.dtype) if ctx.needs_input_grad[0] else None
        gk = _mm(g.T, a, ctx.precision).to(k.dtype) if ctx.needs_input_grad[1] else None
        return ga, gk, None


def logits_product(a: Tensor, k: Tensor, precision: ProductPrecision) -> Tensor:
    """``a @ k.T`` (``[A, D] x [C, D] -> [A, C]``) at ``precision``, differentiable in ``a``
    and ``k``: the one product of every materialised logit matrix. ``"ieee"`` is ``a @ k.T``
    itself (autograd's own backward, bit for bit as before)."""
    if precision == "ieee":
        return a @ k.T
    return _Product.apply(a, k, precision)


class _Gathered(torch.autograd.Function):
    """:func:`gathered_product` at a rounded precision; its backward rounds its operands as
    :class:`_Product`'s does (the upstream gradient included)."""

    @staticmethod
    def forward(ctx, a: Tensor, k: Tensor, precision: str) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(a, k)
        ctx.precision = precision
        return torch.einsum("ad,akd->ak", rounded(a, precision), rounded(k, precision))

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        a, k = ctx.saved_tensors
        g = rounded(g, ctx.precision)
        ga = (torch.einsum("ak,akd->ad", g, rounded(k, ctx.precision))
              if ctx.needs_input_grad[0] else None)
        gk = (torch.einsum("ak,ad->akd", g, rounded(a, ctx.precision))
              if ctx.needs_input_grad[1] else None)
        return ga, gk, None


def gathered_product(a: Tensor, k: Tensor, precision: ProductPrecision) -> Tensor:
    """``[A, D] x [A, K, D] -> [A, K]``: each anchor against its own gathered columns (the
    top-K ones), rounded as :func:`logits_product` rounds (forward and backward), so a gathered
    logit and its gradient are those of the full product to float32 accumulation.
    ``"ieee"``: the plain ``einsum``."""
    if precision == "ieee":
        return torch.einsum("ad,akd->ak", a, k)
    return _Gathered.apply(a, k, precision)


__all__ = ["ProductPrecision", "PRECISIONS", "product_precision", "on_tensor_cores", "rounded",
           "product", "logits_product", "gathered_product"]
