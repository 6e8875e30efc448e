"""DySTreSS (Manna et al., IEEE TAI 2025) against its formula and the authors' code, written out
here in float64 (not through the core): the cosine temperature of the paper, the piecewise
variant of the authors' SimCSE run, the temperature detached (their NT-Xent and SimCSE code) or
not (their DCL code, with one log-sum-exp over the negatives: the corrected DCL), every pair (the positive too) at its own temperature; tiled ==
materialised, the exact reduction to InfoNCE, gradchecks and hostile inputs. The shared table
(``_helpers.LOSSES``, ``dystress*``) also runs it through every generic test."""

from __future__ import annotations

import math

import pytest
import torch

from adaptcl.plugins import DySTreSSLoss, InfoNCELoss, dystress_temperature
from adaptcl.plugins import functional as F

from ._helpers import pair

pytestmark = pytest.mark.usefixtures("one_thread")

D64 = torch.float64


def _tau_cosine(s, low, high):
    """The paper: tau = tau_min + 1/2 (tau_max - tau_min) (1 + cos(pi (1 + s)))."""
    return low + 0.5 * (high - low) * (1 + torch.cos(math.pi * (1 + s)))


def _tau_piecewise(s, low, high, threshold=0.4, width=0.7):
    """The authors' ``get_temp2`` (SimCSE: offset -0.4, scale 0.7), transcribed: max above
    the threshold, a cosine ramp at or below it."""
    temp = torch.ones_like(s)
    below = s <= threshold
    temp[below] = low + 0.5 * (high - low) * (1 + torch.cos((s[below] - threshold) * math.pi / width))
    temp[~below] = high
    return temp


def _reference(z0, z1, low, high, *, form="nt_xent", tau=_tau_cosine, detach=True,
               dcl=False, negatives=None):
    """Mean loss from the formula: logits s_ij / tau(s_ij) on the whole matrix (the positive
    column included), cross-entropy on the positive (DCL: positive out of the denominator)."""
    a0 = z0 / z0.norm(dim=1, keepdim=True)
    a1 = z1 / z1.norm(dim=1, keepdim=True)
    n = a0.shape[0]
    if form == "nt_xent":
        anchors = torch.cat([a0, a1])
        keys = anchors
        positive = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
        excluded = torch.eye(2 * n, dtype=torch.bool)
    else:
        anchors, keys = a0, a1
        positive = torch.arange(n)
        excluded = torch.zeros(n, n, dtype=torch.bool)
    if negatives is not None:
        neg = negatives / negatives.norm(dim=1, keepdim=True)
        keys = torch.cat([keys, neg])
        excluded = torch.cat([excluded, torch.zeros(len(anchors), len(neg), dtype=torch.bool)], 1)
    s = anchors @ keys.T
    t = tau(s.detach() if detach else s, low, high)
    logits = (s / t).masked_fill(excluded, -math.inf)
    rows = torch.arange(len(anchors))
    pos = logits[rows, positive]
    if dcl:
        logits = logits.clone()
        logits[rows, positive] = -math.inf
    return (torch.logsumexp(logits, dim=1) - pos).mean()


def _both(ours, ref, inputs):
    la, lb = ours(*inputs), ref(*inputs)
    torch.testing.assert_close(la, lb, rtol=1e-12, atol=1e-12)
    for ga, gb in zip(torch.autograd.grad(la, inputs), torch.autograd.grad(lb, inputs), strict=True):
        torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("tile", [None, 4])
@pytest.mark.parametrize("detach", [True, False])
@pytest.mark.parametrize("form", ["nt_xent", "cross_view"])
def test_cosine_temperature_equals_the_papers_formula(form, detach, tile):
    z0, z1 = pair(7, 5, seed=1, dtype=D64)
    ours = DySTreSSLoss(0.1, 0.2, detach_temperature=detach, form=form, tile_size=tile)
    _both(ours, lambda a, b: _reference(a, b, 0.1, 0.2, form=form, detach=detach), (z0, z1))


@pytest.mark.parametrize("tile", [None, 3])
def test_piecewise_temperature_equals_the_authors_simcse_function(tile):
    """``get_temp2(cos, 0.04, 0.05)`` on cosines spread over [-1, 1] so both pieces are hit."""
    z0, z1 = pair(9, 3, seed=2, dtype=D64)
    ours = DySTreSSLoss(0.04, 0.05, shape="piecewise", form="cross_view", tile_size=tile)
    s = torch.nn.functional.normalize(z0, dim=1) @ torch.nn.functional.normalize(z1, dim=1).T
    assert (s > 0.4).any() and (s <= 0.4).any()
    _both(ours, lambda a, b: _reference(a, b, 0.04, 0.05, form="cross_view", tau=_tau_piecewise),
          (z0, z1))


