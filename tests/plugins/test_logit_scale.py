"""The learnable temperature (CLIP's logit scale): a float64 reference with its analytic
gradient, InfoNCE before any update, open_clip's clamp and its ``ClipLoss``, one temperature per
head, gradchecks including the parameter.

(Tiled == materialised with the parameter's gradient, functional == module and the hostile
inputs run on the table's ``learnable*`` cases in ``_helpers.LOSSES``; two processes in
``test_distributed.py``.)
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck

from adaptcl.plugins import InfoNCELoss, LearnableTemperatureLoss, learnable_temperature
from adaptcl.plugins.logit_scale import OPEN_CLIP_TEMPERATURE, scale_bounds

from ._helpers import pair

D64 = torch.float64
LOG100 = math.log(100)


def _unit(x):
    return x / x.norm(dim=1, keepdim=True)


def _clip_reference(z0, z1, s):
    """CLIP's symmetric loss written from the formula in float64, and its derivative in ``s``.

    ``l_ij = e^s <a_i, b_j>``; the loss is the mean over both directions of
    ``-l_ii + logsumexp_j l_ij``, so ``dL/ds = e^s * mean(-c_ii + sum_j p_ij c_ij)`` with ``p``
    the row softmax: a reference for the parameter's gradient that does not go through autograd.
    """
    a, b = _unit(z0.to(D64)), _unit(z1.to(D64))
    c = a @ b.T
    scale = math.exp(s)
    loss, grad = 0.0, 0.0
    for cos in (c, c.T):
        logits = scale * cos
        p = torch.softmax(logits, dim=1)
        loss = loss + (torch.logsumexp(logits, 1) - logits.diagonal()).mean() / 2
        grad = grad + scale * (-cos.diagonal() + (p * cos).sum(1)).mean() / 2
    return loss, grad


@pytest.mark.parametrize("s", [math.log(1 / 0.07), 0.3, LOG100])
def test_float64_reference_value_and_parameter_gradient(s):
    z0, z1 = pair(7, 5, seed=1, dtype=D64, grad=False)
    loss_fn = LearnableTemperatureLoss(form="cross_view_symmetric").double()
    with torch.no_grad():
        loss_fn.logit_scale.fill_(s)
    got = loss_fn(z0, z1)
    got.backward()
    want, want_grad = _clip_reference(z0, z1, s)
    # atol: the kernel's softplus(r) is torch's, which returns r once r > 20 (an error below
    # e^-20 = 2e-9 per anchor); at scale e^s = 100 some anchors here have r > 20
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-8)
    torch.testing.assert_close(loss_fn.logit_scale.grad, want_grad, rtol=1e-10, atol=1e-8)
    assert loss_fn.last_stats["temperature"].item() == pytest.approx(math.exp(-s), rel=1e-12)


@pytest.mark.parametrize("form", ["nt_xent", "cross_view", "cross_view_symmetric", "queue"])
@pytest.mark.parametrize("tile", [None, 4])
def test_before_any_update_it_is_infonce_at_its_temperature(form, tile):
    z0, z1 = pair(6, 8, seed=2)
    queue = torch.randn(5, 8, generator=torch.Generator().manual_seed(3))
    loss_fn = LearnableTemperatureLoss(0.07, form=form, tile_size=tile)
    tau = float(loss_fn.temperature)  # exp(-log(1/0.07)): 0.07 up to one rounding
    assert tau == pytest.approx(0.07, rel=1e-6)
    a, b = loss_fn(z0, z1, queue), InfoNCELoss(tau, form=form, tile_size=tile)(z0, z1, queue)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    for ga, gb in zip(torch.autograd.grad(a, (z0, z1)), torch.autograd.grad(b, (z0, z1)),
                      strict=True):
        torch.testing.assert_close(ga, gb, rtol=0, atol=0)
    # in float64 the initial temperature is 0.07 to float64 precision
    z0, z1 = pair(6, 8, seed=2, dtype=D64)
    loss_fn = LearnableTemperatureLoss(0.07, form=form).double()
    with torch.no_grad():  # the float64 initial value (the float32 one is 0.07 to 1e-8)
        loss_fn.logit_scale.fill_(math.log(1 / 0.07))
    torch.testing.assert_close(loss_fn(z0, z1, queue.double()),
                               InfoNCELoss(0.07, form=form)(z0, z1, queue.double()),
                               rtol=1e-13, atol=1e-13)


def test_defaults_are_open_clips():
    loss_fn = LearnableTemperatureLoss()
    assert loss_fn.logit_scale.shape == () and loss_fn.logit_scale.requires_grad
    assert loss_fn.logit_scale.item() == pytest.approx(math.log(1 / 0.07))  # init_logit_scale
    assert scale_bounds(loss_fn.min_temperature, loss_fn.max_temperature) == (0.0, LOG100)
    assert OPEN_CLIP_TEMPERATURE == {"temperature": 0.07, "min_temperature": 0.01,
                                     "max_temperature": 1.0}
    assert [n for n, _ in loss_fn.named_parameters()] == ["logit_scale"]
    assert "logit_scale" in loss_fn.state_dict()


def _aligned_batch(seed=0):
    """Two views whose positives are far closer than the negatives: lowering tau lowers the
    loss, so the optimiser drives s up, towards and past open_clip's bound log 100."""
    g = torch.Generator().manual_seed(seed)
    z0 = torch.randn(8, 16, generator=g)
    return z0, z0 + 0.5 * torch.randn(8, 16, generator=g)


