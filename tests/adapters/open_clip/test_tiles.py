"""The tiled path's controls shared with the other adapters: ``tile_size`` reaches every
drop-in's core loss and is validated by it; the scoped ``tiling(backend=..., max_logits_bytes=...)``
(:mod:`adaptcl.plugins.tiles._dispatch`) governs the drop-ins as every core loss."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests._interpreted import run_interpreted

pytest.importorskip("open_clip.loss")

from adaptcl.adapters.open_clip import (  # noqa: E402
    DCLClipLoss,
    DySTreSSClipLoss,
    InfoNCEClipLoss,
    MACLClipLoss,
    TemperatureScheduleClipLoss,
    build_clip_loss,
)
from adaptcl.plugins import LogitsBudgetWarning, tiling  # noqa: E402
from adaptcl.plugins.tiles import _budget as budget
from adaptcl.plugins.tiles import _fused as fused
from tests.adapters.open_clip.test_losses import _step  # noqa: E402

HERE = Path(__file__).resolve().parent
IGNORES_SCALE = "ignore:.*ignores logit_scale"
CLASSES = (InfoNCEClipLoss, DCLClipLoss, MACLClipLoss, DySTreSSClipLoss,
           TemperatureScheduleClipLoss)


@pytest.fixture(autouse=True)
def _nothing_said_yet(monkeypatch):
    """The budget's warning is said once a process: not yet in each test."""
    monkeypatch.setattr(budget, "_SAID", set())


def _inputs(seed=0, n=100, d=16):
    # 100 pairs: two tiles of budget.MIN_TILE = 64 in each direction
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)


def test_a_budget_switches_infonce_to_the_tiled_path_with_clips_gradients():
    image, text = _inputs()
    capped = InfoNCEClipLoss()
    assert capped.tile_size == capped.criterion.tile_size == "auto"
    with pytest.warns(LogitsBudgetWarning, match=r"tile_size=64 instead") as said, tiling(
            max_logits_bytes=1):
        got = _step(capped, image, text)
        again = _step(capped, image, text)
    assert sum(isinstance(w.message, LogitsBudgetWarning) for w in said) == 1  # once
    assert capped.last_stats["auto_tile_size"].item() == budget.MIN_TILE
    for a, b in zip(got, again, strict=True):
        assert torch.equal(a, b)
    # the tiled path itself at the tile the budget chose, bit for bit
    for a, b in zip(got, _step(InfoNCEClipLoss(tile_size=budget.MIN_TILE), image, text),
                    strict=True):
        assert torch.equal(a, b)
    full = InfoNCEClipLoss()
    want = _step(full, image, text)
    assert "auto_tile_size" not in full.last_stats
    assert got[3].abs() > 0  # logit_scale's gradient is compared, not a vacuous zero
    for a, b in zip(got, want, strict=True):  # value, both features' and logit_scale's grads
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings(IGNORES_SCALE)
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_loss_passes_its_tile_size_to_its_core(cls):
    for tile_size in (8, None, "auto"):
        loss = cls(tile_size=tile_size)
        assert loss.tile_size == loss.criterion.tile_size == tile_size
    assert "tile_size=8" in repr(cls(tile_size=8)) and "tile_size" not in repr(cls())
    with pytest.raises(AttributeError):  # read-only
        loss.tile_size = 8


@pytest.mark.filterwarnings(IGNORES_SCALE)
@pytest.mark.parametrize("name", ["infonce", "dcl", "macl", "dystress",
                                  "temperature_schedule"])
def test_torch_backend_equals_the_default_on_the_cpu_bit_for_bit(name):
    image, text = _inputs(1, n=37)
    with tiling(backend="torch"):
        got = _step(build_clip_loss(name, tile_size=8), image, text)
    want = _step(build_clip_loss(name, tile_size=8), image, text)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_triton_on_cpu_tensors_without_the_interpreter_refuses_in_one_line(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    image, text = _inputs(2, n=13)
    loss = InfoNCEClipLoss()
    with pytest.raises(ValueError, match=r"tiling\(backend='triton'\) cannot run \w+ here: ") \
            as err, tiling(backend="triton"):
        loss(image, text, torch.tensor(14.0))
    assert "\n" not in str(err.value)
    expected = ("Triton is not installed" if not fused._HAS_TRITON else
                "the tensors are on the CPU and TRITON_INTERPRET=1 is not set")
    assert expected in str(err.value)


@pytest.mark.slow
def test_triton_kernel_under_the_interpreter_equals_cliploss():
    """``interpreted_triton.py`` in a fresh process with ``TRITON_INTERPRET=1`` (see there)."""
    pytest.importorskip("triton")
    assert "2 passed" in run_interpreted(HERE / "interpreted_triton.py")


@pytest.mark.parametrize(("kwargs", "error", "start"), [
    ({"tile_size": "big"}, ValueError, "tile_size must be an int >= 1, 'auto' or None"),
    ({"tile_size": 0}, ValueError, "tile_size must be an int >= 1, 'auto' or None"),
    ({"tile_size": 1.5}, TypeError, "tile_size must be an int >= 1, 'auto' or None"),
    ({"tile_backend": "torch"}, TypeError, ""),
    ({"max_logits_bytes": 1}, TypeError, ""),
])
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_bad_values_are_refused_in_one_line_naming_the_argument(cls, kwargs, error, start):
    with pytest.raises(error) as err:
        cls(**kwargs)
    message = str(err.value)
    assert "\n" not in message and message.startswith(start), message
    assert next(iter(kwargs)) in message  # the removed keywords too: unexpected, by name
