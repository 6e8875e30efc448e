"""Analytic gradients checked against finite differences in float64."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck

from adaptcl.plugins import (
    AMCLBarlowTwinsLoss,
    AMCLLoss,
    AMCLSimSiamLoss,
    ASCLBYOLLoss,
    ASCLLoss,
    DCLLoss,
    DualTemperatureLoss,
    FlatNCELoss,
    MACLLoss,
    PairTemperature,
    contrastive_kernel,
    soft_labels,
)

from ._helpers import LOSSES, names


def _inputs(n=5, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, d, generator=g, dtype=torch.float64, requires_grad=True),
            torch.randn(n, d, generator=g, dtype=torch.float64, requires_grad=True))


# Losses without stop-gradients are checked against finite differences directly. Those with
# sg() parts (MACL's temperature and V, FlatNCE, Dual temperature, ASCL's labels) cannot be:
# finite differences also move the frozen quantities. Their kernel is gradchecked with the
# frozen quantities as constants, and their gradient compared to the frozen formula.
EXACT = names(exact_grad=True)


@pytest.mark.parametrize("name", EXACT)
def test_losses_without_stop_gradients(name):
    """Every loss of the shared table with nothing detached, at temperature 0.5, wrt every
    input (the queue too)."""
    case = LOSSES[name]
    fn = case.build(temperature=0.5, dim=4).double()
    x = case.inputs(5, dim=4, dtype=torch.float64, k=4)
    assert gradcheck(lambda *t: fn(*t), x, eps=1e-6, atol=1e-5)


def test_macl_gradient_is_the_reweighted_infonce_gradient():
    """V = sg(1/W) leaves the InfoNCE graph intact and scales each anchor's gradient."""
    z0, z1 = _inputs()
    macl = MACLLoss(0.5, alpha=0.0, reweight=True, form="cross_view")
    g_macl = torch.autograd.grad(macl(z0, z1), z0)[0]
    a = torch.nn.functional.normalize(z0, dim=1)
    b = torch.nn.functional.normalize(z1, dim=1)
    logits = a @ b.T / 0.5
    per_anchor = torch.nn.functional.cross_entropy(logits, torch.arange(5), reduction="none")
    w = 1 - torch.softmax(logits, 1).diagonal()
    g_ref = torch.autograd.grad((per_anchor / w.detach()).mean(), z0)[0]
    torch.testing.assert_close(g_macl, g_ref)