@pytest.mark.parametrize("tile", [None, 2])
def test_dcl_form_with_a_differentiable_temperature_is_the_corrected_dcl(tile):
    """GraphCL's cross-view DCL with per-pair temperatures, the gradient flowing through tau
    (as in ``TSDCLLoss``, which does not detach), one log-sum-exp over every negative."""
    z0, z1 = pair(6, 4, seed=3, dtype=D64)
    ours = DySTreSSLoss(0.1, 0.2, positive_in_denominator=False, detach_temperature=False,
                        form="cross_view", tile_size=tile)
    _both(ours, lambda a, b: _reference(a, b, 0.1, 0.2, form="cross_view", detach=False,
                                        dcl=True), (z0, z1))


def _two_log_sum_exps(z0, z1, temperature):
    """The DCL formula with two separate log-sum-exp terms, over the same-view and over the
    cross-view negatives (the authors' ``TSDCLLoss``; Lightly's ``DCLLoss`` before 1.5.21),
    symmetric as Lightly's."""
    def direction(a, b):
        n = a.shape[0]
        off = ~torch.eye(n, dtype=torch.bool)
        s_aa, s_ab = a @ a.T / temperature, a @ b.T / temperature
        negative = (torch.logsumexp(s_aa[off].view(n, -1), dim=1)
                    + torch.logsumexp(s_ab[off].view(n, -1), dim=1))
        return (negative - s_ab.diagonal()).mean()

    a0, a1 = z0 / z0.norm(dim=1, keepdim=True), z1 / z1.norm(dim=1, keepdim=True)
    return (direction(a0, a1) + direction(a1, a0)) / 2


def test_dcl_form_is_lightlys_corrected_dcl_not_the_two_log_sum_exps_of_tsdcl():
    """What the docstring says of ``positive_in_denominator=False, detach_temperature=False``:
    at equal temperatures it is Lightly 1.6's ``DCLLoss`` (one log-sum-exp over all 2N - 2
    negatives) to float64 precision, and far from the two separate log-sum-exps of the authors'
    ``TSDCLLoss`` (the formula Lightly corrected in 1.5.21)."""
    lightly_loss = pytest.importorskip("lightly.loss")
    z0, z1 = pair(16, 8, seed=5, dtype=D64)
    ours = DySTreSSLoss(0.2, 0.2, positive_in_denominator=False, detach_temperature=False)(z0, z1)
    theirs = lightly_loss.DCLLoss(temperature=0.2)(z0, z1)
    torch.testing.assert_close(ours, theirs, rtol=1e-14, atol=1e-14)
    old = _two_log_sum_exps(z0, z1, 0.2)
    assert abs(old - ours) / ours > 0.3


def test_queue_and_extra_negatives_get_their_pair_temperatures():
    z0, z1 = pair(5, 4, seed=4, dtype=D64)
    queue = torch.randn(6, 4, generator=torch.Generator().manual_seed(9), dtype=D64,
                        requires_grad=True)
    for form in ("queue", "cross_view"):
        ours = DySTreSSLoss(0.1, 0.3, form=form)
        _both(lambda a, b, q, ours=ours: ours(a, b, q),
              lambda a, b, q, form=form: _reference(a, b, 0.1, 0.3, form="cross_view",
                                                    negatives=q)
              if form == "cross_view" else _queue_reference(a, b, q), (z0, z1, queue))


def _queue_reference(z0, z1, q):
    """MoCo: each anchor against its own positive and the queue only."""
    a0, a1, k = (x / x.norm(dim=1, keepdim=True) for x in (z0, z1, q))
    s_pos, s_neg = (a0 * a1).sum(1, keepdim=True), a0 @ k.T
    s = torch.cat([s_pos, s_neg], dim=1)
    logits = s / _tau_cosine(s.detach(), 0.1, 0.3)
    return (torch.logsumexp(logits, dim=1) - logits[:, 0]).mean()


def test_temperature_function_values():
    s = torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0], dtype=D64)
    expected = torch.tensor([0.2, 0.15, 0.1, 0.15, 0.2], dtype=D64)  # tau_max at +-1, tau_min at 0
    torch.testing.assert_close(dystress_temperature(s, 0.1, 0.2), expected)
    piecewise = dystress_temperature(s, 0.04, 0.05, shape="piecewise")
    torch.testing.assert_close(piecewise, _tau_piecewise(s, 0.04, 0.05))
    assert piecewise[-1] == 0.05 and piecewise[3] == 0.05  # above the threshold 0.4: tau_max