def test_the_trajectory_of_s_is_open_clips_clamp_after_every_step():
    """open_clip's loop, as read in its train.py: forward with ``logit_scale.exp()`` (no clamp),
    backward, ``optimizer.step()``, then ``logit_scale.clamp_(0, log(100))`` under no_grad. Ours
    clamps lazily at the start of the next forward: the same s in every forward, the same
    losses, the same gradients (also at the bound, where ``torch.clamp``'s would be 0)."""
    z0, z1 = (z.double() for z in _aligned_batch())
    a, b = _unit(z0), _unit(z1)
    labels = torch.arange(8)
    theirs = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07), dtype=D64))
    their_opt = torch.optim.Adam([theirs], lr=0.6)
    loss_fn = LearnableTemperatureLoss(0.07, form="cross_view_symmetric").double()
    with torch.no_grad():
        loss_fn.logit_scale.copy_(theirs)
    our_opt = torch.optim.Adam(loss_fn.parameters(), lr=0.6)
    at_bound = 0
    for _ in range(8):
        logits = theirs.exp() * a @ b.T
        their_loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
        our_loss = loss_fn(z0, z1)  # clamps s first if the last step moved it
        torch.testing.assert_close(loss_fn.logit_scale.detach(), theirs.detach(), rtol=1e-12,
                                   atol=1e-12)
        torch.testing.assert_close(our_loss, their_loss, rtol=1e-12, atol=1e-12)
        for opt, loss in ((their_opt, their_loss), (our_opt, our_loss)):
            opt.zero_grad()
            loss.backward()
            opt.step()
        torch.testing.assert_close(loss_fn.logit_scale.grad, theirs.grad, rtol=1e-8, atol=1e-13)
        with torch.no_grad():
            theirs.clamp_(0, LOG100)
        at_bound += theirs.item() == LOG100
    assert at_bound >= 2  # the run sat at the bound, so the clamp and its gradient were exercised
    assert loss_fn.logit_scale.item() > LOG100  # unclamped until the next forward


def test_reads_between_steps_show_open_clips_clamped_value():
    """A step that pushes s past log 100 (17.05 where open_clip holds 4.6052): before the next
    forward, ``state_dict()`` and ``temperature`` show the clamped value, as open_clip's after its
    ``clamp_``; the parameter itself is untouched by the read, and a checkpoint written then resumes
    the same trajectory."""
    loss_fn = LearnableTemperatureLoss(0.07)
    optimizer = torch.optim.SGD(loss_fn.parameters(), lr=1.0)
    loss_fn(*_aligned_batch()).backward()
    with torch.no_grad():
        loss_fn.logit_scale.grad.fill_(-(17.05 - math.log(1 / 0.07)))  # the step lands at 17.05
    optimizer.step()
    assert loss_fn.logit_scale.item() == pytest.approx(17.05)  # raw, until the next forward
    state = loss_fn.state_dict()
    assert state["logit_scale"].item() == pytest.approx(LOG100)
    assert loss_fn.temperature.item() == pytest.approx(0.01)
    assert loss_fn.logit_scale.item() == pytest.approx(17.05)  # reading changed nothing
    assert isinstance(loss_fn.state_dict(keep_vars=True)["logit_scale"], torch.nn.Parameter)
    resumed = LearnableTemperatureLoss(0.07)
    resumed.load_state_dict(state)
    z0, z1 = _aligned_batch(1)
    torch.testing.assert_close(resumed(z0, z1), loss_fn(z0, z1), rtol=0, atol=0)
    per_head = LearnableTemperatureLoss(0.07, num_heads=2)
    with torch.no_grad():
        per_head.logit_scale.copy_(torch.tensor([-1.0, 9.0]))
    assert per_head.state_dict()["logit_scale"].tolist() == [0.0, pytest.approx(LOG100)]


