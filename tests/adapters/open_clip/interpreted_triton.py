"""The open_clip drop-ins on the fused Triton kernel (``tiling(backend="triton")``) under Triton's
interpreter: ``ClipLoss``'s value and gradients, ``logit_scale``'s included (the temperature
``1 / logit_scale`` is folded into the kernel's anchors).

Not collected by a plain ``pytest`` run (no ``test_`` prefix): the interpreter must be on before
Triton is first imported, so ``tests/adapters/open_clip/test_tiles.py`` runs this file in a
fresh process with ``TRITON_INTERPRET=1`` (as ``tests/plugins/test_fused.py`` does); by hand::

    TRITON_INTERPRET=1 PYTHONPATH=src python -m pytest tests/adapters/open_clip/interpreted_triton.py

The PyTorch tile loop is replaced by a failure, so a silent fallback cannot pass.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from adaptcl.plugins import tiling
from adaptcl.plugins.tiles import _budget as budget
from adaptcl.plugins.tiles import _fused as fused
from adaptcl.plugins.tiles import _loop as tiled_module

open_clip_loss = pytest.importorskip("open_clip.loss")
pytest.importorskip("triton")
if not fused.interpreting():
    pytest.skip("run with TRITON_INTERPRET=1 (tests/adapters/open_clip/test_tiles.py does)",
                allow_module_level=True)

from adaptcl.adapters.open_clip import InfoNCEClipLoss  # noqa: E402


@pytest.fixture(autouse=True)
def no_torch_tiles(monkeypatch):
    """The PyTorch tile loop fails if called: the kernel must have computed the result."""
    def fail(*args):
        raise AssertionError("the PyTorch tile loop ran instead of the kernel")
    monkeypatch.setattr(tiled_module._StreamedRowStats, "apply", fail)
    monkeypatch.setattr(budget, "_SAID", set())


def _step(fn, image, text, scale=1 / 0.07):
    x0, x1 = image.clone().requires_grad_(), text.clone().requires_grad_()
    s = torch.tensor(math.log(scale), requires_grad=True)
    value = fn(F.normalize(x0, dim=-1), F.normalize(x1, dim=-1), s.exp())
    value.backward()
    return value.detach(), x0.grad, x1.grad, s.grad


def test_kernel_equals_cliploss_with_logit_scales_gradient():
    g = torch.Generator().manual_seed(0)
    image, text = torch.randn(37, 20, generator=g), torch.randn(37, 20, generator=g)
    loss = InfoNCEClipLoss()
    with tiling(backend="triton"):  # "auto": the kernel, whatever the budget
        got = _step(loss, image, text)
    assert "auto_tile_size" not in loss.last_stats
    assert loss.last_stats.plan.path == "triton"
    want = _step(open_clip_loss.ClipLoss(), image, text)
    assert got[3].abs() > 0
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=1e-6)


def test_an_int_tile_size_is_the_loops_tile_and_triton_refuses_it():
    """An int ``tile_size`` is the PyTorch loop's tile (issue 53): the kernel runs its own
    blocks, so ``tiling(backend="triton")`` refuses it in one line instead of ignoring it."""
    g = torch.Generator().manual_seed(1)
    image, text = torch.randn(13, 20, generator=g), torch.randn(13, 20, generator=g)
    with tiling(backend="triton"), pytest.raises(ValueError) as raised:
        InfoNCEClipLoss(tile_size=8)(image, text, torch.tensor(14.0))
    assert "tile_size=8 is a tile of the PyTorch loop, and it runs its own blocks" in str(
        raised.value)
    assert "\n" not in str(raised.value)
