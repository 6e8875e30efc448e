"""No NaN or inf, in loss or gradient, on the inputs that break the reference implementations."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptcl.plugins import ASCLLoss, DCLLoss, InfoNCELoss, MACLLoss

from ._helpers import LOSSES, names

# Every loss of the shared table called on two views, at temperature 0.01 (where a temperature
# applies) for 16-dimensional embeddings.
TWO_VIEW = names(kind=("pair", "barlow"))


def _loss(name):
    return LOSSES[name].build(temperature=0.01, dim=16)


def _hostile_pairs():
    torch.manual_seed(0)
    z = torch.randn(8, 16)
    e = torch.zeros(8, 16)
    e[:4, 0], e[4:, 0] = 1.0, -1.0  # cosines exactly +1 and -1
    return {
        "identical_views": (z, z.clone()),
        "collapsed": (torch.ones(8, 16), torch.ones(8, 16)),
        "zero_vectors": (torch.zeros(8, 16), torch.zeros(8, 16)),
        "cos_plus_minus_one": (e, e.clone()),
        "huge_norms": (z * 1e30, z * 1e30),
        "tiny_norms": (z * 1e-30, z.clone() * 1e-30),
    }


@pytest.mark.parametrize("case", list(_hostile_pairs()))
@pytest.mark.parametrize("name", TWO_VIEW)
def test_finite_loss_and_gradient(name, case):
    a, b = _hostile_pairs()[case]
    z0, z1 = a.clone().requires_grad_(), b.clone().requires_grad_()
    loss = _loss(name)(z0, z1)
    assert torch.isfinite(loss), f"{name} on {case}: {loss}"
    g0, g1 = torch.autograd.grad(loss, (z0, z1), allow_unused=True)
    for g in (g0, g1):
        assert g is None or torch.isfinite(g).all(), f"{name} on {case}: non-finite gradient"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", TWO_VIEW)
def test_autocast_computes_in_float32(name, dtype):
    torch.manual_seed(1)
    enc = torch.nn.Linear(16, 16)
    x0, x1 = torch.randn(8, 16), torch.randn(8, 16)
    with torch.autocast("cpu", dtype=dtype):
        z0, z1 = enc(x0), enc(x1)
        assert z0.dtype == dtype
        loss = _loss(name)(z0, z1)
    assert loss.dtype == torch.float32
    assert torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(enc.weight.grad).all()
    # Same value as the float32 computation on the same (rounded) embeddings.
    ref = _loss(name)(z0.detach().float(), z1.detach().float())  # AMCL: the same seeded network
    torch.testing.assert_close(loss.detach(), ref, rtol=2e-3, atol=2e-3)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 24), d=st.integers(1, 20), seed=st.integers(0, 10_000),
       scale=st.sampled_from([1e-6, 1.0, 1e6]), t=st.sampled_from([0.01, 0.1, 1.0]),
       form=st.sampled_from(["nt_xent", "cross_view", "cross_view_symmetric"]))
def test_random_shapes(n, d, seed, scale, t, form):
    g = torch.Generator().manual_seed(seed)
    z0 = (torch.randn(n, d, generator=g) * scale).requires_grad_()
    z1 = (torch.randn(n, d, generator=g) * scale).requires_grad_()
    for fn in (InfoNCELoss(t, form=form), MACLLoss(t, 2.0, 0.8, form=form), DCLLoss(t, form=form)):
        loss = fn(z0, z1)
        assert loss.shape == () and torch.isfinite(loss)
        for grad in torch.autograd.grad(loss, (z0, z1)):
            assert grad.shape == (n, d) and torch.isfinite(grad).all()
    if form != "nt_xent":
        # In-batch ASCL needs n - 1 >= num_neighbors negatives.
        loss = ASCLLoss(t, t / 2, num_neighbors=1, form="cross_view")(z0, z1)
        assert torch.isfinite(loss)


@pytest.mark.parametrize("scale", [1e19, 1e30, 1e37])
def test_huge_norms_normalise_without_overflow_and_keep_their_gradient(scale):
    """|x|^2 overflows float32 above ~1.8e19: the loss and its gradient must be those of the
    same directions at unit scale (the gradient of x / |x| shrinks as 1 / |x|)."""
    g = torch.Generator().manual_seed(4)
    z0, z1 = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    small = tuple(t.clone().requires_grad_() for t in (z0, z1))
    big = tuple((t * scale).requires_grad_() for t in (z0, z1))
    loss_small, loss_big = MACLLoss(0.1, 0.5)(*small), MACLLoss(0.1, 0.5)(*big)
    torch.testing.assert_close(loss_big, loss_small)
    for gs, gb in zip(torch.autograd.grad(loss_small, small), torch.autograd.grad(loss_big, big),
                      strict=True):
        torch.testing.assert_close((gb * scale), gs, rtol=1e-4, atol=1e-6)


def test_normalisation_matches_torch_bitwise_on_ordinary_rows():
    from adaptcl.plugins.candidates import normalize

    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(0)) * 3
    assert torch.equal(normalize(x), torch.nn.functional.normalize(x, dim=1))


@pytest.mark.parametrize("norm", [0.0, 1e-30, 1e-8])
def test_degenerate_rows_get_zero_embedding_and_zero_gradient(norm):
    """A row of norm <= MIN_NORM (1e-6) has no direction: it normalises to 0 and gets no
    gradient, where F.normalize amplifies the gradient by 1 / eps = 1e12 (and Lightly with it)."""
    from adaptcl.plugins.candidates import MIN_NORM

    assert norm <= MIN_NORM
    g = torch.Generator().manual_seed(5)
    z0, z1 = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    z0[2] = torch.randn(8, generator=g) * norm / (8 ** 0.5)
    z0.requires_grad_()
    z1.requires_grad_()
    loss = InfoNCELoss(0.1)(z0, z1)
    g0, g1 = torch.autograd.grad(loss, (z0, z1))
    assert torch.equal(g0[2], torch.zeros(8))
    assert g0.abs().max() < 10 and g1.abs().max() < 10  # the other rows: ordinary gradients


def test_rows_just_above_the_degenerate_norm_have_a_bounded_gradient():
    from adaptcl.plugins.candidates import MIN_NORM

    z0, z1 = torch.randn(6, 8), torch.randn(6, 8)
    z0[0] = z0[0] / z0[0].norm() * (2 * MIN_NORM)
    z0.requires_grad_()
    g0, = torch.autograd.grad(InfoNCELoss(0.1)(z0, z1), z0)
    # exact gradient of x / |x|: |g| <= |dL/dy| / |x|, and |dL/dy| <= 2 / tau here
    assert torch.isfinite(g0).all() and g0[0].norm() <= 2 / 0.1 / (2 * MIN_NORM)
