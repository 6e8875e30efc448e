"""Two gloo processes give the single-process full-batch loss and gradients for the temperature
rules: the schedule (every rank computes tau from the same step) and the learnable temperature
(each rank's gradient wrt ``s`` is its anchors' share: DDP's average over ranks is the full
batch's), as ``test_distributed.py`` checks the other losses."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from adaptcl.plugins import LearnableTemperatureLoss, TemperatureScheduleLoss

from .._distributed import spawn_results

WORLD = 2
N, D = 6, 8

CASES = {
    "schedule": lambda gather: TemperatureScheduleLoss(0.1, 1.0, 20, step=6,
                                                       gather_distributed=gather),
    "schedule_graphcl": lambda gather: TemperatureScheduleLoss(
        0.2, 0.5, 20, step=13, form="cross_view", positive_in_denominator=False,
        gather_distributed=gather),
    "learnable": lambda gather: _learnable(gather, form="nt_xent"),
    "learnable_clip": lambda gather: _learnable(gather, form="cross_view_symmetric"),
    "learnable_tiled": lambda gather: _learnable(gather, form="cross_view", tile_size=4),
}


def _learnable(gather: bool, **kwargs) -> LearnableTemperatureLoss:
    loss_fn = LearnableTemperatureLoss(0.1, gather_distributed=gather, **kwargs)
    with torch.no_grad():
        loss_fn.logit_scale.fill_(1.7)  # away from its initial value, inside the bounds
    return loss_fn


def _full_batch():
    g = torch.Generator().manual_seed(0)
    return torch.randn(WORLD * N, D, generator=g), torch.randn(WORLD * N, D, generator=g)


def _worker(rank: int, port: int, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        z0_all, z1_all = _full_batch()
        out = {}
        for name, make in CASES.items():
            z0 = z0_all[rank * N:(rank + 1) * N].clone().requires_grad_()
            z1 = z1_all[rank * N:(rank + 1) * N].clone().requires_grad_()
            fn = make(True)
            loss = fn(z0, z1)
            loss.backward()
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss)
            params = [p.grad.clone() for p in fn.parameters()]
            for g in params:  # what DDP does with a parameter's gradient
                dist.all_reduce(g)
            out[name] = {"loss": (mean_loss / WORLD).item(),
                         "g0": (z0.grad / WORLD).tolist(), "g1": (z1.grad / WORLD).tolist(),
                         "params": [(g / WORLD).tolist() for g in params],
                         "temperature": fn.last_stats["temperature"].item()}
        results[rank] = out
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def distributed_results():
    return spawn_results(_worker, WORLD)


@pytest.mark.slow  # the module fixture starts two processes (~10 s)
@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_equal_single_process(distributed_results, name):
    z0_all, z1_all = _full_batch()
    z0, z1 = z0_all.clone().requires_grad_(), z1_all.clone().requires_grad_()
    fn = CASES[name](False)
    loss = fn(z0, z1)
    loss.backward()
    params = [p.grad for p in fn.parameters()]
    assert len(params) == name.startswith("learnable")
    for rank in range(WORLD):
        got = distributed_results[rank][name]
        assert got["loss"] == pytest.approx(loss.item(), rel=1e-5, abs=1e-6)
        sl = slice(rank * N, (rank + 1) * N)
        torch.testing.assert_close(torch.tensor(got["g0"]), z0.grad[sl], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(torch.tensor(got["g1"]), z1.grad[sl], rtol=1e-4, atol=1e-6)
        for g, want in zip(got["params"], params, strict=True):
            torch.testing.assert_close(torch.tensor(g), want, rtol=1e-4, atol=1e-6)
        assert got["temperature"] == pytest.approx(fn.last_stats["temperature"].item(), rel=1e-6)
