"""The drop-ins for open_clip's ``ClipLoss`` on one process: parity with ``ClipLoss`` (value and
gradients of the features and of the learned ``logit_scale``), ``cache_labels``,
``output_dict``, ``logit_bias``; each method's use of ``logit_scale``; multi-positive labels; the
tiled path; the factory."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

open_clip_loss = pytest.importorskip("open_clip.loss")

from adaptcl.adapters.open_clip import (  # noqa: E402
    CLIP_LOSSES,
    LOSS_NAMES,
    DCLClipLoss,
    DySTreSSClipLoss,
    InfoNCEClipLoss,
    MACLClipLoss,
    TemperatureScheduleClipLoss,
    build_clip_loss,
)
from adaptcl.plugins import tiling  # noqa: E402

ClipLoss = open_clip_loss.ClipLoss
N, D = 8, 16
IGNORES_SCALE = "ignore:.*ignores logit_scale"


def _inputs(seed=0, n=N, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, D, generator=g, dtype=dtype), torch.randn(n, D, generator=g, dtype=dtype)


def _step(fn, image, text, scale=1 / 0.07, **kwargs):
    """``fn`` called as open_clip's training loop calls it: unit features from the model, the
    exponentiated learned scale; returns the value and the gradients of the raw features and
    of the log scale."""
    x0, x1 = image.clone().requires_grad_(), text.clone().requires_grad_()
    s = torch.tensor(math.log(scale), dtype=image.dtype, requires_grad=True)
    loss = fn(F.normalize(x0, dim=-1), F.normalize(x1, dim=-1), s.exp(), **kwargs)
    value = loss["contrastive_loss"] if isinstance(loss, dict) else loss
    value.backward()
    return value.detach(), x0.grad, x1.grad, s.grad


def _assert_steps_close(a, b, **tol):
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, **tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scale", [1 / 0.07, 100.0, 1.0])
def test_infonce_equals_cliploss_in_value_and_gradients(dtype, scale):
    image, text = _inputs(dtype=dtype)
    tol = {} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-6}
    _assert_steps_close(_step(InfoNCEClipLoss(), image, text, scale),
                        _step(ClipLoss(), image, text, scale), **tol)


def test_output_dict_cache_labels_and_logit_bias_as_cliploss():
    image, text = _inputs(1)
    ours, theirs = InfoNCEClipLoss(cache_labels=True), ClipLoss(cache_labels=True)
    for n in (N, N, 5):  # a cached batch size, then another one
        bias = torch.tensor(-3.0, dtype=torch.float64, requires_grad=True)
        got = _step(ours, image[:n], text[:n], output_dict=True, logit_bias=bias)
        want = _step(theirs, image[:n], text[:n], output_dict=True, logit_bias=bias)
        _assert_steps_close(got, want)
        assert ours.prev_num_logits == theirs.prev_num_logits == n
        assert set(ours.labels) == {torch.device("cpu")}
    # the bias cancels in every softmax: an exact zero gradient (ClipLoss's is rounding noise)
    bias = torch.tensor(2.0, requires_grad=True)
    ours(*(F.normalize(x.float(), dim=-1) for x in image_text(2)), 10.0, bias).backward()
    assert bias.grad == 0
    assert ours(*image_text(2), torch.tensor(10.0), output_dict=False).ndim == 0
    without = InfoNCEClipLoss()
    assert not without.cache_labels and isinstance(without, ClipLoss)


def image_text(seed):
    return tuple(x.float() for x in _inputs(seed))


def test_learned_temperature_trains_as_with_cliploss_under_open_clips_clamp():
    """A learned log scale started under open_clip's bound ln 100 and pushed over it by a
    large learning rate (aligned pairs: a larger scale lowers the loss): with open_clip's
    in-place clamp after each step, the trajectory of the scale and of the loss is ClipLoss's,
    and the clamp is hit."""
    image, noise = _inputs(3)
    text = image + 0.8 * noise
    runs = []
    for fn in (ClipLoss(), InfoNCEClipLoss()):
        s = torch.nn.Parameter(torch.tensor(math.log(100) - 0.5, dtype=torch.float64))
        z = torch.nn.Parameter(image.clone())
        optimizer = torch.optim.SGD([{"params": [s], "lr": 5000.0}, {"params": [z]}], lr=0.5)
        trace = []
        for _ in range(6):
            loss = fn(F.normalize(z, dim=-1), F.normalize(text, dim=-1), s.exp())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                s.clamp_(0, math.log(100))  # open_clip_train's train_one_epoch
            trace.append((loss.detach(), s.detach().clone()))
        runs.append(trace)
    for (loss_a, s_a), (loss_b, s_b) in zip(*runs, strict=True):
        torch.testing.assert_close(loss_a, loss_b)
        torch.testing.assert_close(s_a, s_b)
    assert any(s == math.log(100) for _, s in runs[1])  # the clamp was reached


def test_macl_without_its_adaptive_parts_is_cliploss():
    image, text = _inputs(4)
    _assert_steps_close(_step(MACLClipLoss(alpha=0.0, reweight=False), image, text),
                        _step(ClipLoss(), image, text))
    _assert_steps_close(_step(MACLClipLoss(adaptive=False, reweight=False), image, text),
                        _step(ClipLoss(), image, text))


@pytest.mark.parametrize("temperature_form", ["linear", "exp"])
def test_macl_temperature_is_tau0_from_logit_scale_times_the_detached_factor(temperature_form):
    """tau = (1 / logit_scale) * f(A), f detached: the value and every gradient (the log
    scale's included) are ClipLoss's at the scale ``logit_scale / f`` with f a constant."""
    image, text = _inputs(5)
    alpha, a0, scale = (0.7, 0.1, 20.0) if temperature_form == "linear" else (1.8, 0.0, 20.0)
    loss_fn = MACLClipLoss(alpha=alpha, a0=a0, reweight=False, temperature_form=temperature_form)
    got = _step(loss_fn, image, text, scale)
    a = (F.normalize(image, dim=-1) * F.normalize(text, dim=-1)).sum(-1).mean()
    factor = float(1 + alpha * (a - a0) if temperature_form == "linear" else alpha ** a)
    assert loss_fn.last_stats["alignment"].item() == pytest.approx(float(a), rel=1e-12)
    assert loss_fn.last_stats["temperature"].item() == pytest.approx(factor / scale, rel=1e-12)
    _assert_steps_close(got, _step(ClipLoss(), image, text, scale / factor))


def test_macl_floor_follows_tau0_or_is_absolute():
    image, text = _inputs(6)
    low = MACLClipLoss(alpha=10.0, a0=1.0, reweight=False)  # 1 + 10 (A - 1) < 0.1
    _step(low, image, text, 20.0)
    assert low.last_stats["temperature"].item() == pytest.approx(1 / 20 / 10)
    absolute = MACLClipLoss(alpha=10.0, a0=1.0, reweight=False, min_temperature=0.02)
    _step(absolute, image, text, 20.0)
    assert absolute.last_stats["temperature"].item() == pytest.approx(0.02)


def test_macl_reweighting_changes_the_gradient_not_the_plain_loss():
    image, text = _inputs(7)
    plain = MACLClipLoss(alpha=0.5, reweight=False)
    weighted = MACLClipLoss(alpha=0.5)
    g_plain, g_weighted = _step(plain, image, text), _step(weighted, image, text)
    torch.testing.assert_close(plain.last_stats["plain_loss"], weighted.last_stats["plain_loss"])
    assert not torch.allclose(g_plain[1], g_weighted[1])
    assert weighted.last_stats["mean_w"] < 1


def _multi_positive_reference(image, text, scale, labels):
    """SupCon's L_out in both directions, written out: each row's loss is the log-sum-exp over
    every column minus the mean logit of its same-class columns."""
    logits = scale * F.normalize(image, dim=-1) @ F.normalize(text, dim=-1).T
    same = (labels[:, None] == labels[None, :]).to(logits.dtype)
    total = 0
    for rows in (logits, logits.T):
        lse = torch.logsumexp(rows, dim=1)
        total = total + (lse - (rows * same).sum(1) / same.sum(1)).mean()
    return total / 2


def test_labels_give_every_same_class_image_and_text_as_positives():
    image, text = _inputs(8)
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 3, 3])
    got = InfoNCEClipLoss()(image, text, 14.0, labels=labels)
    torch.testing.assert_close(got, _multi_positive_reference(image, text, 14.0, labels))
    distinct = torch.tensor([5, 1, 0, 2, 7, 3, 4, 6])
    _assert_steps_close(_step(InfoNCEClipLoss(), image, text, labels=distinct),
                        _step(ClipLoss(), image, text))
    assert not torch.allclose(got, InfoNCEClipLoss()(image, text, 14.0))


def test_macl_and_dystress_take_labels_with_their_temperatures():
    image, text = _inputs(9)
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 3, 3])
    macl = MACLClipLoss(alpha=0.5, reweight=False)
    value = macl(image, text, 14.0, labels=labels)
    tau = macl.last_stats["temperature"].item()
    torch.testing.assert_close(value, _multi_positive_reference(image, text, 1 / tau, labels))
    flat = DySTreSSClipLoss(min_temperature=1 / 14.0, max_temperature=1 / 14.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(flat(image, text, 3.0, labels=labels),
                                   _multi_positive_reference(image, text, 14.0, labels))


def test_dcl_drops_each_positive_from_its_denominator():
    image, text = _inputs(10)
    logits = 14.0 * F.normalize(image, dim=-1) @ F.normalize(text, dim=-1).T
    eye = torch.eye(N, dtype=torch.bool)
    want = sum((torch.logsumexp(m.masked_fill(eye, -math.inf), 1) - m.diagonal()).mean()
               for m in (logits, logits.T)) / 2
    torch.testing.assert_close(DCLClipLoss()(image, text, 14.0), want)


@pytest.mark.filterwarnings(IGNORES_SCALE)
def test_dystress_ignores_logit_scale_with_one_warning_and_a_zero_gradient():
    image, text = _inputs(11)
    fn = DySTreSSClipLoss(min_temperature=0.05, max_temperature=0.05)
    with pytest.warns(UserWarning, match="DySTreSSClipLoss ignores logit_scale") as record:
        got = _step(fn, image, text, 3.0)
        _step(fn, image, text, 50.0)
    assert len(record) == 1  # once per instance
    assert got[3] == 0  # the learned scale: a zero gradient, not None (DDP sees it used)
    _assert_steps_close(got[:3], _step(ClipLoss(), image, text, 20.0)[:3])
    shaped = DySTreSSClipLoss()
    value = shaped(image, text, 14.0)
    assert 0.1 <= shaped.last_stats["temperature"] <= 0.2 and torch.isfinite(value)
    assert not torch.allclose(value, InfoNCEClipLoss()(image, text, 10.0))


@pytest.mark.filterwarnings(IGNORES_SCALE)
def test_temperature_schedule_counts_steps_until_driven():
    image, text = _inputs(12)
    fn = TemperatureScheduleClipLoss(min_temperature=0.02, max_temperature=0.1, period=4)
    got = _step(fn, image, text, 3.0)  # step 0: tau_max
    _assert_steps_close(got[:3], _step(ClipLoss(), image, text, 10.0)[:3])
    assert got[3] == 0 and fn.step == 1  # counted one training step
    with torch.no_grad():
        fn(image, text, 3.0)
    assert fn.step == 1  # evaluation does not count
    fn.step = 2  # a driver takes over: tau_min, no more counting
    torch.testing.assert_close(fn(image, text, 3.0), InfoNCEClipLoss()(image, text, 50.0))
    assert fn.step == 2 and fn.temperature == pytest.approx(0.02)
    assert fn.advance() == 3
    restored = TemperatureScheduleClipLoss(period=4)
    restored.load_state_dict(fn.state_dict())
    assert restored.step == 3


LOSSES = {
    "infonce": lambda tile: InfoNCEClipLoss(tile_size=tile),
    "dcl": lambda tile: DCLClipLoss(tile_size=tile),
    "macl": lambda tile: MACLClipLoss(alpha=0.5, a0=0.2, tile_size=tile),
    "dystress": lambda tile: DySTreSSClipLoss(shape="piecewise", threshold=0.1, tile_size=tile),
    "schedule": lambda tile: TemperatureScheduleClipLoss(step=100, tile_size=tile),
}


@pytest.mark.filterwarnings(IGNORES_SCALE)
@pytest.mark.parametrize("name", list(LOSSES))
def test_tiled_path_equals_the_materialised_one(name):
    image, text = _inputs(13, n=11)
    _assert_steps_close(_step(LOSSES[name](3), image, text), _step(LOSSES[name](None), image, text))


@pytest.mark.filterwarnings(IGNORES_SCALE)
def test_tiled_path_with_labels():
    image, text = _inputs(14, n=11)
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 3, 3, 2, 1, 0])
    for make in (lambda t: InfoNCEClipLoss(tile_size=t),
                 lambda t: MACLClipLoss(reweight=False, tile_size=t),
                 lambda t: DySTreSSClipLoss(tile_size=t)):
        _assert_steps_close(_step(make(4), image, text, labels=labels),
                            _step(make(None), image, text, labels=labels))


def test_half_precision_features_are_computed_in_float32():
    """bf16 features: float32 everywhere but the products' operands, which are bf16 (the
    precision policy, adaptcl.plugins._products): bit for bit the float32 loss of the same
    values with bf16 products (PyTorch's "medium"), and ClipLoss's float32 value to bf16's
    rounding of the products."""
    image, text = (x.float() for x in _inputs(15))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = InfoNCEClipLoss()(image.bfloat16(), text.bfloat16(), torch.tensor(14.0))
    assert got.dtype == torch.float32
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        with tiling(emulate_tensor_cores=True):  # float32 on the CPU at "medium": bf16 products
            same_policy = InfoNCEClipLoss()(image.bfloat16().float(), text.bfloat16().float(),
                                            torch.tensor(14.0))
    finally:
        torch.set_float32_matmul_precision(before)
    assert torch.equal(got, same_policy)
    want = ClipLoss()(*(F.normalize(x.bfloat16().float(), dim=-1) for x in (image, text)), 14.0)
    torch.testing.assert_close(got, want, rtol=1e-2, atol=0)
    assert not torch.equal(got, want)


@pytest.mark.filterwarnings(IGNORES_SCALE)
@pytest.mark.parametrize("name", LOSS_NAMES)
def test_factory_builds_each_loss_by_its_registry_name(name):
    loss = build_clip_loss(name, cache_labels=True)
    assert type(loss) is CLIP_LOSSES[name] and isinstance(loss, ClipLoss) and loss.cache_labels
    assert torch.isfinite(loss(*image_text(16), torch.tensor(14.0)))
    assert isinstance(build_clip_loss(name.upper()), CLIP_LOSSES[name])


def test_factory_passes_method_keywords_and_refuses_unknown_names():
    assert build_clip_loss("macl", alpha=2.0, a0=0.8).criterion.alpha == 2.0
    with pytest.warns(FutureWarning, match="'nt_xent' is deprecated"):
        assert type(build_clip_loss("nt_xent")) is InfoNCEClipLoss
    with pytest.raises(ValueError, match=r"^unknown loss 'siglip'; choose from infonce, dcl, "
                                         r"macl, dystress, temperature_schedule$"):
        build_clip_loss("siglip")
    with pytest.raises(ValueError, match="'amcl' is not available here; choose from infonce"):
        build_clip_loss("amcl")
    with pytest.raises(TypeError, match="alpha"):
        build_clip_loss("infonce", alpha=0.5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_equals_cliploss_tiled_too_and_mixes_a_cpu_scale():
    image, text = (x.float().cuda() for x in _inputs(17, n=64))
    for tile in (None, 16):
        _assert_steps_close(_step(InfoNCEClipLoss(tile_size=tile), image, text),
                            _step(ClipLoss(), image, text), rtol=1e-5, atol=1e-6)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = InfoNCEClipLoss()(image.bfloat16(), text.bfloat16(), torch.tensor(14.0).cuda())
    assert got.dtype == torch.float32 and torch.isfinite(got)
    cpu_scale = InfoNCEClipLoss()(image, text, torch.tensor(14.0))  # a CPU scalar mixes in
    torch.testing.assert_close(cpu_scale.cpu(), ClipLoss()(
        *(F.normalize(x, dim=-1) for x in (image, text)), 14.0).cpu(), rtol=1e-5, atol=1e-6)
