"""The cosine temperature schedule (Kukleva et al., ICLR 2023): the authors' formula, a float64
reference written from it, the exact reduction to InfoNCE, the step as state, its drivers.

(Tiled == materialised, functional == module, gradchecks and the hostile inputs run on the
table's ``schedule*`` cases in ``_helpers.LOSSES``; two processes in
``test_distributed.py``.)
"""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn

from adaptcl.plugins import (
    DCLLoss,
    InfoNCELoss,
    TemperatureScheduleLoss,
    advance_schedules,
    cosine_temperature,
    set_schedule_step,
    temperature_schedule,
)

from ._helpers import pair

D64 = torch.float64


def _authors_tau(epoch: int, tau_min: float, tau_max: float, t_max: int) -> float:
    """Annusha/temperature_schedules, ``train_simCLR.py`` (``--adj_tau cos``), as written there:
    ``min_tau + 0.5 * (max_tau - min_tau) * (1 + cos(pi * epoch / t_max))``."""
    return tau_min + 0.5 * (tau_max - tau_min) * (1 + math.cos(math.pi * epoch / t_max))


def test_the_schedule_is_the_authors_cosine_with_period_twice_their_t_max():
    for step in range(0, 1300, 7):
        assert cosine_temperature(step, 0.1, 1.0, 400) == pytest.approx(
            _authors_tau(step, 0.1, 1.0, 200), rel=1e-12, abs=1e-12)
    assert cosine_temperature(0, 0.1, 1.0, 400) == 1.0  # tau_max at the first step
    assert cosine_temperature(200, 0.1, 1.0, 400) == 0.1  # tau_min half a period later
    # exactly periodic however long the run (the phase is reduced before the cosine)
    for step in (0, 3, 117, 399):
        assert cosine_temperature(step + 400 * 1000, 0.1, 1.0, 400) == \
            cosine_temperature(step, 0.1, 1.0, 400)
    assert cosine_temperature(123, 0.3, 0.3, 400) == 0.3


def test_defaults_are_the_authors_readme_setting():
    loss_fn = TemperatureScheduleLoss()
    assert (loss_fn.min_temperature, loss_fn.max_temperature, loss_fn.period) == (0.1, 1.0, 400)
    assert loss_fn.step == 0 and loss_fn.temperature == 1.0


def _reference_nt_xent(z0, z1, tau, *, positive_in_denominator=True):
    """SimCLR's NT-Xent written from the formula in float64: 2N anchors, each against the other
    2N - 1 embeddings; DCL drops the positive from the denominator."""
    z = torch.cat([z0, z1]).to(D64)
    z = z / z.norm(dim=1, keepdim=True)
    n = z0.shape[0]
    sim = z @ z.T / tau
    losses = []
    for i in range(2 * n):
        j = (i + n) % (2 * n)
        others = [k for k in range(2 * n) if k != i and (positive_in_denominator or k != j)]
        losses.append(torch.logsumexp(sim[i, others], 0) - sim[i, j])
    return torch.stack(losses).mean()


def _reference_cross_view(z0, z1, tau, *, positive_in_denominator=True):
    a = z0.to(D64) / z0.to(D64).norm(dim=1, keepdim=True)
    b = z1.to(D64) / z1.to(D64).norm(dim=1, keepdim=True)
    sim = a @ b.T / tau
    n = a.shape[0]
    losses = []
    for i in range(n):
        others = [k for k in range(n) if positive_in_denominator or k != i]
        losses.append(torch.logsumexp(sim[i, others], 0) - sim[i, i])
    return torch.stack(losses).mean()