def test_the_next_forward_clamps_after_an_update_and_reports_the_bound():
    loss_fn = LearnableTemperatureLoss(0.07)
    with torch.no_grad():
        loss_fn.logit_scale.add_(10.0)  # an optimiser step past the bound
    loss_fn(*_aligned_batch())
    assert loss_fn.logit_scale.item() == pytest.approx(LOG100)
    assert loss_fn.last_stats["temperature"].item() == pytest.approx(0.01)
    state = {"logit_scale": torch.tensor(-3.0)}  # tau = e^3 > 1: restored, then clamped to 0
    loss_fn.load_state_dict(state)
    loss_fn(*_aligned_batch())
    assert loss_fn.logit_scale.item() == 0.0


def test_two_forwards_before_one_backward_keep_the_graph():
    """A symmetric use (two calls, one backward): the second call's in-place clamp must not
    invalidate the first call's graph (it holds exp(-s) and the bounds' mask, never s)."""
    loss_fn = LearnableTemperatureLoss(0.1)
    z0, z1 = pair(6, 8)
    with torch.no_grad():
        loss_fn.logit_scale.mul_(1.0)  # an update: the first forward clamps
    total = loss_fn(z0, z1) + loss_fn(z1, z0)
    total.backward()  # no "modified by an inplace operation"
    assert loss_fn.logit_scale.grad is not None


def test_the_functional_form_clamps_out_of_place():
    z0, z1 = pair(6, 8, seed=4)
    s = torch.nn.Parameter(torch.tensor(7.0))  # beyond log 100
    loss = learnable_temperature(z0, z1, s)
    assert s.item() == 7.0  # the caller's parameter is untouched
    torch.testing.assert_close(loss, InfoNCELoss(math.exp(-LOG100))(z0, z1))
    loss.backward()
    assert s.grad.item() == 0.0  # outside the bounds the clamp passes no gradient
    with pytest.raises(TypeError, match="logit_scale must be a tensor"):
        learnable_temperature(z0, z1, 2.0)
    with pytest.raises(ValueError, match="logit_scale must be 0-d or"):
        learnable_temperature(z0, z1, torch.zeros(2, 2))


def test_gradcheck_wrt_embeddings_and_the_parameter():
    z0, z1 = pair(5, 4, seed=5, dtype=D64)
    for form in ("nt_xent", "cross_view_symmetric"):
        s = torch.tensor(1.3, dtype=D64, requires_grad=True)
        assert gradcheck(lambda a, b, t, form=form: learnable_temperature(a, b, t, form=form),
                         (z0, z1, s), eps=1e-6, atol=1e-6)
    heads = (torch.randn(2, 5, 4, dtype=D64, requires_grad=True),
             torch.randn(2, 5, 4, dtype=D64, requires_grad=True),
             torch.tensor([0.5, 2.0], dtype=D64, requires_grad=True))
    assert gradcheck(lambda a, b, t: learnable_temperature(a, b, t, tile_size=2), heads,
                     eps=1e-6, atol=1e-6)


