"""The precision of the products ``a @ k.T``: one policy for every backend.

The tiles' cost is their products; on a GPU they are fast only on tensor cores, whose operands
are bf16, fp16 or TF32. The policy (as PyTorch's own matmuls and Apple's Cut Cross-Entropy):

* bfloat16 / float16 inputs (autocast, the usual GPU case) multiply in that dtype, with float32
  accumulation;
* float32 inputs follow :func:`torch.get_float32_matmul_precision`: ``"highest"`` (PyTorch's
  default) is IEEE float32, ``"high"`` TF32, ``"medium"`` bf16;
* float64 is exact.

Normalisation, temperatures, the log-sum-exp and every gradient stay float32 (float64 when
given): only the operands of the products are rounded.

Example:
    >>> import torch
    >>> product_precision(torch.bfloat16)
    'bf16'
    >>> product_precision(torch.float32)  # at PyTorch's default "highest"
    'ieee'
"""

from __future__ import annotations

from typing import Literal

import torch

#: the operands of the products: IEEE (float32 or float64 as given), TF32, bf16 or fp16
ProductPrecision = Literal["ieee", "tf32", "bf16", "fp16"]

_FLOAT32 = {"highest": "ieee", "high": "tf32", "medium": "bf16"}


def product_precision(input_dtype: torch.dtype) -> ProductPrecision:
    """The precision of the products for embeddings that came in as ``input_dtype`` (the dtype
    the caller passed, before the loss normalised them in float32)."""
    if input_dtype == torch.bfloat16:
        return "bf16"
    if input_dtype == torch.float16:
        return "fp16"
    if input_dtype == torch.float32:
        return _FLOAT32[torch.get_float32_matmul_precision()]
    return "ieee"


def on_tensor_cores(precision: ProductPrecision) -> bool:
    """Whether products at ``precision`` run on a GPU's tensor cores (all but IEEE)."""
    return precision != "ieee"


__all__ = ["ProductPrecision", "product_precision", "on_tensor_cores"]
