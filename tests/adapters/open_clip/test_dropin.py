"""Drop-in behaviour: open_clip's training loops with the loss's import changed, and the
guide's gradient caching in open_clip_train's own loop.

The loop of ``docs/guides/open_clip.md`` (open_clip's ``train_one_epoch`` pattern on a small CLIP
built from a config dict, nothing downloaded) trains with ``MACLClipLoss`` in place of
``ClipLoss``, and with ``InfoNCEClipLoss`` in its place gives ``ClipLoss``'s run step by step.
open_clip_train's own ``train_one_epoch`` runs with the loss of the guide's ``create_loss``, and
with the guide's ``cache_towers`` applied to its model; what the guide says of ``--accum-freq``
is measured in the same loop.
"""

from __future__ import annotations

import argparse
import copy
import functools
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


def _small_clip(seed=0, dtype=torch.float32, patch_dropout=0.0) -> CLIP:
    torch.manual_seed(seed)
    return CLIP(embed_dim=16, output_dict=True,
                vision_cfg={"image_size": 16, "patch_size": 8, "width": 32, "layers": 1,
                            "head_width": 16, "patch_dropout": patch_dropout},
                text_cfg={"context_length": 8, "vocab_size": 64, "width": 32, "heads": 2,
                          "layers": 1}).to(dtype)


def _train_one_epoch(loss, args, seed=0, *, rows=32, dtype=torch.float32, prepare=None,
                     optimizer=None, patch_dropout=0.0) -> CLIP:
    """open_clip_train's ``train_one_epoch`` on ``rows`` random pairs, one epoch, with the
    model ``prepare(model)`` returns (default: the model) and AdamW (or ``optimizer(params)``)."""
    from open_clip_train.train import train_one_epoch

    model = _small_clip(seed, dtype, patch_dropout)
    if prepare is not None:
        model = prepare(model)
    g = torch.Generator().manual_seed(seed)
    data = {"train": _Data(torch.randn(rows, 3, 16, 16, generator=g).to(dtype),
                           torch.randint(1, 64, (rows, 8), generator=g), args.batch_size)}
    # open_clip's ViT defaults: eps 1e-6 also keeps Adam from turning the rounding noise of
    # gradients that are 0 in exact arithmetic (attention's key bias) into full-size steps
    optimizer = (torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-6)
                 if optimizer is None else optimizer(model.named_parameters()))
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


def _guide_caching() -> dict:
    """The guide's complete example and its gradient-caching block, run in order in one
    namespace as a reader runs them: the block's ``cache_towers`` as the guide defines it."""
    namespace: dict = {"__name__": "__docs__"}
    blocks = python_blocks(GUIDE)
    caching = next(b for b in blocks if "def cache_towers(" in b.code)
    for block in (blocks[0], caching):
        run_block(block, namespace)
    return namespace


@pytest.fixture(scope="module")
def cache_towers():
    return _guide_caching()["cache_towers"]


