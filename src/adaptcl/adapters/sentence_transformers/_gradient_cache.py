"""Gradient caching on sentence-transformers' ``CachedLossMixin``: when a loss modifier has
patched the model's forward (no replay then), and the loss's own parameter gradients added in
backward (private to this package)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn


def _unwrap_forward(forward: Any) -> Any:
    """The function under a chain of transparent wrappers: bound methods (``__func__``) and
    decorators that declare what they wrap (``__wrapped__``, set by ``functools.wraps``).

    accelerate's mixed precision (``Accelerator.prepare_model`` with ``bf16``/``fp16``) sets
    ``model.forward`` to ``convert_outputs_to_fp32(autocast(type(model).forward))`` bound to the
    instance, each layer declaring ``__wrapped__`` (its own ``unwrap_model`` peels them the same
    way), so this returns the class's ``forward``.
    """
    seen: set[int] = set()
    while id(forward) not in seen:
        seen.add(id(forward))
        forward = getattr(forward, "__func__", forward)
        inner = getattr(forward, "__wrapped__", None)
        if inner is None:
            break
        forward = inner
    return forward


def _forward_is_patched(model: nn.Module) -> bool:
    """Whether a loss modifier has replaced the model's ``forward`` (or its first module's) on
    the instance for the duration of its own forward pass, as ``AdaptiveLayerLoss`` does. A
    gradient-cache replay in backward would run the unpatched forward, so such a call must embed
    in one pass instead.

    A transparent wrapper of the class's own ``forward`` is not such a patch: accelerate's
    autocast wrapper under ``bf16=True`` / ``fp16=True`` stays in place for the whole run (the
    replay in backward runs it too), so gradient caching stays on there, as in
    ``CachedMultipleNegativesRankingLoss``. ``AdaptiveLayerLoss``'s decorators
    (``ForwardDecorator``, ``TransformerDecorator``) declare no ``__wrapped__`` and are patches.
    """
    model = getattr(model, "_orig_mod", model)
    model = getattr(model, "module", model)  # DistributedDataParallel
    modules = [model]
    if isinstance(model, nn.Sequential) and len(model) > 0:
        modules.append(model[0])
    for module in modules:
        override = vars(module).get("forward")
        # a modifier restores the original as an instance attribute: a bound method of the
        # class's own forward (possibly under accelerate's autocast wrapper) is not a patch
        if override is not None and _unwrap_forward(override) is not type(module).forward:
            return True
    return False


def _apply_loss_parameter_gradients(grad_output: Tensor, params: list[nn.Parameter],
                                    grads: Sequence[Tensor | None]) -> None:
    """Backward hook on a cached loss: add the loss's own parameter gradients (computed with the
    loss in forward) scaled by the outer gradient (AMP scaler, gradient accumulation)."""
    for param, grad in zip(params, grads, strict=True):
        if grad is None:
            continue
        grad = grad * grad_output.to(grad.dtype)
        param.grad = grad if param.grad is None else param.grad + grad
