"""Distributed helpers in plain ``torch.distributed`` (the core imports no framework).

Adapters may pass their framework's own gather (e.g. ``lightly.utils.dist.gather``) instead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

GatherFn = Callable[[Tensor], "list[Tensor] | tuple[Tensor, ...]"]


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward sums every rank's gradient for the local slice.

    With DDP averaging gradients over ranks this gives the gradient of the global mean loss.
    """

    @staticmethod
    def forward(ctx, x: Tensor) -> tuple[Tensor, ...]:  # type: ignore[override]
        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x.contiguous())
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads: Tensor) -> Tensor:  # type: ignore[override]
        stacked = torch.stack(grads)
        dist.all_reduce(stacked)
        return stacked[dist.get_rank()]


def gather_with_grad(x: Tensor) -> list[Tensor]:
    """Gather ``x`` from every rank, keeping the autograd graph for the local part."""
    if not is_distributed():
        return [x]
    return list(_GatherWithGrad.apply(x))


def all_reduce_mean(x: Tensor) -> Tensor:
    """Mean of a (detached) tensor over ranks, so every rank uses the same value."""
    if not is_distributed():
        return x
    x = x.detach().clone()
    dist.all_reduce(x)
    return x / dist.get_world_size()