def test_one_temperature_per_head_adds_the_heads_losses():
    g = torch.Generator().manual_seed(6)
    z0, z1 = torch.randn(3, 6, 8, generator=g), torch.randn(3, 6, 8, generator=g)
    loss_fn = LearnableTemperatureLoss(0.2, num_heads=3)
    assert loss_fn.logit_scale.shape == (3,)
    with torch.no_grad():
        loss_fn.logit_scale.copy_(torch.tensor([0.5, 1.5, 3.0]))
    got = loss_fn(z0, z1)
    want = sum(InfoNCELoss(math.exp(-s))(z0[h], z1[h]) for h, s in enumerate((0.5, 1.5, 3.0)))
    torch.testing.assert_close(got, want)
    got.backward()
    assert (loss_fn.logit_scale.grad != 0).all()
    assert loss_fn.last_stats["temperature"].item() == pytest.approx(
        sum(math.exp(-s) for s in (0.5, 1.5, 3.0)) / 3, rel=1e-6)
    assert loss_fn.temperature.shape == (3,)
    per_anchor = LearnableTemperatureLoss(0.2, num_heads=3, reduction="none")(z0, z1)
    assert per_anchor.shape == (12,)  # 2N anchors of the NT-Xent form, summed over heads
    queue = torch.randn(3, 4, 8, generator=g)
    qloss = LearnableTemperatureLoss(0.2, num_heads=3, form="queue")(z0, z1, queue)
    want = sum(InfoNCELoss(0.2, form="queue")(z0[h], z1[h], queue[h]) for h in range(3))
    torch.testing.assert_close(qloss, want)


def test_head_counts_must_match():
    loss_fn = LearnableTemperatureLoss(0.2, num_heads=2)
    with pytest.raises(ValueError, match=r"z0 has 3 head\(s\) .*\(num_heads=2\)"):
        loss_fn(torch.randn(3, 4, 8), torch.randn(3, 4, 8))
    with pytest.raises(ValueError, match=r"z0 has 1 head\(s\)"):  # [N, D] is one head
        loss_fn(torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(ValueError, match="negatives must have one"):
        LearnableTemperatureLoss(0.2, num_heads=2, form="queue")(
            torch.randn(2, 4, 8), torch.randn(2, 4, 8), torch.randn(3, 5, 8))
    one = LearnableTemperatureLoss(0.2)
    torch.testing.assert_close(one(torch.ones(1, 4, 8).cumsum(1), torch.ones(1, 4, 8).cumsum(2)),
                               one(torch.ones(4, 8).cumsum(0), torch.ones(4, 8).cumsum(1)))


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"temperature": 0.0}, ValueError, "temperature"),
    ({"temperature": 0.005}, ValueError, r"temperature must lie in \[min_temperature"),
    ({"temperature": 2.0}, ValueError, r"temperature must lie in"),
    ({"min_temperature": -1.0}, ValueError, "min_temperature"),
    ({"min_temperature": 0.5, "max_temperature": 0.2}, ValueError, "max_temperature must be >="),
    ({"num_heads": 0}, ValueError, "num_heads"),
    ({"form": "clip"}, ValueError, "form"),
    ({"tile_size": 0}, ValueError, "tile_size"),
])
def test_arguments_name_the_bad_one(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        LearnableTemperatureLoss(**kwargs)


def _open_clip_loss_module():
    """open_clip's ``loss.py``, loaded alone (the package's ``__init__`` imports its tokenizer's
    dependencies, which the loss does not need); skipped where open_clip is not installed."""
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("open_clip is not installed (pip install open_clip_torch; the dev extra has it)")
    path = Path(next(iter(spec.submodule_search_locations))) / "loss.py"
    module_spec = importlib.util.spec_from_file_location("_open_clip_loss", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def test_parity_with_open_clips_clip_loss_at_the_same_scale():
    """open_clip's ``ClipLoss(image, text, logit_scale.exp())`` on the features its model
    normalises (``encode_image(normalize=True)``) is this loss in the CLIP form at the same
    ``s``: value and gradients wrt the raw features and ``s``."""
    ClipLoss = _open_clip_loss_module().ClipLoss
    g = torch.Generator().manual_seed(7)
    image, text = torch.randn(9, 16, generator=g), torch.randn(9, 16, generator=g)
    for s_value in (math.log(1 / 0.07), 1.0, LOG100):
        x0, x1 = image.clone().requires_grad_(), text.clone().requires_grad_()
        s = torch.nn.Parameter(torch.tensor(s_value))
        theirs = ClipLoss()(F.normalize(x0, dim=-1), F.normalize(x1, dim=-1), s.exp())
        their_grads = torch.autograd.grad(theirs, (x0, x1, s))
        loss_fn = LearnableTemperatureLoss(form="cross_view_symmetric")
        with torch.no_grad():
            loss_fn.logit_scale.fill_(s_value)
        y0, y1 = image.clone().requires_grad_(), text.clone().requires_grad_()
        ours = loss_fn(y0, y1)
        our_grads = torch.autograd.grad(ours, (y0, y1, loss_fn.logit_scale))
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
        for a, b in zip(our_grads, their_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
