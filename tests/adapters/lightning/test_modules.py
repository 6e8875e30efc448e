"""Lightning modules: every SSL method trains a step with its default and adaptive losses."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

pl = pytest.importorskip("pytorch_lightning")
pytest.importorskip("lightly")

from lightly.loss import NTXentLoss as LightlyNTXentLoss  # noqa: E402
from lightly.models.modules.heads import (  # noqa: E402
    BarlowTwinsProjectionHead,
    MoCoProjectionHead,
    SimCLRProjectionHead,
    SimSiamPredictionHead,
    SimSiamProjectionHead,
)

from adaptcl.adapters.lightly import (  # noqa: E402
    AMCLLoss,
    AMCLProjectionHead,
    MACLLoss,
    NTXentLoss,
    PairTemperature,
)
from adaptcl.adapters.lightning.backbones import cifar_resnet, small_cnn  # noqa: E402
from adaptcl.adapters.lightning.factory import build_ssl_module  # noqa: E402
from adaptcl.adapters.lightning.methods import METHOD_LOSSES  # noqa: E402
from adaptcl.adapters.lightning.modules import (  # noqa: E402
    ASCLMoCoModule,
    BarlowTwinsModule,
    MoCoV2Module,
    SimCLRModule,
    SimSiamModule,
)
from adaptcl.adapters.lightning.trainer import (  # noqa: E402
    AtomicCheckpointIO,
    TrainingClock,
    build_trainer,
)
from adaptcl.plugins import AMCLBarlowTwinsLoss, AMCLSimSiamLoss  # noqa: E402

N_IMAGES, BATCH = 32, 16


class _TwoViews(Dataset):
    """Random 16x16 images with two noisy views (no PIL needed)."""

    def __init__(self, n: int = N_IMAGES, views: bool = True) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.randn(n, 3, 16, 16, generator=g)
        self.labels = torch.arange(n) % 4
        self.views = views

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i):
        x = self.images[i]
        if not self.views:
            return x, self.labels[i]
        return [x + 0.1 * torch.randn_like(x), x + 0.1 * torch.randn_like(x)], self.labels[i]


def _fit(module, epochs: int = 1, knn: bool = True):
    train = DataLoader(_TwoViews(), batch_size=BATCH, shuffle=True, drop_last=True)
    if knn:
        module.set_knn_bank_loader(DataLoader(_TwoViews(views=False), batch_size=BATCH))
    val = DataLoader(_TwoViews(n=16, views=False), batch_size=BATCH) if knn else None
    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         log_every_n_steps=1)
    trainer.fit(module, train_dataloaders=train, val_dataloaders=val)
    return trainer


def _backbone():
    torch.manual_seed(0)
    return small_cnn(width=4)  # feature_dim 16


COMMON = dict(num_classes=4, knn_k=5)


def test_simclr_with_macl_logs_adaptive_quantities_and_knn():
    backbone, dim = _backbone()
    module = SimCLRModule(backbone, dim, MACLLoss(temperature=0.1, alpha=0.5), hidden_dim=16,
                          output_dim=8, **COMMON)
    trainer = _fit(module)
    metrics = trainer.callback_metrics
    for key in ("train_loss", "train_temperature", "train_alignment", "train_mean_w",
                "val_knn_top1"):
        assert key in metrics, key
    assert 0.0 <= float(metrics["val_knn_top1"]) <= 1.0
    assert len(module.history) == N_IMAGES // BATCH
    assert module.history[-1]["temperature"] != pytest.approx(0.1)  # adaptive
    assert module.knn_history and module(torch.randn(2, 3, 16, 16)).shape == (2, dim)


def test_simclr_accepts_lightlys_own_loss():
    backbone, dim = _backbone()
    module = SimCLRModule(backbone, dim, LightlyNTXentLoss(temperature=0.5), hidden_dim=16,
                          output_dim=8, **COMMON)
    trainer = _fit(module, knn=False)
    assert "train_loss" in trainer.callback_metrics
    assert "train_temperature" not in trainer.callback_metrics  # Lightly exposes no stats


def test_moco_momentum_encoder_and_queue():
    backbone, dim = _backbone()
    crit = MACLLoss(0.15, 0.5, 0.2, memory_bank_size=(40, 8))
    module = MoCoV2Module(backbone, dim, crit, hidden_dim=16, output_dim=8, **COMMON)
    before = [p.clone() for p in module.backbone_momentum.parameters()]
    _fit(module, knn=False)
    assert int(crit.memory_bank.bank_ptr) == 2 * BATCH
    assert all(not p.requires_grad for p in module.backbone_momentum.parameters())
    after = list(module.backbone_momentum.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))  # EMA moved
    assert "temperature" in module.history[-1]


def test_simsiam_and_barlow_twins_defaults_train():
    for cls, kw in ((SimSiamModule, dict(hidden_dim=16, output_dim=8, prediction_dim=4)),
                    (BarlowTwinsModule, dict(hidden_dim=16, output_dim=8))):
        backbone, dim = _backbone()
        module = cls(backbone, dim, **kw, **COMMON)
        trainer = _fit(module, knn=False)
        assert torch.isfinite(trainer.callback_metrics["train_loss"])


def _temperature_net_trains(module, net) -> None:
    before = net.phi.weight.detach().clone()
    _fit(module, knn=False)
    assert not torch.equal(before, net.phi.weight.detach())  # in the optimiser
    assert "temperature" in module.history[-1]


def test_amcl_heads_with_simclr_moco_simsiam_and_barlow_twins():
    backbone, dim = _backbone()
    heads = AMCLProjectionHead.from_lightly(SimCLRProjectionHead, num_heads=2, input_dim=dim,
                                            hidden_dim=16, output_dim=8)
    crit = AMCLLoss(dim=8, num_heads=2)
    _temperature_net_trains(SimCLRModule(backbone, dim, crit, projection_head=heads, **COMMON),
                            crit.temperature_net)

    backbone, dim = _backbone()
    heads = AMCLProjectionHead.from_lightly(MoCoProjectionHead, num_heads=2, input_dim=dim,
                                            hidden_dim=16, output_dim=8)
    crit = AMCLLoss(dim=8, num_heads=2, memory_bank_size=(24, 8))
    _temperature_net_trains(MoCoV2Module(backbone, dim, crit, projection_head=heads, **COMMON),
                            crit.temperature_net)

    backbone, dim = _backbone()
    proj = AMCLProjectionHead.from_lightly(SimSiamProjectionHead, num_heads=2, input_dim=dim,
                                           hidden_dim=16, output_dim=8)
    pred = AMCLProjectionHead.from_lightly(SimSiamPredictionHead, num_heads=2, input_dim=8,
                                           hidden_dim=4, output_dim=8)
    net = PairTemperature(8)
    _temperature_net_trains(SimSiamModule(backbone, dim, AMCLSimSiamLoss(net), output_dim=8,
                                          projection_head=proj, prediction_head=pred,
                                          **COMMON), net)

    backbone, dim = _backbone()
    heads = AMCLProjectionHead.from_lightly(BarlowTwinsProjectionHead, num_heads=2,
                                            input_dim=dim, hidden_dim=16, output_dim=8)
    net = PairTemperature(8)
    _temperature_net_trains(BarlowTwinsModule(backbone, dim, AMCLBarlowTwinsLoss(net),
                                              projection_head=heads, **COMMON), net)


def test_ascl_moco_module_queue_is_restored_from_a_lightning_checkpoint(tmp_path):
    backbone, dim = _backbone()
    module = ASCLMoCoModule(backbone, dim, hidden_dim=16, output_dim=8, queue_size=40,
                            **COMMON)
    trainer = _fit(module, knn=False)
    assert "train_confidence" in trainer.callback_metrics
    path = tmp_path / "ascl.ckpt"
    trainer.save_checkpoint(path)

    torch.manual_seed(99)
    backbone2, _ = small_cnn(width=4)
    restored = ASCLMoCoModule(backbone2, dim, hidden_dim=16, output_dim=8, queue_size=40,
                              **COMMON)
    assert not torch.equal(restored.model.queue, module.model.queue)
    checkpoint = torch.load(path, weights_only=False)
    restored.load_state_dict(checkpoint["state_dict"])
    torch.testing.assert_close(restored.model.queue, module.model.queue)
    assert int(restored.model.criterion.memory_bank.bank_ptr) == 2 * BATCH


def test_ascl_moco_module_stores_backbone_and_queue_once_in_its_state_dict():
    backbone, dim = _backbone()
    module = ASCLMoCoModule(backbone, dim, hidden_dim=16, output_dim=8, queue_size=40, **COMMON)
    state = module.state_dict()
    assert all(key.startswith("model.") for key in state)
    assert sum(key.endswith("memory_bank.bank") for key in state) == 1
    assert module.backbone is module.model.backbone and module.criterion is module.model.criterion


def test_validation_of_module_arguments():
    backbone, dim = _backbone()
    with pytest.raises(ValueError, match="optimizer"):
        SimCLRModule(backbone, dim, optimizer="lars")
    with pytest.raises(ValueError, match="lr"):
        SimCLRModule(backbone, dim, lr=0.0)
    with pytest.raises(ValueError, match="num_classes"):
        SimCLRModule(backbone, dim, num_classes=1)
    with pytest.raises(TypeError, match="knn_k"):
        SimCLRModule(backbone, dim, knn_k=2.5)
    with pytest.raises(ValueError, match="momentum"):
        MoCoV2Module(backbone, dim, NTXentLoss(), momentum=1.5)
    with pytest.raises(ValueError, match="two views"):
        SimCLRModule(backbone, dim).training_step((torch.randn(2, 3, 8, 8), None), 0)


def test_cifar_resnet_is_the_cifar_variant():
    backbone, dim = cifar_resnet("resnet-18", width=0.125)
    assert dim == 64
    assert backbone.conv1.kernel_size == (3, 3) and backbone.conv1.stride == (1, 1)
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in backbone.modules())
    assert backbone(torch.randn(2, 3, 32, 32)).shape == (2, 64)
    with pytest.raises(ValueError):
        cifar_resnet(width=0)


# --------------------------------------------------------------------- modules built by name


@pytest.mark.parametrize("method,loss", [(m, x) for m, losses in METHOD_LOSSES.items()
                                         for x in losses])
def test_every_method_and_loss_by_name_builds_a_module_whose_loss_is_finite(method, loss):
    torch.manual_seed(0)
    module = build_ssl_module(method, loss, width=0.0625, hidden_dim=32, output_dim=16,
                              queue_size=32, num_classes=4)
    expected = {"simclr": SimCLRModule, "moco": MoCoV2Module, "simsiam": SimSiamModule,
                "barlowtwins": BarlowTwinsModule, "ascl-moco": ASCLMoCoModule}[method]
    assert type(module) is expected
    if loss == "amcl" and method in ("simclr", "moco", "barlowtwins"):
        assert isinstance(module.projection_head, AMCLProjectionHead)
    views = [torch.randn(8, 3, 32, 32), torch.randn(8, 3, 32, 32)]
    loss_value = module.training_loss(views)
    assert loss_value.ndim == 0 and torch.isfinite(loss_value)
    loss_value.backward()


@pytest.mark.parametrize("method,old,new", [
    ("simclr", "nt_xent", "infonce"), ("simclr", "flat_nce", "flatnce"),
    ("simclr", "dual", "dual_temperature"), ("moco", "ntxent", "infonce"),
    ("ascl-moco", "moco", "infonce")])
def test_an_old_loss_spelling_builds_the_same_module_with_a_future_warning(method, old, new):
    """The registry's canonical names build exactly what the old names built: the same
    classes, weights, arguments and loss value."""
    def build_and_step(name):
        torch.manual_seed(0)
        module = build_ssl_module(method, name, width=0.0625, hidden_dim=32, output_dim=16,
                                  queue_size=32, num_classes=4)
        torch.manual_seed(1)
        views = [torch.randn(8, 3, 32, 32), torch.randn(8, 3, 32, 32)]
        return module, module.training_loss(views)

    with pytest.warns(FutureWarning, match=f"loss '{old}' is deprecated; use '{new}'"):
        before, before_loss = build_and_step(old)
    after, after_loss = build_and_step(new)
    assert type(before) is type(after) and repr(before) == repr(after)
    assert type(before.criterion) is type(after.criterion)
    assert vars(before.criterion).keys() == vars(after.criterion).keys()
    for key, value in before.state_dict().items():
        assert torch.equal(value, after.state_dict()[key]), key
    assert torch.equal(before_loss, after_loss)


def test_moco_by_name_keeps_its_queue_in_the_state_dict_and_macl_gets_tau0():
    module = build_ssl_module("moco", "macl", width=0.0625, hidden_dim=32, output_dim=16,
                              queue_size=32, temperature=0.2, macl_temperature=0.15, a0=0.2)
    assert isinstance(module.criterion, MACLLoss)
    assert any("memory_bank" in key for key in module.state_dict())  # resumed runs keep it
    assert (module.criterion.temperature, module.criterion.A_0) == pytest.approx((0.15, 0.2))


def test_dystress_by_name_runs_from_temperature_to_twice_it_on_simclr_and_moco():
    """The DySTreSS authors' SimCLR setting (0.1, 0.2) at the factory's default temperature;
    MoCo's queue is its memory bank."""
    from adaptcl.adapters.lightly import DySTreSSLoss

    simclr = build_ssl_module("simclr", "dystress", width=0.0625, hidden_dim=32, output_dim=16)
    assert isinstance(simclr.criterion, DySTreSSLoss) and not simclr.criterion.uses_memory_bank
    assert (simclr.criterion.min_temperature, simclr.criterion.max_temperature) == (0.1, 0.2)
    assert simclr.criterion.criterion.form == "nt_xent"
    moco = build_ssl_module("moco", "dystress", width=0.0625, hidden_dim=32, output_dim=16,
                            queue_size=32, temperature=0.05, dystress_max_temperature=0.3)
    assert moco.criterion.uses_memory_bank and moco.criterion.criterion.form == "queue"
    assert (moco.criterion.min_temperature, moco.criterion.max_temperature) == (0.05, 0.3)


