"""Multi-head projections: AMCL's ``C`` projection heads and the ``[C, N, D]`` layout its losses
take.

Reference:
    Wang, Koniusz et al., "Adaptive Multi-head Contrastive Learning", ECCV 2024
    (arXiv:2310.05615), Sec. 4: ``C`` heads of the same architecture with separate weights;
    the loss is the sum of the per-head losses.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .validation import check_int


class MultiHeadProjection(nn.Module):
    """C independent projection heads (same architecture, separate weights), stacked.

    Each head is SimCLR's: ``num_layers - 1`` hidden blocks ``Linear -> BatchNorm1d -> ReLU``
    (the BatchNorm only with ``batch_norm=True``) and a final ``Linear``; ``num_layers=2`` is
    ``Linear -> BatchNorm1d -> ReLU -> Linear``. Output shape ``[C, B, output_dim]``.

    Examples:
        >>> heads = MultiHeadProjection(512, 512, 128, num_heads=3)
        >>> z = heads(torch.randn(8, 512))  # [3, 8, 128]
    """

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_heads: int = 2,
                 num_layers: int = 2, batch_norm: bool = True) -> None:
        super().__init__()
        check_int("input_dim", input_dim, 1)
        check_int("hidden_dim", hidden_dim, 1)
        check_int("output_dim", output_dim, 1)
        self.num_heads = check_int("num_heads", num_heads, 1)
        check_int("num_layers", num_layers, 1)

        def head() -> nn.Sequential:
            layers: list[nn.Module] = []
            d = input_dim
            for _ in range(num_layers - 1):
                layers.append(nn.Linear(d, hidden_dim, bias=not batch_norm))
                if batch_norm:
                    layers.append(nn.BatchNorm1d(hidden_dim))
                layers.append(nn.ReLU(inplace=True))
                d = hidden_dim
            layers.append(nn.Linear(d, output_dim))
            return nn.Sequential(*layers)

        self.heads = nn.ModuleList(head() for _ in range(num_heads))

    def forward(self, x: Tensor) -> Tensor:
        return torch.stack([h(x) for h in self.heads])


def as_heads(name: str, z: Tensor) -> Tensor:
    """``z`` as ``[heads, batch, dim]``: a ``[batch, dim]`` tensor is one head; any other shape
    is a ``ValueError`` naming the argument."""
    if isinstance(z, Tensor) and z.ndim == 2:
        return z.unsqueeze(0)
    if not isinstance(z, Tensor) or z.ndim != 3:
        raise ValueError(f"{name} must have shape [batch, dim] or [heads, batch, dim], got "
                         f"{tuple(z.shape) if isinstance(z, Tensor) else type(z).__name__}")
    return z


__all__ = ["MultiHeadProjection", "as_heads"]
