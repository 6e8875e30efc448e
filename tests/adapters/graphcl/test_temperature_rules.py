"""GraphCL + a temperature rule: GraphCL's own loss (DCL, cross-view) with the schedule or the
learned temperature, by name; ``train_epoch`` (a plain loop) and ``GraphCLModule`` drive the
schedule with the same step count and resume it; the learned temperature trains with the
model."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch_geometric")

import torch  # noqa: E402
from torch_geometric.loader import DataLoader  # noqa: E402

from adaptcl.adapters.graphcl import (  # noqa: E402
    LOSS_NAMES,
    GraphCL,
    Identity,
    NodeDrop,
    TUGINEncoder,
    TwoViewDataset,
    graphcl_loss,
    train_epoch,
)
from adaptcl.plugins import (  # noqa: E402
    DCLLoss,
    LearnableTemperatureLoss,
    TemperatureScheduleLoss,
    cosine_temperature,
)
from tests.adapters.graphcl._graphs import random_graphs  # noqa: E402

PERIOD = 4


def _loader(num_graphs=20, batch_size=8):
    """Two-view batches of 8, 8 and 4 graphs: three steps per epoch."""
    views = TwoViewDataset(random_graphs(num_graphs), Identity(),
                           NodeDrop(0.2, generator=torch.Generator().manual_seed(1)))
    return DataLoader(views, batch_size=batch_size, shuffle=True,
                      generator=torch.Generator().manual_seed(2))


def _model(loss, seed=0):
    torch.manual_seed(seed)
    return GraphCL(TUGINEncoder(4, hidden_channels=16, num_layers=3), loss_fn=loss)


def _schedule():
    return graphcl_loss("temperature_schedule", 0.2, max_temperature=0.8, period=PERIOD)


def test_both_rules_by_name_are_graphcls_loss_with_the_rule():
    assert {"temperature_schedule", "learnable_temperature"} <= set(LOSS_NAMES)
    schedule = graphcl_loss("temperature_schedule")
    assert isinstance(schedule, TemperatureScheduleLoss)
    assert (schedule.form, schedule.positive_in_denominator) == ("cross_view", False)
    assert (schedule.min_temperature, schedule.max_temperature, schedule.period) == (0.2, 1.0, 400)
    learned = graphcl_loss("learnable_temperature", 0.1)
    assert isinstance(learned, LearnableTemperatureLoss)
    assert (learned.form, learned.positive_in_denominator) == ("cross_view", False)
    # the neutral settings are GraphCL's own loss
    g = torch.Generator().manual_seed(3)
    z0, z1 = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    flat = graphcl_loss("temperature_schedule", 0.2, max_temperature=0.2)
    torch.testing.assert_close(flat(z0, z1), graphcl_loss("graphcl", 0.2)(z0, z1), rtol=0, atol=0)
    tau = float(learned.temperature)
    torch.testing.assert_close(learned(z0, z1), DCLLoss(tau, form="cross_view")(z0, z1),
                               rtol=0, atol=0)


def test_train_epoch_advances_the_schedule_over_epochs_and_a_saved_state_resumes_it():
    model = _model(_schedule())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    stats: dict[str, list] = {}
    for _ in range(2):
        train_epoch(model, _loader(), optimizer, stats)
    want = [cosine_temperature(k, 0.2, 0.8, PERIOD) for k in range(6)]
    assert stats["temperature"] == pytest.approx(want, rel=1e-6)
    assert model.loss_fn.step == 6

    state = model.state_dict()
    assert state["loss_fn._extra_state"].item() == 6
    resumed = _model(_schedule(), seed=1)
    resumed.load_state_dict(state)
    more: dict[str, list] = {}
    train_epoch(resumed, _loader(), torch.optim.Adam(resumed.parameters(), lr=1e-2), more)
    assert more["temperature"] == pytest.approx(
        [cosine_temperature(k, 0.2, 0.8, PERIOD) for k in range(6, 9)], rel=1e-6)


def test_the_learned_temperature_is_a_model_parameter_and_trains():
    model = _model(graphcl_loss("learnable_temperature", 0.2))
    s = model.loss_fn.logit_scale
    assert any(p is s for p in model.parameters())
    start = s.item()
    stats: dict[str, list] = {}
    train_epoch(model, _loader(), torch.optim.Adam(model.parameters(), lr=5e-2), stats)
    assert s.item() != start
    assert stats["temperature"][0] == pytest.approx(0.2, rel=1e-6)
    # Adam's first step moves every parameter by its lr (m / sqrt(v) = sign(g)), s included
    assert abs(-math.log(stats["temperature"][1]) - start) == pytest.approx(5e-2, rel=1e-4)
    assert "loss_fn.logit_scale" in model.state_dict()


pl = pytest.importorskip("pytorch_lightning")

from adaptcl.adapters.graphcl.lightning import GraphCLModule  # noqa: E402


def _trainer(epochs, tmp_path=None):
    callbacks = []
    if tmp_path is not None:
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=tmp_path, filename="{epoch}",
                                                      save_top_k=-1, every_n_epochs=1))
    return pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                      enable_checkpointing=tmp_path is not None, callbacks=callbacks,
                      enable_progress_bar=False, enable_model_summary=False)


def test_the_lightning_module_drives_the_schedule_as_train_epoch_and_resumes_it(tmp_path):
    reference = _model(_schedule())
    optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2)
    stats: dict[str, list] = {}
    loader = _loader()  # one loader across epochs, as the Trainer has
    for _ in range(2):
        train_epoch(reference, loader, optimizer, stats)

    module = GraphCLModule(_model(_schedule()), lr=1e-2)
    _trainer(2, tmp_path / "whole").fit(module, _loader())
    assert [h["temperature"] for h in module.history] == pytest.approx(stats["temperature"],
                                                                       rel=1e-6)
    assert [h["loss"] for h in module.history] == pytest.approx(stats["loss"], rel=1e-6)

    resumed = GraphCLModule(_model(_schedule(), seed=1), lr=1e-2)
    _trainer(2, tmp_path / "resumed").fit(resumed, _loader(),
                                          ckpt_path=tmp_path / "whole" / "epoch=0.ckpt")
    assert [h["temperature"] for h in resumed.history] == pytest.approx(stats["temperature"],
                                                                        rel=1e-6)
    assert resumed.model.loss_fn.step == 5  # the last of six steps


def test_the_lightning_module_optimises_the_learned_temperature():
    module = GraphCLModule(_model(graphcl_loss("learnable_temperature", 0.2)), lr=5e-2)
    optimizer = module.configure_optimizers()
    assert any(p is module.model.loss_fn.logit_scale for p in optimizer.param_groups[0]["params"])
    start = module.model.loss_fn.logit_scale.item()
    _trainer(1).fit(module, _loader())
    assert module.model.loss_fn.logit_scale.item() != start
    assert module.history[0]["temperature"] == pytest.approx(0.2, rel=1e-6)