def test_a_loss_that_does_not_apply_to_the_method_is_rejected_by_name():
    with pytest.raises(ValueError, match="loss 'macl' does not apply to simsiam"):
        build_ssl_module("simsiam", "macl")
    with pytest.raises(ValueError, match="method must be one of"):
        build_ssl_module("byol", "nt_xent")


def test_trainer_by_device_name_writes_last_checkpoint_and_the_clock_resumes(tmp_path):
    trainer = build_trainer(1, device="cpu", precision="bf16-mixed", ckpt_dir=tmp_path,
                            callbacks=[TrainingClock()], progress=False)
    assert trainer.accelerator.__class__.__name__ == "CPUAccelerator"
    assert trainer.precision == "bf16-mixed" and trainer.logger is None
    assert any(isinstance(p, AtomicCheckpointIO) for p in [trainer.strategy.checkpoint_io])
    clock = TrainingClock()
    clock.load_state_dict({"epoch_seconds": [12.5, 2.5]})
    assert clock.state_dict() == {"epoch_seconds": [12.5, 2.5]} and clock.seconds == 15.0


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


def _amcl_moco(seed: int) -> MoCoV2Module:
    torch.manual_seed(seed)
    backbone, dim = small_cnn(width=4)
    heads = AMCLProjectionHead.from_lightly(MoCoProjectionHead, num_heads=2, input_dim=dim,
                                            hidden_dim=16, output_dim=8)
    crit = AMCLLoss(dim=8, num_heads=2, memory_bank_size=(24, 8), persistent_memory_bank=True)
    return MoCoV2Module(backbone, dim, crit, projection_head=heads, lr=0.05, **COMMON)