@pytest.mark.slow  # open_clip_train's loop, twice
def test_the_guides_cache_towers_trains_in_open_clip_trains_own_loop(cache_towers):
    """Issue 54 item 2: the guide's ``CachedCLIP`` failed after the first optimiser step in
    ``train_one_epoch`` (``AttributeError``: no ``logit_scale`` to clamp). The guide's
    ``cache_towers`` trains there, four steps of 8 pairs in chunks of 2, and every parameter
    (``logit_scale`` included) ends where the uncached run leaves it."""
    args = _args(batch_size=8)
    cached = _train_one_epoch(ClipLoss(cache_labels=True), args,
                              prepare=lambda m: cache_towers(m, 2))
    plain = _train_one_epoch(ClipLoss(cache_labels=True), args)
    assert type(cached) is CLIP and isinstance(cached.encode_image, functools.partial)
    assert [n for n, _ in cached.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert not torch.equal(cached.logit_scale, cached.before["logit_scale"])  # it trained
    _assert_same_parameters(cached, plain)


def test_the_guides_cached_model_saves_and_loads_open_clips_checkpoints(cache_towers, tmp_path):
    """Issue 54 item 2: the guide's wrapper saved its keys under ``clip.``. The cached model's
    ``state_dict`` is CLIP's: open_clip_train's checkpoint of it (``{"epoch", "state_dict"}``)
    loads into a plain ``CLIP`` and a plain one's into it, strictly; a deep copy (EMA, timm)
    calls its own towers."""
    cached = cache_towers(_small_clip(seed=1), 4)
    with torch.no_grad():
        cached.logit_scale.fill_(1.5)
    torch.save({"epoch": 1, "state_dict": cached.state_dict()}, tmp_path / "epoch_1.pt")
    plain = _small_clip(seed=2)
    plain.load_state_dict(torch.load(tmp_path / "epoch_1.pt")["state_dict"])
    for name, value in cached.state_dict().items():
        assert torch.equal(plain.state_dict()[name], value), name
    fresh = cache_towers(_small_clip(seed=3), 4)
    fresh.load_state_dict(plain.state_dict())
    assert fresh.logit_scale.item() == 1.5
    twin = copy.deepcopy(fresh)
    assert twin.encode_text.args[1] is twin and twin.encode_image.args[1] is twin
    images, texts = torch.randn(6, 3, 16, 16), torch.randint(1, 64, (6, 8))
    with torch.no_grad():  # evaluation and zero-shot: one chunked pass
        torch.testing.assert_close(fresh(images, texts)["image_features"],
                                   plain(images, texts)["image_features"])
        torch.testing.assert_close(twin.encode_text(texts, normalize=True),
                                   plain.encode_text(texts, normalize=True))


class _Gradients(torch.optim.Optimizer):
    """An optimiser that takes no step: it keeps each parameter's gradient at ``step()``."""

    def __init__(self, named):
        named = list(named)
        super().__init__([p for _, p in named], {"lr": 0.0})  # the loop logs an lr
        self.names = {id(p): n for n, p in named}
        self.seen: list[dict[str, torch.Tensor]] = []

    def step(self, closure=None):
        self.seen.append({self.names[id(p)]: p.grad.clone() for group in self.param_groups
                          for p in group["params"] if p.grad is not None})


def _one_step_gradients(args, **kwargs) -> dict[str, torch.Tensor]:
    """The gradients of the one optimiser step ``train_one_epoch`` takes on 16 pairs (float64)."""
    optimizers = []

    def recording(named):
        optimizers.append(_Gradients(named))
        return optimizers[-1]

    _train_one_epoch(ClipLoss(cache_labels=True), args, rows=16, dtype=torch.float64,
                     optimizer=recording, **kwargs)
    (seen,) = optimizers[0].seen
    return seen


def test_accum_freq_gives_logit_scale_k_times_its_gradient_caching_the_exact_one(cache_towers):
    """What the guide says of ``--accum-freq k``, measured in open_clip_train's loop (one step of
    16 pairs, float64): with ``k = 2`` sub-batches of 8 every parameter but ``logit_scale`` gets
    the whole batch's gradient, ``logit_scale`` twice it; the guide's ``cache_towers`` (chunks
    of 8, ``--accum-freq 1``) gives every parameter its whole-batch gradient."""
    whole = _one_step_gradients(_args(batch_size=16))
    accum = _one_step_gradients(_args(batch_size=8, accum_freq=2))
    cached = _one_step_gradients(_args(batch_size=16), prepare=lambda m: cache_towers(m, 8))
    assert set(whole) == set(accum) == set(cached) and "logit_scale" in whole
    for name, want in whole.items():
        torch.testing.assert_close(cached[name], want, rtol=1e-9, atol=1e-12, msg=name)
        factor = 2 if name == "logit_scale" else 1
        torch.testing.assert_close(accum[name], factor * want, rtol=1e-9, atol=1e-12, msg=name)
    assert abs(whole["logit_scale"].item()) > 1e-3  # a gradient that a factor 2 shows in


def test_accum_freq_draws_new_masks_caching_replays_them(cache_towers):
    """With patch dropout (a random mask per image), ``--accum-freq 2`` embeds sub-batch 0 again
    with a new mask: the features of its second loss are not those of its first, where it was
    the sub-batch with gradients. The cached step's gradient is the exact gradient of the loss
    it computed: that of the uncached towers run over the same chunks from the same random
    state (float64)."""
    seen: list[torch.Tensor] = []

    class Recording(ClipLoss):
        def forward(self, image_features, *args, **kwargs):
            seen.append(image_features.detach().clone())
            return super().forward(image_features, *args, **kwargs)

    for dropout in (0.0, 0.5):
        seen.clear()
        _train_one_epoch(Recording(cache_labels=True), _args(batch_size=8, accum_freq=2),
                         rows=16, dtype=torch.float64, patch_dropout=dropout)
        first, second = seen  # sub-batch 0 re-embedded, then cached from the first pass
        same = torch.allclose(first[:8], second[:8], rtol=0, atol=1e-12)
        assert same == (dropout == 0.0), dropout

    g = torch.Generator().manual_seed(5)
    images = torch.randn(16, 3, 16, 16, generator=g, dtype=torch.float64)
    texts = torch.randint(1, 64, (16, 8), generator=g)
    cached = cache_towers(_small_clip(dtype=torch.float64, patch_dropout=0.5), 4)
    plain = _small_clip(dtype=torch.float64, patch_dropout=0.5)
    loss = ClipLoss()
    torch.manual_seed(11)
    loss(**cached(images, texts), output_dict=False).backward()
    torch.manual_seed(11)
    chunks = [(images[b:b + 4], texts[b:b + 4]) for b in range(0, 16, 4)]
    image_features = torch.cat([plain.encode_image(i, normalize=True) for i, _ in chunks])
    text_features = torch.cat([plain.encode_text(t, normalize=True) for _, t in chunks])
    loss(image_features, text_features, plain.logit_scale.exp()).backward()
    for (name, a), (_, b) in zip(cached.named_parameters(), plain.named_parameters(),
                                 strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-12, msg=name)
