"""Gradient caching under DDP on two gloo processes: each rank caches its half of the batch, the
loss gathers the columns with their gradients, DDP averages; every parameter's gradient equals
the single-process uncached full-batch step's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from adaptcl.plugins import InfoNCELoss, MACLLoss, cached_forward

from .._distributed import gloo_results

WORLD, N, D_IN = 2, 8, 6
LOSSES = {"nt_xent": lambda gather: InfoNCELoss(0.2, gather_distributed=gather),
          "macl": lambda gather: MACLLoss(0.1, 0.5, 0.0, gather_distributed=gather)}


def _encoder() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D_IN, 16), nn.LayerNorm(16), nn.ReLU(),
                         nn.Linear(16, 4)).double()


class _TwoViews(nn.Module):
    """What DDP wraps: the cached calls run inside its forward, as in Lightning's
    ``training_step``, so the reducer expects the backward."""

    def __init__(self, encoder: nn.Module, mini_batch_size: int) -> None:
        super().__init__()
        self.encoder, self.mini_batch_size = encoder, mini_batch_size

    def forward(self, x0: torch.Tensor, x1: torch.Tensor):
        return (cached_forward(self.encoder, x0, self.mini_batch_size),
                cached_forward(self.encoder, x1, self.mini_batch_size))


def _batch():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(WORLD * N, D_IN, generator=g, dtype=torch.float64),
            torch.randn(WORLD * N, D_IN, generator=g, dtype=torch.float64))


def _rank_gradients(rank: int) -> dict[str, list]:
    """Each loss's encoder gradients on ``rank``, its half of the batch cached under DDP."""
    x0, x1 = (x[rank * N:(rank + 1) * N] for x in _batch())
    out = {}
    for name, make in LOSSES.items():
        model = nn.parallel.DistributedDataParallel(_TwoViews(_encoder(), 3))
        make(True)(*model(x0, x1)).backward()
        out[name] = [p.grad.tolist() for p in model.module.encoder.parameters()]
    return out


@pytest.mark.slow  # two processes, ~10 s
def test_two_ranks_cached_equal_single_process_full_batch():
    results = gloo_results(_rank_gradients, WORLD)
    x0, x1 = _batch()
    for name, make in LOSSES.items():
        encoder = _encoder()
        make(False)(encoder(x0), encoder(x1)).backward()
        for rank in range(WORLD):
            for got, param in zip(results[rank][name], encoder.parameters(), strict=True):
                torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), param.grad,
                                           rtol=0.0, atol=1e-10)