@pytest.mark.parametrize("positive_in_denominator", [True, False])
def test_kernel_with_constant_weights_and_soft_targets(positive_in_denominator):
    g = torch.Generator().manual_seed(0)
    neg = torch.randn(4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    pos = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    log_w = torch.randn(4, generator=g, dtype=torch.float64)
    y = torch.rand(4, 7, generator=g, dtype=torch.float64)
    y = y / y.sum(1, keepdim=True)

    def weighted(n, p):
        return contrastive_kernel(n, p, positive_in_denominator=positive_in_denominator,
                                  log_weights=log_w).loss.sum()

    def soft(n, p):
        return contrastive_kernel(n, p, positive_in_denominator=positive_in_denominator,
                                  soft_targets=(y[:, 0], y[:, 1:])).loss.sum()

    assert gradcheck(weighted, (neg, pos), eps=1e-6, atol=1e-6)
    assert gradcheck(soft, (neg, pos), eps=1e-6, atol=1e-6)


def _frozen_grad(fn, z0, z1):
    return torch.autograd.grad(fn(z0, z1), (z0, z1))


def test_flatnce_gradient_is_dcl_gradient():
    z0, z1 = _inputs()
    for a, b in zip(_frozen_grad(FlatNCELoss(0.5), z0, z1), _frozen_grad(DCLLoss(0.5), z0, z1),
                    strict=True):
        torch.testing.assert_close(a, b)


def test_dual_temperature_gradient_is_the_frozen_weighted_gradient():
    z0, z1 = _inputs()
    a = torch.nn.functional.normalize(z0, dim=1)
    b = torch.nn.functional.normalize(z1, dim=1)

    def w(t):
        logits = a @ b.T / t
        return 1 - torch.softmax(logits, 1).diagonal()

    logits = a @ b.T / 0.5
    per_anchor = torch.nn.functional.cross_entropy(logits, torch.arange(5), reduction="none")
    ref = (per_anchor * (w(1.0) / w(0.5)).detach()).mean()
    ours = DualTemperatureLoss(0.5, 1.0, form="cross_view")(z0, z1)
    torch.testing.assert_close(ours, ref)
    for x, y in zip(torch.autograd.grad(ours, (z0, z1)), torch.autograd.grad(ref, (z0, z1)),
                    strict=True):
        torch.testing.assert_close(x, y)


def test_macl_dcl_gradient_is_dcl_at_the_adaptive_temperature():
    z0, z1 = _inputs()
    fn = MACLLoss(0.5, 0.5, reweight=False, positive_in_denominator=False, form="cross_view")
    g_macl = _frozen_grad(fn, z0, z1)
    tau = fn.last_stats["temperature"].item()
    for a, b in zip(g_macl, _frozen_grad(DCLLoss(tau, form="cross_view"), z0, z1), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("form", ["queue", "cross_view"])
def test_ascl_gradient_is_cross_entropy_with_frozen_soft_labels(form):
    z0, z1 = _inputs()
    queue = torch.randn(7, 4, dtype=torch.float64)
    fn = ASCLLoss(0.5, 0.25, num_neighbors=2)
    if form == "cross_view":
        fn = ASCLLoss(0.5, 0.25, num_neighbors=2, form="cross_view")
        queue = None
    (c,) = fn.candidates(z0, z1, queue)
    with torch.no_grad():
        y_pos, y_neg, _ = soft_labels(c.positive_keys @ c.keys.T, c.positive_mask(),
                                      num_neighbors=2, sharpen_temperature=0.25)
    q = torch.nn.functional.normalize(z0, dim=1)
    k = torch.nn.functional.normalize(z1, dim=1)
    if form == "queue":
        cand = torch.cat([(q * k).sum(1, keepdim=True), q @ torch.nn.functional.normalize(queue, dim=1).T], 1)
        targets = torch.cat([y_pos[:, None], y_neg], 1)
    else:
        cand = q @ k.T
        targets = y_neg + torch.diag(y_pos)
    ref = -(targets * torch.log_softmax(cand / 0.5, 1)).sum(1).mean()
    ours = fn(z0, z1, queue)
    torch.testing.assert_close(ours, ref)
    for a, b in zip(torch.autograd.grad(ours, (z0, z1)), torch.autograd.grad(ref, (z0, z1)),
                    strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("negative_term,objective", [
    ("topk", "nt_xent"), ("topk", "infonce"),
    pytest.param("softmax", "nt_xent", marks=pytest.mark.slow),
    pytest.param("softmax", "infonce", marks=pytest.mark.slow)])
def test_amcl_including_the_temperature_network(negative_term, objective):
    torch.manual_seed(0)
    net = PairTemperature(4, eta=0.05, iota=1.0).double()
    fn = AMCLLoss(net, beta=0.05, negative_term=negative_term, kappa=2, objective=objective)
    z0, z1 = _inputs()
    w, b = net.phi.weight, net.phi.bias
    assert gradcheck(lambda a, c, *_: fn(a, c), (z0, z1, w, b), eps=1e-6, atol=1e-5)


@pytest.mark.slow
def test_amcl_simsiam_and_barlow_twins():
    torch.manual_seed(0)
    net = PairTemperature(4, eta=0.05, iota=1.0).double()
    p0, p1 = _inputs(seed=1)
    z0, z1 = _inputs(seed=2)
    simsiam = AMCLSimSiamLoss(net, beta=0.05)
    assert gradcheck(lambda a, b: simsiam(a, b, z0, z1), (p0, p1), eps=1e-6, atol=1e-5)
    barlow = AMCLBarlowTwinsLoss(net, beta=0.05, lambda_param=0.1)
    assert gradcheck(lambda a, b: barlow(a, b), _inputs(n=6, seed=3), eps=1e-6, atol=1e-5)


def test_ascl_byol():
    fn = ASCLBYOLLoss(0.25, num_neighbors=2)
    p, t = _inputs()
    t = t.detach()  # targets come from the momentum encoder; labels depend on them only
    assert gradcheck(lambda a: fn(a, t), (p,), eps=1e-6, atol=1e-5)