def _fit_to_two_epochs(module, tmp_path, ckpt_path=None):
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, filename="{epoch}", save_top_k=-1,
                                              every_n_epochs=1)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False,
                         callbacks=[checkpoint], enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(module, DataLoader(_FixedViews(), batch_size=BATCH, drop_last=True),
                ckpt_path=ckpt_path)
    return trainer


def test_amcl_loss_state_and_queue_restored_when_lightning_resumes(tmp_path):
    """AMCL's heads (the module's projection head), its temperature network and its queue (the
    criterion's, with ``persistent_memory_bank=True``; Lightly's bank is not saved) are in the
    LightningModule checkpoint: resuming ``fit(ckpt_path=...)`` from epoch 0's checkpoint in a
    fresh module (other initialisation, empty queue) ends where the uninterrupted run does."""
    whole = _amcl_moco(seed=0)
    _fit_to_two_epochs(whole, tmp_path / "whole")
    saved = torch.load(tmp_path / "whole" / "epoch=0.ckpt", weights_only=False)["state_dict"]
    keys = list(saved)
    assert any(k.startswith("criterion.criterion.temperature_net.") for k in keys)
    assert "criterion.memory_bank.bank" in keys
    assert any(k.startswith("projection_head.") for k in keys)

    resumed = _amcl_moco(seed=1)
    for key in ("criterion.criterion.temperature_net.phi.weight", "criterion.memory_bank.bank"):
        assert not torch.equal(resumed.state_dict()[key], saved[key])
    _fit_to_two_epochs(resumed, tmp_path / "resumed", ckpt_path=tmp_path / "whole" / "epoch=0.ckpt")
    assert resumed.resumed_from["checkpoint_global_step"] == N_IMAGES // BATCH
    final, ours = whole.state_dict(), resumed.state_dict()
    assert final.keys() == ours.keys()
    for k in final:
        torch.testing.assert_close(ours[k], final[k], msg=k)
