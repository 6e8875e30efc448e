"""The temperature rules with Lightly's loss signature: Lightly's ``NTXentLoss`` at their
neutral settings (with and without its memory bank), the step and the learned temperature as
state of the loss, one temperature and one queue per head."""

from __future__ import annotations

import io
import math

import pytest
import torch

lightly = pytest.importorskip("lightly")

import lightly.loss as lightly_loss  # noqa: E402

import adaptcl.adapters.lightly as ours  # noqa: E402
from adaptcl.plugins import InfoNCELoss, cosine_temperature  # noqa: E402

OUT = 16


def _pair(n=8, d=OUT, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, d, generator=g).requires_grad_(),
            torch.randn(n, d, generator=g).requires_grad_())


def _same_as_lightly(mine, theirs, steps=4):
    """Both losses on the same embeddings for a few steps (their banks fill alike)."""
    for step in range(steps):
        z0, z1 = _pair(seed=step)
        a, b = mine(z0, z1), theirs(z0, z1)
        torch.testing.assert_close(a, b)
        for ga, gb in zip(torch.autograd.grad(a, (z0, z1)), torch.autograd.grad(b, (z0, z1)),
                          strict=True):
            torch.testing.assert_close(ga, gb)


@pytest.mark.parametrize("bank", [0, (24, OUT)])
def test_a_schedule_with_equal_bounds_is_lightlys_ntxent(bank):
    torch.manual_seed(0)  # Lightly's random initial bank rows
    theirs = lightly_loss.NTXentLoss(0.2, memory_bank_size=bank)
    torch.manual_seed(0)
    mine = ours.TemperatureScheduleLoss(0.2, 0.2, 10, memory_bank_size=bank)
    mine.step = 7
    _same_as_lightly(mine, theirs)


@pytest.mark.parametrize("bank", [0, (24, OUT)])
def test_a_learnable_temperature_before_any_update_is_lightlys_ntxent(bank):
    torch.manual_seed(0)
    mine = ours.LearnableTemperatureLoss(0.1, memory_bank_size=bank)
    torch.manual_seed(0)
    theirs = lightly_loss.NTXentLoss(float(mine.temperature), memory_bank_size=bank)
    _same_as_lightly(mine, theirs)


def test_the_schedule_follows_its_step_and_saves_it():
    loss_fn = ours.TemperatureScheduleLoss(0.1, 1.0, 8, memory_bank_size=(16, OUT),
                                           persistent_memory_bank=True)
    z0, z1 = _pair()
    for step in range(10):
        assert loss_fn.step == step
        loss_fn(z0, z1)
        want = cosine_temperature(step, 0.1, 1.0, 8)
        assert loss_fn.last_stats["temperature"].item() == pytest.approx(want, rel=1e-6)
        assert loss_fn.temperature == want
        assert loss_fn.advance() == step + 1
    buffer = io.BytesIO()
    torch.save(loss_fn.state_dict(), buffer)
    buffer.seek(0)
    resumed = ours.TemperatureScheduleLoss(0.1, 1.0, 8, memory_bank_size=(16, OUT),
                                           persistent_memory_bank=True)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert resumed.step == 10
    torch.testing.assert_close(resumed.memory_bank.bank, loss_fn.memory_bank.bank)
    with pytest.raises(ValueError, match="step"):
        loss_fn.step = -1
    assert "period=8, step=10" in repr(loss_fn)
    later = ours.TemperatureScheduleLoss(0.1, 1.0, 8, step=5)  # a run that starts mid-schedule
    assert later.step == 5 and later.temperature == cosine_temperature(5, 0.1, 1.0, 8)


def test_the_learned_temperature_is_a_parameter_of_the_loss():
    loss_fn = ours.LearnableTemperatureLoss(0.07)
    assert [n for n, _ in loss_fn.named_parameters()] == ["criterion.logit_scale"]
    assert loss_fn.logit_scale is loss_fn.criterion.logit_scale
    optimizer = torch.optim.SGD(loss_fn.parameters(), lr=1.0)
    z0, z1 = _pair()
    before = loss_fn.logit_scale.item()
    loss_fn(z0, z1).backward()
    optimizer.step()
    assert loss_fn.logit_scale.item() != before
    state = loss_fn.state_dict()
    assert "criterion.logit_scale" in state
    other = ours.LearnableTemperatureLoss(0.5)
    other.load_state_dict(state)
    # the step left s out of its bounds; the checkpoint holds it clamped, as open_clip's after
    # its clamp_, and the next forward of both is the same
    low, high = 0.0, math.log(100)
    assert other.logit_scale.item() == loss_fn.logit_scale.detach().clamp(low, high).item()
    torch.testing.assert_close(other(z0, z1), loss_fn(z0, z1), rtol=0, atol=0)
    with torch.no_grad():
        loss_fn.logit_scale.fill_(10.0)
    assert loss_fn.clamp_().logit_scale.item() == pytest.approx(math.log(100))


def test_one_temperature_and_one_queue_per_head():
    torch.manual_seed(0)
    loss_fn = ours.LearnableTemperatureLoss(0.2, memory_bank_size=(12, OUT), num_heads=2)
    assert loss_fn.memory_bank.size == (12, 2 * OUT) and loss_fn.logit_scale.shape == (2,)
    with torch.no_grad():
        loss_fn.logit_scale.copy_(torch.tensor([1.0, 2.5]))
    g = torch.Generator().manual_seed(1)
    z0, z1 = torch.randn(2, 4, OUT, generator=g), torch.randn(2, 4, OUT, generator=g)
    bank = loss_fn.memory_bank.bank.clone()  # [12, 2 * D]: head h is columns h*D:(h+1)*D
    loss = loss_fn(z0, z1)
    want = sum(InfoNCELoss(math.exp(-s), form="queue")(z0[h], z1[h], bank[:, h * OUT:(h + 1) * OUT])
               for h, s in enumerate((1.0, 2.5)))
    torch.testing.assert_close(loss, want)
    with pytest.raises(ValueError, match="got 3 heads, the loss was built for 2"):
        loss_fn(torch.randn(3, 4, OUT), torch.randn(3, 4, OUT))


def test_amcl_keeps_its_multi_head_bank():
    """AMCL's bank logic now lives in MultiHeadBankLoss, shared with the learned temperature."""
    loss_fn = ours.AMCLLoss(dim=8, num_heads=2, memory_bank_size=(6, 8))
    assert isinstance(loss_fn, ours.MultiHeadBankLoss) and loss_fn.num_heads == 2
    assert loss_fn.memory_bank.size == (6, 16)
    g = torch.Generator().manual_seed(2)
    assert torch.isfinite(loss_fn(torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)))
