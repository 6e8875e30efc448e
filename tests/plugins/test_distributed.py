"""Two processes on the gloo backend give the single-process full-batch loss and gradients, and
one temperature: MACL's from the all-reduced alignment, the schedule's from the same step on
every rank, and the learnable one's gradient wrt ``s`` (each rank's is its anchors' share: DDP's
average over ranks is the full batch's)."""

from __future__ import annotations

import pytest
import torch

from adaptcl.plugins import (
    AMCLLoss,
    DCLLoss,
    DySTreSSLoss,
    InfoNCELoss,
    LearnableTemperatureLoss,
    MACLLoss,
    NCELoss,
    PairTemperature,
    TemperatureScheduleLoss,
)

from .._distributed import full_batch, gloo_results, step_on_rank

WORLD = 2
N, D = 6, 8

CASES = {
    "nt_xent": lambda gather: InfoNCELoss(0.2, gather_distributed=gather),
    "cross_view": lambda gather: InfoNCELoss(0.2, form="cross_view", gather_distributed=gather),
    "cross_view_symmetric": lambda gather: InfoNCELoss(0.2, form="cross_view_symmetric",
                                                       gather_distributed=gather),
    "dcl": lambda gather: DCLLoss(0.2, form="cross_view", gather_distributed=gather),
    "macl": lambda gather: MACLLoss(0.1, 0.5, 0.0, gather_distributed=gather),
    "macl_simcse": lambda gather: MACLLoss(0.05, 2.0, 0.8, reweight=False, form="cross_view",
                                           gather_distributed=gather),
    "amcl_topk": lambda gather: AMCLLoss(_temperature_net(), 1e-2, kappa=2,
                                         gather_distributed=gather),
    "amcl_softmax": lambda gather: AMCLLoss(_temperature_net(), 1e-2, negative_term="softmax",
                                            form="cross_view", gather_distributed=gather),
    "nce": lambda gather: NCELoss(0.2, gather_distributed=gather),
    "dystress": lambda gather: DySTreSSLoss(0.1, 0.2, gather_distributed=gather),
    "dystress_piecewise_tiled": lambda gather: DySTreSSLoss(
        0.04, 0.05, shape="piecewise", form="cross_view", tile_size=4, gather_distributed=gather),
    "dystress_graphcl": lambda gather: DySTreSSLoss(
        0.1, 0.2, positive_in_denominator=False, detach_temperature=False, form="cross_view",
        gather_distributed=gather),
    "hardness": lambda gather: InfoNCELoss(0.05, form="cross_view", hardness_mode="all_negatives",
                                           hardness_strength=3.0, gather_distributed=gather),
    "supcon": lambda gather: InfoNCELoss(0.2, gather_distributed=gather),
    "supcon_tiled": lambda gather: InfoNCELoss(0.2, tile_size=5, gather_distributed=gather),
    "supcon_macl": lambda gather: MACLLoss(0.05, 2.0, 0.8, reweight=False, form="cross_view",
                                           gather_distributed=gather),
    "supcon_dystress": lambda gather: DySTreSSLoss(0.1, 0.2, hardness_mode="in_batch_negatives",
                                                   hardness_strength=2.0,
                                                   gather_distributed=gather),
    "schedule": lambda gather: TemperatureScheduleLoss(0.1, 1.0, 20, step=6,
                                                       gather_distributed=gather),
    "schedule_graphcl": lambda gather: TemperatureScheduleLoss(
        0.2, 0.5, 20, step=13, form="cross_view", positive_in_denominator=False,
        gather_distributed=gather),
    "learnable": lambda gather: _learnable(gather, form="nt_xent"),
    "learnable_clip": lambda gather: _learnable(gather, form="cross_view_symmetric"),
    "learnable_tiled": lambda gather: _learnable(gather, form="cross_view", tile_size=4),
}
#: classes of the full batch: each class has pairs on both ranks, so the labels must be
#: gathered with the candidates for a rank to see its positives on the other
LABELS = torch.tensor([0, 1, 2, 0, 1, 3, 0, 2, 2, 4, 1, 0])
LABELLED = {name for name in CASES if name.startswith("supcon")}
#: the losses whose temperature is one for the whole batch, the same on every rank
ONE_TEMPERATURE = ("macl", "schedule", "learnable")


def _call_kwargs(name: str, rows: slice) -> dict:
    return {"labels": LABELS[rows]} if name in LABELLED else {}


def _learnable(gather: bool, **kwargs) -> LearnableTemperatureLoss:
    loss_fn = LearnableTemperatureLoss(0.1, gather_distributed=gather, **kwargs)
    with torch.no_grad():
        loss_fn.logit_scale.fill_(1.7)  # away from its initial value, inside the bounds
    return loss_fn


def _temperature_net() -> PairTemperature:
    """The same AMCL temperature network in every process."""
    torch.manual_seed(1)
    return PairTemperature(D)


def _full_batch():
    return full_batch(N, D, WORLD)


def _rank(rank: int) -> dict:
    """Every case on ``rank``'s rows of the full batch (in a gloo process group)."""
    out = {}
    for name, make in CASES.items():
        fn = make(True)
        out[name] = step_on_rank(fn, _full_batch(), rank, N, WORLD,
                                 **_call_kwargs(name, slice(rank * N, (rank + 1) * N))) | {
            "temperature": fn.last_stats.get("temperature", torch.tensor(0.0)).item()}
    return out


@pytest.fixture(scope="module")
def distributed_results():
    return gloo_results(_rank, WORLD)


@pytest.mark.slow  # the module fixture starts two processes (~10 s), paid by whichever case runs first
@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_equal_single_process(distributed_results, name):
    z0_all, z1_all = _full_batch()
    z0, z1 = z0_all.clone().requires_grad_(), z1_all.clone().requires_grad_()
    fn = CASES[name](False)
    loss = fn(z0, z1, **_call_kwargs(name, slice(None)))
    loss.backward()
    params = [p.grad for p in fn.parameters() if p.grad is not None]
    for rank in range(WORLD):
        got = distributed_results[rank][name]
        assert got["loss"] == pytest.approx(loss.item(), rel=1e-5, abs=1e-6)
        sl = slice(rank * N, (rank + 1) * N)
        torch.testing.assert_close(torch.tensor(got["grads"][0]), z0.grad[sl], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(torch.tensor(got["grads"][1]), z1.grad[sl], rtol=1e-4, atol=1e-6)
        for g, want in zip(got["params"], params, strict=True):  # AMCL's net, a learned tau
            torch.testing.assert_close(torch.tensor(g), want, rtol=1e-4, atol=1e-6)
        if name.startswith(ONE_TEMPERATURE):
            assert got["temperature"] == pytest.approx(fn.last_stats["temperature"].item(),
                                                       rel=1e-6)


def test_amcl_honours_gather_fn():
    """A gather that appends another rank's keys makes them negatives, as for InfoNCE."""
    g = torch.Generator().manual_seed(2)
    z0, z1, other = (torch.randn(N, D, generator=g) for _ in range(3))
    other_rank = torch.nn.functional.normalize(other, dim=1)

    def gather_fn(x):
        return [x, other_rank]

    gathered = AMCLLoss(_temperature_net(), 1e-2, kappa=2, form="cross_view", gather_fn=gather_fn)
    with_queue = AMCLLoss(_temperature_net(), 1e-2, kappa=2, form="cross_view")
    torch.testing.assert_close(gathered(z0, z1), with_queue(z0, z1, negatives=other))
