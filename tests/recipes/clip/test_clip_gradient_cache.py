"""``adaptcl clip --mini-batch-size``: the open_clip towers of the recipe cached exactly (float64,
every parameter, ``logit_scale`` included), the same per-step losses end to end, not part of a
run's identity, and the bad sizes refused in one line."""

from __future__ import annotations

import copy
import json

import pytest
import torch

pytest.importorskip("open_clip")
pytest.importorskip("pytorch_lightning")

from adaptcl import cli  # noqa: E402
from adaptcl.adapters.lightning import caching  # noqa: E402
from adaptcl.adapters.open_clip import build_clip_loss  # noqa: E402
from adaptcl.plugins import cached_forward  # noqa: E402
from adaptcl.recipes.clip.config import ClipConfig  # noqa: E402
from adaptcl.recipes.clip.model import ClipModule, build_clip  # noqa: E402
from tests.recipes._cli import one_line_error  # noqa: E402
from tests.recipes.clip.test_clip_run import TINY as RUN_TINY  # noqa: E402

TINY = [*RUN_TINY, "--losses", "macl", "--targets", "pairs", "--seeds", "0"]


def _batch(n: int = 12):
    g = torch.Generator().manual_seed(0)
    images = torch.randn(n, 3, 32, 32, generator=g, dtype=torch.float64)
    tokens = torch.randint(1, 400, (n, 12), generator=g)
    return images, tokens, torch.arange(n) % 3


@pytest.mark.filterwarnings("ignore:You are trying to `self.log")  # no Trainer here
@pytest.mark.filterwarnings("ignore:DySTreSSClipLoss ignores logit_scale")
@pytest.mark.parametrize("loss", ["infonce", "macl", "dystress"])
def test_the_recipes_towers_cached_equal_the_uncached_step_in_float64(loss, monkeypatch):
    """Two towers (ViT and text transformer, LayerNorm) and the learned ``logit_scale``: every
    parameter's gradient after a cached step (chunks of 5 of 12 pairs) equals the uncached
    step's to 1e-10."""
    cfg = ClipConfig(patch_size=16, vision_width=32, text_width=32, head_width=16,
                     vision_layers=1, text_layers=1, embed_dim=16, context_length=12)
    torch.manual_seed(0)
    options = dict(multi_positive=False, lr=1e-3, weight_decay=0.1, warmup_steps=1)
    plain = ClipModule(build_clip(cfg).double(), build_clip_loss(loss), **options)
    cached = copy.deepcopy(plain)
    cached.set_gradient_cache(5)
    calls = _spy(monkeypatch)
    batch = _batch()
    want, got = plain.training_step(batch, 0), cached.training_step(batch, 0)
    want.backward()
    got.backward()
    assert calls == [12, 12]  # each tower, cached
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    named = dict(cached.named_parameters())
    assert named["model.logit_scale"].grad is not None or loss == "dystress"
    for name, param in plain.named_parameters():
        if param.grad is None:  # DySTreSS ignores logit_scale
            assert named[name].grad is None, name
            continue
        torch.testing.assert_close(named[name].grad, param.grad, rtol=0, atol=1e-10, msg=name)


def _spy(monkeypatch) -> list[int]:
    """The rows of every call of ``cached_forward`` from a Lightning module."""
    calls: list[int] = []

    def spy(encoder, inputs, *args, **kwargs):
        calls.append(len(inputs))
        return cached_forward(encoder, inputs, *args, **kwargs)

    monkeypatch.setattr(caching, "cached_forward", spy)
    return calls


def _run(shared_data, out, *extra) -> dict:
    assert cli.main(["clip", "--data-root", str(shared_data), "--output-dir", str(out), *TINY,
                     *extra]) == 0
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow  # three tiny runs
def test_a_quarter_batch_records_the_same_losses_and_is_no_new_identity(shared_data, tmp_path,
                                                                        monkeypatch):
    plain = _run(shared_data, tmp_path / "plain")["runs"][0]
    calls = _spy(monkeypatch)
    cached = _run(shared_data, tmp_path / "cached", "--mini-batch-size", "8")["runs"][0]
    assert calls == [32, 32] * 2  # two steps, each tower of a batch of 32 cached
    assert len(cached["losses"]) == len(plain["losses"]) == 2
    assert cached["losses"] == pytest.approx(plain["losses"], rel=1e-5, abs=1e-6)
    assert cached["step_seconds"] > 0 and cached["peak_gpu_memory_bytes"] is None  # the CPU
    assert "Seconds per training step" in (tmp_path / "cached" / "results.md").read_text()
    # the towers have no BatchNorm: a cached run is the uncached run's cell, reused
    again = _run(shared_data, tmp_path / "plain", "--mini-batch-size", "8")
    assert len(again["reused"]) == 1 and not again["computed"]


@pytest.mark.parametrize(("size", "expected"), [
    ("48", "mini_batch_size (48) must divide batch_size (128) into chunks of one size, e.g. "
           "32 or 64"),
    ("256", "mini_batch_size (256) must be at most batch_size (128)"),
    ("0", "mini_batch_size must be a positive number, got 0"),
])
def test_bad_mini_batch_sizes_are_one_line_before_any_file(shared_data, tmp_path, capsys, size,
                                                           expected):
    out = tmp_path / "out"
    one_line_error(capsys, ["clip", "--data-root", str(shared_data), "--output-dir", str(out),
                             "--mini-batch-size", size], expected)
    assert not out.exists()