@pytest.mark.parametrize("step", [0, 1, 57, 100, 200, 333, 401])
def test_float64_reference_from_the_papers_formula(step):
    z0, z1 = pair(7, 5, seed=step, dtype=D64)
    tau = _authors_tau(step, 0.1, 1.0, 200)  # the authors' expression, period 400
    got = TemperatureScheduleLoss(0.1, 1.0, 400, step=step)(z0, z1)
    torch.testing.assert_close(got, _reference_nt_xent(z0, z1, tau), rtol=1e-12, atol=1e-12)
    # GraphCL's form: one direction, positive out of the denominator
    got = TemperatureScheduleLoss(0.1, 1.0, 400, step=step, form="cross_view",
                                  positive_in_denominator=False)(z0, z1)
    want = _reference_cross_view(z0, z1, tau, positive_in_denominator=False)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    got = temperature_schedule(z0, z1, 0.1, 1.0, 400, step=step, form="cross_view")
    torch.testing.assert_close(got, _reference_cross_view(z0, z1, tau), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form", ["nt_xent", "cross_view", "cross_view_symmetric", "queue"])
@pytest.mark.parametrize("tile", [None, 3])
def test_equal_bounds_are_infonce_bit_for_bit(form, tile):
    z0, z1 = pair(6, 8, seed=3)
    queue = torch.randn(5, 8, generator=torch.Generator().manual_seed(4))
    for step in (0, 13, 250):
        sched = TemperatureScheduleLoss(0.07, 0.07, 400, step=step, form=form, tile_size=tile)
        for ours, theirs in ((sched, InfoNCELoss(0.07, form=form, tile_size=tile)),
                             (TemperatureScheduleLoss(0.2, 0.2, 9, step=step, form=form,
                                                      positive_in_denominator=False),
                              DCLLoss(0.2, form=form))):
            a, b = ours(z0, z1, queue), theirs(z0, z1, queue)
            torch.testing.assert_close(a, b, rtol=0, atol=0)
            for ga, gb in zip(torch.autograd.grad(a, (z0, z1)), torch.autograd.grad(b, (z0, z1)),
                              strict=True):
                torch.testing.assert_close(ga, gb, rtol=0, atol=0)


def test_at_each_step_the_loss_is_infonce_at_that_steps_temperature():
    z0, z1 = pair(6, 8, seed=5)
    loss_fn = TemperatureScheduleLoss(0.05, 0.5, 10)
    for step in range(12):
        loss_fn.step = step
        tau = 0.05 + 0.45 * (1 + math.cos(2 * math.pi * (step % 10) / 10)) / 2
        torch.testing.assert_close(loss_fn(z0, z1), InfoNCELoss(tau)(z0, z1))
        assert loss_fn.last_stats["temperature"].item() == pytest.approx(tau, rel=1e-6)


def test_the_step_is_state_dict_and_resumes_with_torch_save():
    loss_fn = TemperatureScheduleLoss(0.1, 1.0, 40)
    for _ in range(17):
        loss_fn.advance()
    buffer = io.BytesIO()
    torch.save(loss_fn.state_dict(), buffer)
    buffer.seek(0)
    resumed = TemperatureScheduleLoss(0.1, 1.0, 40)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert resumed.step == 17 and resumed.temperature == loss_fn.temperature
    z0, z1 = pair(5, 4)
    torch.testing.assert_close(resumed(z0, z1), loss_fn(z0, z1), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="_extra_state"):  # strict: the step must be there
        TemperatureScheduleLoss().load_state_dict({})


def test_a_plain_loop_advances_it_like_an_lr_scheduler():
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    loss_fn = TemperatureScheduleLoss(0.1, 1.0, 6)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for _ in range(8):
        x = torch.randn(10, 8)
        loss = loss_fn(model(x), model(x + 0.1 * torch.randn_like(x)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_fn.advance()
        seen.append(loss_fn.last_stats["temperature"].item())
    want = [cosine_temperature(k, 0.1, 1.0, 6) for k in range(8)]
    assert seen == pytest.approx(want, rel=1e-6)
    assert loss_fn.step == 8 and loss_fn.driven


def test_drivers_reach_every_scheduled_loss_inside_a_module():
    inner, other = TemperatureScheduleLoss(), TemperatureScheduleLoss(0.2, 0.4, 10)
    model = nn.ModuleDict({"a": nn.Sequential(nn.Linear(2, 2), inner), "b": other})
    assert not inner.driven
    assert set_schedule_step(model, 30) == 2
    assert inner.step == other.step == 30 and inner.driven and other.driven
    assert advance_schedules(model, 2) == 2 and inner.step == other.step == 32
    assert set_schedule_step(nn.Linear(2, 2), 5) == 0
    with pytest.raises(ValueError, match="step"):
        set_schedule_step(model, -1)


def test_count_step_advances_without_becoming_driven():
    loss_fn = TemperatureScheduleLoss()
    assert loss_fn.count_step() == 1 and loss_fn.step == 1 and not loss_fn.driven
    loss_fn.step = 4
    assert loss_fn.driven


def test_schedule_controls_forward_to_the_core_and_count_only_undriven_training_steps():
    """The one place the adapters (Lightly, open_clip, sentence-transformers) take the
    schedule's controls from: ``step`` / ``advance`` / ``temperature`` are the core's, and a
    forward pass counts a step only with gradients on and while nothing drives the step."""
    from adaptcl.plugins.schedule import ScheduleControls

    class Adapter(ScheduleControls, nn.Module):
        schedule_attribute = "core"

        def __init__(self) -> None:
            super().__init__()
            self.core = TemperatureScheduleLoss(0.1, 1.0, period=8)

    adapter = Adapter()
    with torch.no_grad():
        adapter.count_training_step()
    assert adapter.step == 0  # evaluation is not a training step
    adapter.count_training_step()
    assert adapter.step == adapter.core.step == 1 and not adapter.core.driven
    assert adapter.temperature == adapter.core.temperature == cosine_temperature(1, 0.1, 1.0, 8)
    assert adapter.advance(3) == 4 and adapter.core.driven
    adapter.count_training_step()
    assert adapter.step == 4  # driven: the driver's step stands
    adapter.step = 6
    assert adapter.core.step == 6
    with pytest.raises(ValueError, match="step"):
        adapter.step = -1


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"min_temperature": 0.0}, ValueError, "min_temperature"),
    ({"max_temperature": -1.0}, ValueError, "max_temperature"),
    ({"min_temperature": 0.5, "max_temperature": 0.2}, ValueError, "max_temperature must be >="),
    ({"period": 0}, ValueError, "period"),
    ({"period": 2.5}, TypeError, "period"),
    ({"step": -1}, ValueError, "step"),
    ({"step": True}, TypeError, "step"),
    ({"form": "clip"}, ValueError, "form"),
])
def test_arguments_are_checked_by_module_and_functional(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        TemperatureScheduleLoss(**kwargs)
    with pytest.raises(exc, match=match):
        temperature_schedule(*pair(4, 3), **kwargs)


def test_setting_a_bad_step_names_it():
    loss_fn = TemperatureScheduleLoss()
    with pytest.raises(ValueError, match="step"):
        loss_fn.step = -3
    with pytest.raises(TypeError, match="steps"):
        loss_fn.advance(1.5)
    assert loss_fn.step == 0


def test_repr_shows_the_schedule_and_the_step():
    text = repr(TemperatureScheduleLoss(0.1, 0.9, 50, step=4))
    assert "min_temperature=0.1, max_temperature=0.9, period=50, step=4" in text
