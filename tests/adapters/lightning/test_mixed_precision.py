"""Mixed precision through Lightning's own switch for the four image pipelines with our losses.

One training step of SimCLR + MACL, MoCo v2 + MACL (memory bank), SimSiam + AMCL and Barlow
Twins + AMCL runs in float32 and in mixed precision from the same weights on the same batch;
the loss and the gradient Lightning hands to the optimiser (``on_before_optimizer_step``:
already unscaled when a gradient scaler is in play) are compared.

Which switch, per device:

* bf16: ``Trainer(precision="bf16-mixed")`` on CPU and CUDA.
* fp16: Lightning's ``MixedPrecision("16-mixed", device, scaler=GradScaler(...))`` plugin, which
  is what ``Trainer(precision="16-mixed")`` builds on CUDA (autocast to float16 plus a gradient
  scaler), passed explicitly to choose the scaler's initial scale (below). On CPU Lightning does
  not run fp16 from the string: ``precision="16-mixed"`` with ``accelerator="cpu"`` warns and
  falls back to bf16 (``test_lightning_16_mixed_on_cpu_falls_back_to_bf16`` pins that), so the
  plugin is the only way there.

Tolerances against float32 on the same batch. The backbone and heads run in the low precision
(bfloat16 keeps 8 mantissa bits, a relative rounding of 2**-8 = 0.4 % per operation; float16
keeps 11, 0.05 %); the loss itself computes in float32 (checked here: the criterion receives
half-precision embeddings and returns a float32 loss; ``tests/test_mixed_precision.py`` checks
its value and gradient at those embeddings to the dtype's rounding). Measured on this machine:
the loss moves by at most 0.8 % (bf16) / 0.2 % (fp16) of ``max(1, |loss|)`` (SimSiam's loss is a
cosine near 0, so it is compared on the scale of 1), asserted at 2 % / 0.5 %; the whole
gradient vector moves by at most 30 % (bf16) / 7 % (fp16) in relative L2 norm, asserted at
50 % / 15 %. Most of that gradient error sits in the BatchNorm layers of the width-4 test
backbone, whose backward subtracts batch means in the low precision; a gradient scaler left
un-applied (a factor 2**8 to 2**16) or a non-finite value fails at once.

fp16 runs with ``GradScaler(init_scale=2**8)`` in the comparison, below the 2**12 that the
default (2**16) reaches here after skipping four overflowing steps;
``test_fp16_gradient_scaler_skips_overflowing_steps_and_then_trains`` runs the default scale
and checks those skips.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch.utils.data import DataLoader

pl = pytest.importorskip("pytorch_lightning")
pytest.importorskip("lightly")

from lightly.models.modules.heads import (  # noqa: E402
    BarlowTwinsProjectionHead,
    SimSiamPredictionHead,
    SimSiamProjectionHead,
)
from pytorch_lightning.plugins.precision import MixedPrecision  # noqa: E402

from adaptcl.adapters.lightly import AMCLProjectionHead, MACLLoss, PairTemperature  # noqa: E402
from adaptcl.adapters.lightning.backbones import small_cnn  # noqa: E402
from adaptcl.adapters.lightning.modules import (  # noqa: E402
    BarlowTwinsModule,
    MoCoV2Module,
    SimCLRModule,
    SimSiamModule,
)
from adaptcl.plugins import AMCLBarlowTwinsLoss, AMCLSimSiamLoss  # noqa: E402

BATCH = 16
LOSS_TOL = {"bf16": 2e-2, "fp16": 5e-3}
GRAD_RTOL = {"bf16": 0.5, "fp16": 0.15}
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _batch() -> list:
    """One fixed batch ``([x0, x1], targets)`` of two noisy views of random 16x16 images."""
    g = torch.Generator().manual_seed(0)
    images = torch.randn(BATCH, 3, 16, 16, generator=g)
    views = [images + 0.1 * torch.randn(images.shape, generator=g) for _ in range(2)]
    return [views, torch.arange(BATCH) % 4]


def _simclr():
    backbone, dim = small_cnn(width=4)
    return SimCLRModule(backbone, dim, MACLLoss(temperature=0.1, alpha=0.5), hidden_dim=16,
                        output_dim=8, optimizer="sgd", lr_schedule="constant")


def _moco():
    backbone, dim = small_cnn(width=4)
    return MoCoV2Module(backbone, dim, MACLLoss(0.15, 0.5, 0.2, memory_bank_size=(40, 8)),
                        hidden_dim=16, output_dim=8, lr_schedule="constant")


def _simsiam():
    backbone, dim = small_cnn(width=4)
    proj = AMCLProjectionHead.from_lightly(SimSiamProjectionHead, num_heads=2, input_dim=dim,
                                           hidden_dim=16, output_dim=8)
    pred = AMCLProjectionHead.from_lightly(SimSiamPredictionHead, num_heads=2, input_dim=8,
                                           hidden_dim=4, output_dim=8)
    return SimSiamModule(backbone, dim, AMCLSimSiamLoss(PairTemperature(8)), output_dim=8,
                         projection_head=proj, prediction_head=pred, lr_schedule="constant")


def _barlow_twins():
    backbone, dim = small_cnn(width=4)
    heads = AMCLProjectionHead.from_lightly(BarlowTwinsProjectionHead, num_heads=2,
                                            input_dim=dim, hidden_dim=16, output_dim=8)
    return BarlowTwinsModule(backbone, dim, AMCLBarlowTwinsLoss(PairTemperature(8)),
                             projection_head=heads, optimizer="sgd", lr_schedule="constant")


PIPELINES = {"simclr_macl": _simclr, "moco_macl": _moco, "simsiam_amcl": _simsiam,
             "barlow_twins_amcl": _barlow_twins}


class _Record(pl.Callback):
    """Keeps the loss, the optimiser's gradients and the criterion's input/output dtypes."""

    def __init__(self) -> None:
        self.loss: float | None = None
        self.grads: torch.Tensor | None = None
        self.dtypes: dict[str, torch.dtype] = {}
        self._handle = None

    def on_train_start(self, trainer, module) -> None:
        def hook(_criterion, args, output):
            self.dtypes = {"input": args[0].dtype, "output": output.dtype}

        self._handle = module.criterion.register_forward_hook(hook)

    def on_before_optimizer_step(self, trainer, module, optimizer) -> None:
        self.grads = torch.cat([p.grad.detach().float().flatten()
                                for p in module.parameters() if p.grad is not None])

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.loss = float(outputs["loss"])

    def on_train_end(self, trainer, module) -> None:
        self._handle.remove()


def _precision_args(device: torch.device, precision: str) -> dict:
    accelerator = "gpu" if device.type == "cuda" else "cpu"
    if precision == "32":
        return dict(accelerator=accelerator, precision="32-true")
    if precision == "bf16":
        return dict(accelerator=accelerator, precision="bf16-mixed")
    # The plugin precision="16-mixed" builds on CUDA, with a scale that does not overflow at
    # once; on CPU Lightning maps precision="16-mixed" to bf16, so the plugin is the only way.
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**8)
    return dict(accelerator=accelerator, plugins=[MixedPrecision("16-mixed", device.type,
                                                                 scaler=scaler)])


def _train_step(module, device: torch.device, precision: str, record: pl.Callback | None = None,
                steps: int = 1) -> pl.Callback:
    record = _Record() if record is None else record
    trainer = pl.Trainer(max_steps=steps, devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[record], **_precision_args(device, precision))
    batch = _batch()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        trainer.fit(module, train_dataloaders=DataLoader([batch] * steps, batch_size=None))
    return record


_FLOAT32: dict[tuple[str, str], _Record] = {}


def _float32_step(pipeline: str, module, device: torch.device) -> _Record:
    """The float32 reference of a pipeline (its modules are built from seed 0), run once."""
    key = (pipeline, str(device))
    if key not in _FLOAT32:
        _FLOAT32[key] = _train_step(copy.deepcopy(module), device, "32")
    return _FLOAT32[key]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("pipeline", list(PIPELINES))
def test_mixed_precision_step_is_finite_and_close_to_float32(pipeline, precision, device):
    torch.manual_seed(0)
    module = PIPELINES[pipeline]()
    reference = _float32_step(pipeline, module, device)
    mixed = _train_step(module, device, precision)

    assert mixed.dtypes["input"] == HALF[precision]  # autocast reached the heads
    assert mixed.dtypes["output"] == torch.float32  # the loss computed in float32
    assert reference.dtypes == {"input": torch.float32, "output": torch.float32}
    assert torch.isfinite(torch.tensor(mixed.loss))
    assert torch.isfinite(mixed.grads).all() and mixed.grads.abs().sum() > 0
    error = (mixed.grads - reference.grads).norm() / reference.grads.norm()
    # SimSiam's loss is a (negative) cosine near 0: compare on the scale of 1, not relatively
    assert mixed.loss == pytest.approx(reference.loss,
                                       abs=LOSS_TOL[precision] * max(1.0, abs(reference.loss)))
    assert error < GRAD_RTOL[precision], f"gradient off by {float(error):.3%} of its norm"


def test_lightning_16_mixed_on_cpu_falls_back_to_bf16():
    """What CPU supports: Lightning turns ``precision="16-mixed"`` into bf16 there."""
    with pytest.warns(UserWarning, match="fp16 is not supported on CPU"):
        trainer = pl.Trainer(accelerator="cpu", devices=1, precision="16-mixed", logger=False)
    assert trainer.precision == "bf16-mixed"


class _ScalerSteps(pl.Callback):
    """Per step: were the unscaled gradients finite, the scale used, did the weights move."""

    def __init__(self) -> None:
        self.steps: list[dict] = []
        self._before: torch.Tensor | None = None

    @staticmethod
    def _weights(module) -> torch.Tensor:
        return torch.cat([p.detach().flatten().clone() for p in module.parameters()])

    def on_before_optimizer_step(self, trainer, module, optimizer) -> None:
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        self._before = self._weights(module)
        self.steps.append({"finite": all(bool(torch.isfinite(g).all()) for g in grads),
                           "scale": trainer.precision_plugin.scaler.get_scale()})

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.steps[-1]["moved"] = not torch.equal(self._before, self._weights(module))
        self.steps[-1]["loss"] = float(outputs["loss"])


def test_fp16_gradient_scaler_skips_overflowing_steps_and_then_trains(device):
    """fp16 with Lightning's scaler at its default initial scale (65,536) and MACL.

    The scaled backward of the first steps overflows float16; the scaler must skip those
    optimiser steps (weights untouched), lower its scale, and take the later, finite steps.
    Every loss value stays finite throughout: the overflow is the scaler's, never the loss's.
    """
    torch.manual_seed(0)
    module = _simclr()
    steps = _ScalerSteps()
    plugin = MixedPrecision("16-mixed", device.type, scaler=torch.amp.GradScaler(device.type))
    trainer = pl.Trainer(max_steps=8, devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         accelerator="gpu" if device.type == "cuda" else "cpu",
                         plugins=[plugin], callbacks=[steps])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        trainer.fit(module, train_dataloaders=DataLoader([_batch()] * 8, batch_size=None))

    assert len(steps.steps) == 8
    assert steps.steps[0]["scale"] == 2.0**16
    for step, after in zip(steps.steps, steps.steps[1:] + [None], strict=True):
        assert torch.isfinite(torch.tensor(step["loss"]))
        assert step["moved"] == step["finite"]  # skipped exactly when the gradients overflowed
        if after is not None and not step["finite"]:
            assert after["scale"] == step["scale"] / 2
    if device.type == "cpu":  # deterministic here: the default scale overflows at first
        assert not steps.steps[0]["finite"]
    assert steps.steps[-1]["finite"] and steps.steps[-1]["moved"]
