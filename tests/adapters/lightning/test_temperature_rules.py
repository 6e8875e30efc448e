"""The temperature rules in the Lightning modules: ``global_step`` drives the schedule (and
resumes it), the learned temperature is a parameter of the module, its optimiser (without
weight decay) and its checkpoints; both are built by name for SimCLR and MoCo."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

pl = pytest.importorskip("pytorch_lightning")
pytest.importorskip("lightly")

from adaptcl.adapters.lightly import (  # noqa: E402
    LearnableTemperatureLoss,
    NTXentLoss,
    TemperatureScheduleLoss,
)
from adaptcl.adapters.lightning.backbones import small_cnn  # noqa: E402
from adaptcl.adapters.lightning.factory import build_ssl_module  # noqa: E402
from adaptcl.adapters.lightning.methods import METHOD_LOSSES  # noqa: E402
from adaptcl.adapters.lightning.modules import MoCoV2Module, SimCLRModule  # noqa: E402
from adaptcl.plugins import cosine_temperature  # noqa: E402

N_IMAGES, BATCH = 32, 8  # 4 steps per epoch
PERIOD = 5


class _FixedViews(Dataset):
    """Two fixed noisy views per image: epochs see the same batches, in a resumed run too."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.randn(N_IMAGES, 3, 16, 16, generator=g)
        self.noise = 0.1 * torch.randn(2, N_IMAGES, 3, 16, 16, generator=g)

    def __len__(self) -> int:
        return N_IMAGES

    def __getitem__(self, i):
        return [self.images[i] + self.noise[0, i], self.images[i] + self.noise[1, i]], i % 4


def _fit(module, tmp_path, *, epochs=2, ckpt_path=None):
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, filename="{epoch}", save_top_k=-1,
                                              every_n_epochs=1)
    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                         callbacks=[checkpoint], enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(module, DataLoader(_FixedViews(), batch_size=BATCH, drop_last=True),
                ckpt_path=ckpt_path)
    return trainer


def _simclr(criterion, seed=0):
    torch.manual_seed(seed)
    backbone, dim = small_cnn(width=4)
    return SimCLRModule(backbone, dim, criterion, hidden_dim=16, output_dim=8, num_classes=4,
                        lr=0.05)


def test_global_step_drives_the_schedule_and_a_resumed_run_continues_it(tmp_path):
    whole = _simclr(TemperatureScheduleLoss(0.1, 1.0, PERIOD))
    _fit(whole, tmp_path / "whole")
    steps = 2 * N_IMAGES // BATCH
    assert [h["step"] for h in whole.history] == list(range(steps))
    taus = [h["temperature"] for h in whole.history]
    assert taus == pytest.approx([cosine_temperature(k, 0.1, 1.0, PERIOD) for k in range(steps)],
                                 rel=1e-6)
    saved = torch.load(tmp_path / "whole" / "epoch=0.ckpt", weights_only=False)["state_dict"]
    assert saved["criterion.criterion._extra_state"].item() == N_IMAGES // BATCH - 1

    # resumed in a fresh module whose schedule starts at 0: Lightning restores global_step
    resumed = _simclr(TemperatureScheduleLoss(0.1, 1.0, PERIOD), seed=1)
    _fit(resumed, tmp_path / "resumed", ckpt_path=tmp_path / "whole" / "epoch=0.ckpt")
    assert resumed.resumed_from["checkpoint_global_step"] == N_IMAGES // BATCH
    assert [h["temperature"] for h in resumed.history] == pytest.approx(taus, rel=1e-6)
    assert resumed.criterion.step == steps - 1
    for key, value in whole.state_dict().items():  # and the weights end where they did
        torch.testing.assert_close(resumed.state_dict()[key], value, msg=key)


def test_the_learned_temperature_is_optimised_checkpointed_and_restored(tmp_path):
    whole = _simclr(LearnableTemperatureLoss(0.1))
    start = whole.criterion.logit_scale.detach().clone()
    assert any(p is whole.criterion.logit_scale for p in whole.parameters())
    trainer = _fit(whole, tmp_path / "whole")
    groups = trainer.optimizers[0].param_groups
    assert [p is whole.criterion.logit_scale for p in groups[1]["params"]] == [True]
    assert groups[1]["weight_decay"] == 0.0 and groups[0]["weight_decay"] == whole.weight_decay
    assert not torch.equal(whole.criterion.logit_scale.detach(), start)  # it trained
    taus = [h["temperature"] for h in whole.history]
    assert taus[0] == pytest.approx(0.1, rel=1e-6) and len(set(taus)) == len(taus)

    saved = torch.load(tmp_path / "whole" / "epoch=0.ckpt", weights_only=False)["state_dict"]
    s = saved["criterion.criterion.logit_scale"]
    resumed = _simclr(LearnableTemperatureLoss(0.3), seed=1)
    _fit(resumed, tmp_path / "resumed", ckpt_path=tmp_path / "whole" / "epoch=0.ckpt")
    first = resumed.history[N_IMAGES // BATCH]  # the first step after the restart
    assert first["temperature"] == pytest.approx(math.exp(-float(s)), rel=1e-6)
    torch.testing.assert_close(resumed.criterion.logit_scale, whole.criterion.logit_scale)


def test_without_a_learned_temperature_the_optimiser_has_one_group():
    module = _simclr(NTXentLoss(0.1))
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    module.trainer = trainer
    module.lr_schedule = "constant"
    optimizer = module.configure_optimizers()
    assert len(optimizer.param_groups) == 1


@pytest.mark.parametrize("method", ["simclr", "moco"])
def test_both_rules_are_built_by_name_with_the_papers_settings(method):
    assert {"temperature_schedule", "learnable_temperature"} <= set(METHOD_LOSSES[method])
    kwargs = dict(width=0.0625, hidden_dim=32, output_dim=16, queue_size=32, num_classes=4)
    sched = build_ssl_module(method, "temperature_schedule", **kwargs)
    assert type(sched) is {"simclr": SimCLRModule, "moco": MoCoV2Module}[method]
    core = sched.criterion.criterion
    assert (core.min_temperature, core.max_temperature, core.period) == (0.1, 1.0, 400)
    assert sched.criterion.uses_memory_bank == (method == "moco")
    learned = build_ssl_module(method, "learnable_temperature", temperature=0.07, **kwargs)
    assert learned.criterion.temperature.item() == pytest.approx(0.07, rel=1e-6)
    assert (learned.criterion.criterion.min_temperature,
            learned.criterion.criterion.max_temperature) == (0.01, 1.0)
    custom = build_ssl_module(method, "temperature_schedule", temperature=0.2,
                              max_temperature=0.5, period=60, **kwargs)
    core = custom.criterion.criterion
    assert (core.min_temperature, core.max_temperature, core.period) == (0.2, 0.5, 60)
