"""Drop-in behaviour: open_clip's training loops with the loss's import changed.

The loop of ``docs/guides/open_clip.md`` (open_clip's ``train_one_epoch`` pattern on a small CLIP
built from a config dict, nothing downloaded) trains with ``MACLClipLoss`` in place of
``ClipLoss``, and with ``InfoNCEClipLoss`` in its place gives ``ClipLoss``'s run step by step.
open_clip_train's own ``train_one_epoch`` runs with the loss of the guide's ``create_loss``.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import math
from pathlib import Path

import pytest
import torch

open_clip = pytest.importorskip("open_clip")

from open_clip.loss import ClipLoss  # noqa: E402
from open_clip.model import CLIP  # noqa: E402

from adaptcl.adapters.open_clip import InfoNCEClipLoss, MACLClipLoss  # noqa: E402
from tests._markdown import python_blocks, run_block  # noqa: E402

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "guides" / "open_clip.md"
OURS = "from adaptcl.adapters.open_clip import MACLClipLoss as ClipLoss"


def _assert_same_parameters(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    """Equal parameters, but for attention's key bias: it shifts every logit of a softmax row
    alike, so its gradient is 0 in exact arithmetic and rounding noise in float32, which Adam
    (normalising by the noise's own size) turns into steps that differ between any two losses."""
    for (name, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items(),
                                 strict=True):
        if name.endswith("attn.in_proj_bias"):
            width = a.shape[0] // 3
            a, b = torch.cat([a[:width], a[2 * width:]]), torch.cat([b[:width], b[2 * width:]])
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def _guide_block(index: int):
    return python_blocks(GUIDE)[index]


def _run_loop(import_line: str | None = None) -> dict:
    """The guide's complete example, with its import line replaced by ``import_line``."""
    block = _guide_block(0)
    assert OURS in block.code
    if import_line is not None:
        block = type(block)(block.path, block.line, block.code.replace(OURS, import_line))
    namespace: dict = {"__name__": "__docs__"}
    run_block(block, namespace)
    return namespace


@pytest.mark.slow  # three 8-step runs of a small CLIP
def test_guide_loop_trains_with_macl_and_equals_cliploss_with_infonce():
    macl = _run_loop()
    assert type(macl["loss"]) is MACLClipLoss
    history = macl["history"]
    assert all(math.isfinite(v) for v in history) and history[-1] < 0.6 * history[0]
    assert macl["model"].logit_scale.item() <= math.log(100)
    theirs = _run_loop("from open_clip.loss import ClipLoss")
    infonce = _run_loop("from adaptcl.adapters.open_clip import InfoNCEClipLoss as ClipLoss")
    assert type(theirs["loss"]) is ClipLoss and type(infonce["loss"]) is InfoNCEClipLoss
    torch.testing.assert_close(torch.tensor(infonce["history"]), torch.tensor(theirs["history"]),
                               rtol=1e-5, atol=1e-6)
    _assert_same_parameters(infonce["model"], theirs["model"])
    assert not torch.allclose(torch.tensor(macl["history"]), torch.tensor(theirs["history"]))


class _Data:
    """open_clip_train's ``DataInfo`` (its module needs the training extras): a dataloader
    with ``num_batches`` and ``num_samples``, and ``set_epoch``."""

    def __init__(self, images, texts, batch_size):
        dataset = torch.utils.data.TensorDataset(images, texts)
        self.dataloader = torch.utils.data.DataLoader(dataset, batch_size=batch_size)
        self.dataloader.num_batches = len(self.dataloader)
        self.dataloader.num_samples = len(dataset)

    def set_epoch(self, epoch):
        pass


def _args(**overrides) -> argparse.Namespace:
    """The options of open_clip_train's parser that ``train_one_epoch`` and ``create_loss``
    read, at their defaults for one CPU process."""
    values = {"device": "cpu", "precision": "fp32", "accum_freq": 1, "distill": False,
              "skip_scheduler": True, "grad_clip_norm": None, "horovod": False,
              "log_every_n_steps": 100, "batch_size": 8, "world_size": 1, "rank": 0,
              "local_rank": 0, "wandb": False, "local_loss": False, "gather_with_grad": False}
    return argparse.Namespace(**{**values, **overrides})


def _train_one_epoch(loss, args, seed=0) -> CLIP:
    from open_clip_train.train import train_one_epoch

    torch.manual_seed(seed)
    model = CLIP(embed_dim=16, output_dict=True,
                 vision_cfg={"image_size": 16, "patch_size": 8, "width": 32, "layers": 1,
                             "head_width": 16},
                 text_cfg={"context_length": 8, "vocab_size": 64, "width": 32, "heads": 2,
                           "layers": 1})
    g = torch.Generator().manual_seed(seed)
    data = {"train": _Data(torch.randn(32, 3, 16, 16, generator=g),
                           torch.randint(1, 64, (32, 8), generator=g), args.batch_size)}
    # open_clip's ViT defaults: eps 1e-6 also keeps Adam from turning the rounding noise of
    # gradients that are 0 in exact arithmetic (attention's key bias) into full-size steps
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-6)
    before = copy.deepcopy(model.state_dict())
    train_one_epoch(model, data, loss, 0, optimizer, None, None, None, args)
    model.before = before
    return model


@pytest.mark.slow  # open_clip_train's loop, four runs
@pytest.mark.parametrize("accum_freq", [1, 2])
def test_open_clip_trains_own_train_one_epoch_with_the_guides_create_loss(accum_freq):
    namespace: dict = {"__name__": "__docs__"}
    launcher = next(b for b in python_blocks(GUIDE) if "def create_loss(args)" in b.code)
    run_block(launcher, namespace)  # the launcher: defines create_loss, runs nothing
    args = _args(accum_freq=accum_freq, batch_size=4)
    loss = namespace["create_loss"](args)
    assert type(loss) is MACLClipLoss and loss.cache_labels and loss.criterion.alpha == 0.5
    model = _train_one_epoch(loss, args)
    moved = [not torch.equal(p, model.before[name]) for name, p in model.state_dict().items()]
    assert all(moved)  # every parameter trained, logit_scale included
    assert 0 <= model.logit_scale.item() <= math.log(100)
    assert torch.isfinite(loss.last_stats["loss"])


@pytest.mark.slow
def test_open_clip_trains_own_train_one_epoch_gives_cliploss_run_with_infonce():
    args = _args()
    theirs = _train_one_epoch(ClipLoss(cache_labels=True), args)
    ours = _train_one_epoch(InfoNCEClipLoss(cache_labels=True), args)
    _assert_same_parameters(ours, theirs)


def test_open_clip_train_builds_its_loss_with_create_loss():
    """The launcher's patch point: open_clip_train.main calls the module-level name
    ``create_loss`` it imports from open_clip (read from its source: importing it needs the
    training extras)."""
    spec = importlib.util.find_spec("open_clip_train.main")
    source = Path(spec.origin).read_text(encoding="utf-8")
    assert "from open_clip import" in source and "create_loss" in source.split("\n", 40)[30]
    assert "    loss = create_loss(args)\n" in source
