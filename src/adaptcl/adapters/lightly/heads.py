"""AMCL's multi-head projections in the style of ``lightly.models.modules.heads``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from adaptcl.plugins import amcl as _amcl
from adaptcl.plugins.validation import check_int

__all__ = ["AMCLProjectionHead", "PairTemperature"]

#: AMCL's shared pair-temperature network (re-exported from the core).
PairTemperature = _amcl.PairTemperature


class AMCLProjectionHead(nn.Module):
    """C projection heads of one Lightly architecture with independent weights (AMCL Sec. 4.2).

    ``forward`` maps backbone features ``[B, F]`` to ``[C, B, D]``. Given ``[C, B, D]`` (the
    output of another multi-head, e.g. SimSiam's projection before its prediction head) head
    ``c`` is applied to slice ``c``. Build it from any Lightly head class::

        AMCLProjectionHead.from_lightly(SimCLRProjectionHead, num_heads=3,
                                        input_dim=512, hidden_dim=2048, output_dim=128)

    - [0] Wang et al., Adaptive Multi-head Contrastive Learning, ECCV 2024,
      https://arxiv.org/abs/2310.05615

    Args:
        heads: the C head modules (same architecture, separate weights).

    Examples:
        >>> from lightly.models.modules import SimCLRProjectionHead
        >>> heads = AMCLProjectionHead.from_lightly(SimCLRProjectionHead, num_heads=3,
        ...                                         input_dim=512, output_dim=128)
        >>> z = heads(torch.randn(8, 512))      # [3, 8, 128]
    """

    def __init__(self, heads: Sequence[nn.Module]) -> None:
        super().__init__()
        heads = list(heads)
        if not heads:
            raise ValueError("AMCLProjectionHead needs at least one head")
        self.heads = nn.ModuleList(heads)

    @classmethod
    def from_lightly(cls, head_class: type[nn.Module], num_heads: int = 2,
                     **head_kwargs: Any) -> AMCLProjectionHead:
        """``num_heads`` freshly initialised ``head_class(**head_kwargs)`` heads."""
        check_int("num_heads", num_heads, 1)
        return cls([head_class(**head_kwargs) for _ in range(num_heads)])

    @property
    def num_heads(self) -> int:
        return len(self.heads)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim == 3:
            if x.shape[0] != len(self.heads):
                raise ValueError(f"got {x.shape[0]} head slices for {len(self.heads)} heads")
            return torch.stack([head(xc) for head, xc in zip(self.heads, x, strict=True)])
        if x.ndim != 2:
            raise ValueError(f"expected [batch, features] or [heads, batch, dim], got {tuple(x.shape)}")
        return torch.stack([head(x) for head in self.heads])
