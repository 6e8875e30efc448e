"""Gradient caching in the Lightning modules (``mini_batch_size=``): every method's cached step
equals its uncached one, and Lightning's precision plugins (bf16, fp16 with its GradScaler),
clipping and accumulation drive it unchanged."""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

pl = pytest.importorskip("pytorch_lightning")
pytest.importorskip("lightly")

from pytorch_lightning.plugins.precision import MixedPrecision  # noqa: E402

from adaptcl.adapters.lightly import LearnableTemperatureLoss  # noqa: E402
from adaptcl.adapters.lightning import caching  # noqa: E402
from adaptcl.adapters.lightning.factory import build_ssl_module  # noqa: E402
from adaptcl.adapters.lightning.modules import SimCLRModule  # noqa: E402
from adaptcl.plugins import cached_forward  # noqa: E402

SMALL = dict(width=0.0625, hidden_dim=16, output_dim=8, queue_size=16, num_heads=2)
BATCH = 8

#: every method, its baseline and the losses with parameters or a queue
CASES = [("simclr", "infonce"), ("simclr", "amcl"), ("simclr", "learnable_temperature"),
         ("moco", "macl"), ("moco", "amcl"), ("simsiam", "negcos"), ("simsiam", "amcl"),
         ("barlowtwins", "barlow"), ("ascl-moco", "ascl")]


def _views(dtype=torch.float64) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(BATCH, 3, 32, 32, generator=g, dtype=dtype) for _ in range(2)]


def _batch_norms(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


@pytest.mark.parametrize(("method", "loss"), CASES)
def test_every_method_cached_with_frozen_batch_norm_equals_the_uncached_step(method, loss):
    """With ``cache_batch_norm="frozen"`` a cached step over chunks of 3 equals the uncached
    full-batch step with the same frozen BatchNorm: the loss, every gradient (the heads', the
    loss's own parameters'), the queue and the momentum encoder, in float64."""
    torch.manual_seed(0)
    plain = build_ssl_module(method, loss, **SMALL).double().train()
    cached = copy.deepcopy(plain)
    cached.set_gradient_cache(3, "frozen")
    for m in _batch_norms(plain):
        m.eval()
    views = _views()
    want, got = plain.training_loss(views), cached.training_loss(views)
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    grads = [(n, p.grad) for n, p in plain.named_parameters() if p.grad is not None]
    assert grads
    for (name, want_grad), got_param in zip(grads, (dict(cached.named_parameters())[n]
                                                    for n, _ in grads), strict=True):
        torch.testing.assert_close(got_param.grad, want_grad, rtol=0, atol=1e-10, msg=name)
    for (name, want_buffer), got_buffer in zip(plain.state_dict().items(),
                                               cached.state_dict().values(), strict=True):
        torch.testing.assert_close(got_buffer, want_buffer, rtol=0, atol=1e-10, msg=name)


def test_chunk_batch_norm_equals_the_uncached_step_over_the_same_chunks():
    """The default: SimCLR's ResNet and head normalise per chunk, as an uncached step that runs
    each chunk through :meth:`project` does; running statistics updated once per chunk."""
    torch.manual_seed(0)
    plain = build_ssl_module("simclr", "infonce", **SMALL).double().train()
    cached = copy.deepcopy(plain)
    cached.set_gradient_cache(4)
    views = _views()
    z0, z1 = (torch.cat([plain.project(v[:4]), plain.project(v[4:])]) for v in views)
    plain.criterion(z0, z1).backward()
    cached.training_loss(views).backward()
    for (name, p), q in zip(plain.named_parameters(), cached.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=1e-10, msg=name)
    for (name, b), c in zip(plain.state_dict().items(), cached.state_dict().values(),
                            strict=True):
        torch.testing.assert_close(c, b, rtol=0, atol=1e-10, msg=name)
    assert int(_batch_norms(cached.backbone)[0].num_batches_tracked) == 2 * BATCH // 4


class _Pairs(Dataset):
    def __init__(self, n: int = 32) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.randn(n, 3, 8, 8, generator=g)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i):
        x = self.images[i]
        return [x + 0.1 * torch.randn_like(x), x + 0.1 * torch.randn_like(x)], 0


def _module(mini_batch_size: int | None) -> SimCLRModule:
    """A SimCLR without BatchNorm (its step is the same cached or not) and a learned
    temperature (a parameter of the loss)."""
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Flatten(), nn.Linear(192, 32), nn.LayerNorm(32), nn.ReLU())
    head = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))
    return SimCLRModule(backbone, 32, LearnableTemperatureLoss(0.1), projection_head=head,
                        optimizer="sgd", lr=0.05, lr_schedule="constant",
                        mini_batch_size=mini_batch_size)


def _fit(module: SimCLRModule, **trainer_options) -> SimCLRModule:
    torch.manual_seed(1)
    loader = DataLoader(_Pairs(), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         gradient_clip_val=0.5, accumulate_grad_batches=2, **trainer_options)
    trainer.fit(module, train_dataloaders=loader)
    return module


@pytest.mark.slow  # six short fits
@pytest.mark.parametrize(("options", "tolerance"), [
    ({"precision": "32"}, 1e-5),
    ({"precision": "bf16-mixed"}, 2e-2),
    ({"plugins": [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))]}, 5e-3),
], ids=["32", "bf16-mixed", "16-mixed-grad-scaler"])
def test_lightning_precision_clipping_and_accumulation_drive_the_cached_step(options, tolerance,
                                                                           monkeypatch):
    """The same losses step by step and the same weights after training, cached or not, under
    each precision plugin with ``gradient_clip_val`` and ``accumulate_grad_batches``."""
    calls = []
    monkeypatch.setattr(caching, "cached_forward",
                        lambda *args, **kwargs: calls.append(1) or cached_forward(*args, **kwargs))
    if "plugins" in options:  # a fresh GradScaler per fit
        options = {"plugins": [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))]}
    plain = _fit(_module(None), **options)
    options = ({"plugins": [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))]}
               if "plugins" in options else options)
    assert not calls
    cached = _fit(_module(3), **options)
    assert len(calls) == 2 * 8  # both views of every step, cached
    assert len(cached.history) == len(plain.history) == 8
    for a, b in zip(cached.history, plain.history, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=tolerance, abs=tolerance)
    for (name, p), q in zip(plain.named_parameters(), cached.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=tolerance, atol=tolerance, msg=name)


def test_chunk_progress_follows_the_trainers_bar_and_the_terminal(monkeypatch):
    module = _module(3)
    assert module._chunk_progress() is None  # no trainer
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=True)
    module.trainer = trainer
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert module._chunk_progress() is not None
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert module._chunk_progress() is None
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    module.trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    assert module._chunk_progress() is None


@pytest.mark.parametrize(("kwargs", "error"), [({"mini_batch_size": 0}, ValueError),
                                               ({"mini_batch_size": 2.0}, TypeError),
                                               ({"cache_batch_norm": "sync"}, ValueError)])
def test_bad_caching_settings_are_refused(kwargs, error):
    with pytest.raises(error, match="mini_batch_size|cache_batch_norm"):
        build_ssl_module("simclr", "infonce", **SMALL, **kwargs)
