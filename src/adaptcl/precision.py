"""Training precision by name, as Lightning spells it: ``"32"``, ``"bf16-mixed"``, ``"16-mixed"``.

The one list of precision names of the package, and the one ``torch.autocast`` built from a
name, for every layer that runs a model in mixed precision (the GraphCL loop, the SentEval
encoders, the recipes). Under any of them the loss core normalises, accumulates and reduces in
float32; the products that form its logits take the inputs' precision (bf16 operands under
``bf16-mixed``, fp16 under ``16-mixed``; :mod:`adaptcl.plugins._products`).

>>> check_precision("bf16-mixed")
'bf16-mixed'
>>> check_precision("fp16")
Traceback (most recent call last):
...
ValueError: precision must be one of 32, bf16-mixed, 16-mixed, got 'fp16'
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal, get_args

__all__ = ["Precision", "PRECISIONS", "autocast", "autocast_dtype", "check_precision"]

#: ``32`` (float32), ``bf16-mixed`` (bfloat16 autocast), ``16-mixed`` (float16 autocast with a
#: gradient scaler)
Precision = Literal["32", "bf16-mixed", "16-mixed"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)


def check_precision(precision: Any) -> str:
    """``precision`` as a name of :data:`PRECISIONS`, or ``ValueError`` naming it."""
    if str(precision) not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return str(precision)


def autocast_dtype(precision: Precision) -> Any:
    """The autocast dtype of ``precision`` (``None`` for ``32``: no autocast)."""
    import torch

    return {"32": None, "bf16-mixed": torch.bfloat16,
            "16-mixed": torch.float16}[check_precision(precision)]


def autocast(device: Any, precision: Precision) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` in the dtype of ``precision`` on ``device`` (a device or its name);
    a no-op for ``32``."""
    import torch

    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)