@pytest.mark.parametrize("form", ["nt_xent", "cross_view", "queue"])
def test_equal_temperatures_are_infonce_to_float64_precision(form):
    z0, z1 = pair(6, 5, seed=5, dtype=D64)
    queue = torch.randn(4, 5, generator=torch.Generator().manual_seed(1), dtype=D64)
    neg = queue if form == "queue" else None
    for shape in ("cosine", "piecewise"):
        ours = DySTreSSLoss(0.15, 0.15, shape=shape, form=form)
        _both(lambda a, b, ours=ours: ours(a, b, neg),
              lambda a, b: InfoNCELoss(0.15, form=form)(a, b, neg), (z0, z1))


@pytest.mark.parametrize("tile", [None, 3])
@pytest.mark.parametrize("shape", ["cosine", "piecewise"])
def test_gradcheck_with_the_temperature_differentiable(shape, tile):
    """Nothing is detached with ``detach_temperature=False``: finite differences check the
    whole gradient, the streamed backward's written-out ``d(s / tau(s)) / ds`` included."""
    z0, z1 = pair(5, 3, seed=6, dtype=D64)
    fn = DySTreSSLoss(0.1, 0.25, shape=shape, threshold=0.1, width=0.5,
                      detach_temperature=False, tile_size=tile)
    assert torch.autograd.gradcheck(lambda a, b: fn(a, b), (z0, z1), eps=1e-6, atol=1e-6)


def test_every_pair_positive_included_gets_its_own_temperature():
    """The positive's logit is s_ii / tau(s_ii): moving only the positive's cosine changes its
    temperature, so the loss differs from the same loss with the positive at tau_min."""
    z0, z1 = pair(4, 8, seed=7, dtype=D64, grad=False)
    z1 = z0 + 0.05 * z1  # positives near cos 1: tau(s_ii) near tau_max
    fn = DySTreSSLoss(0.1, 0.2, form="cross_view")
    fn(z0, z1)
    s = (torch.nn.functional.normalize(z0, dim=1) * torch.nn.functional.normalize(z1, dim=1)).sum(1)
    torch.testing.assert_close(fn.last_stats["temperature"], _tau_cosine(s, 0.1, 0.2).mean())
    assert fn.last_stats["temperature"] > 0.19


def test_functional_equals_module_with_every_reduction():
    z0, z1 = pair(6, 4, seed=8)
    for reduction in ("mean", "sum", "none"):
        kwargs = {"shape": "piecewise", "form": "cross_view_symmetric", "reduction": reduction}
        torch.testing.assert_close(F.dystress(z0, z1, 0.05, 0.1, **kwargs),
                                   DySTreSSLoss(0.05, 0.1, **kwargs)(z0, z1), rtol=0, atol=0)
    assert F.dystress(z0, z1, reduction="none").shape == (12,)


@pytest.mark.parametrize("case", ["identical", "antipodal", "zero"])
@pytest.mark.parametrize("tile", [None, 3])
def test_hostile_inputs_stay_finite(case, tile):
    """cos = +-1 exactly (tau = tau_max, its slope sin(2 pi) / sin(0) ~ 0) and zero rows."""
    base = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    if case == "identical":
        z0, z1 = base.clone(), base.clone()
    elif case == "antipodal":
        z0 = torch.zeros(6, 4)
        z0[:, 0] = torch.tensor([1.0, -1.0] * 3)
        z1 = z0.clone()
    else:
        z0, z1 = torch.zeros(6, 4), torch.zeros(6, 4)
    for detach in (True, False):
        a, b = z0.clone().requires_grad_(), z1.clone().requires_grad_()
        loss = DySTreSSLoss(0.01, 0.05, detach_temperature=detach, tile_size=tile)(a, b)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(a.grad).all() and torch.isfinite(b.grad).all()


@pytest.mark.parametrize("kwargs, match", [
    ({"min_temperature": 0.3, "max_temperature": 0.2}, "min_temperature must be <= max_temperature"),
    ({"min_temperature": 0.0}, "min_temperature must be"),
    ({"shape": "sine"}, "shape must be one of"),
    ({"width": 0.0}, "width must be"),
    ({"threshold": math.inf}, "threshold must be finite"),
    ({"detach_temperature": 1}, "detach_temperature must be a bool"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        DySTreSSLoss(**kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        F.dystress(*pair(3, 2), **kwargs)


def test_repr_names_the_shape():
    assert "shape='piecewise', threshold=0.4, width=0.7" in repr(DySTreSSLoss(shape="piecewise"))
    assert "min_temperature=0.1, max_temperature=0.2, shape='cosine'" in repr(DySTreSSLoss())
