"""Exact reductions: every adaptive loss collapses to its baseline when its change is off."""

from __future__ import annotations

import pytest
import torch

from adaptcl.plugins import (
    AMCLLoss,
    ASCLBYOLLoss,
    ASCLLoss,
    ConstantTemperature,
    DCLLoss,
    DualTemperatureLoss,
    InfoNCELoss,
    MACLLoss,
)

from ._helpers import assert_close_with_grads, pair

FORMS = ["nt_xent", "cross_view", "cross_view_symmetric"]


def _manual_infonce(z0, z1, t):
    """Plain cross-entropy reference for the one-direction cross-view form."""
    a, b = torch.nn.functional.normalize(z0, dim=1), torch.nn.functional.normalize(z1, dim=1)
    logits = a @ b.T / t
    return torch.nn.functional.cross_entropy(logits, torch.arange(len(a)))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("t", [0.07, 0.5])
def test_macl_without_adaptation_or_reweighting_is_infonce(form, t):
    z0, z1 = pair()
    assert_close_with_grads(MACLLoss(t, alpha=0.0, reweight=False, form=form),
                            InfoNCELoss(t, form=form), z0, z1)


def test_macl_non_adaptive_equals_alpha_zero():
    z0, z1 = pair()
    assert_close_with_grads(MACLLoss(0.1, alpha=0.7, adaptive=False),
                            MACLLoss(0.1, alpha=0.0), z0, z1)


def test_cross_view_matches_plain_cross_entropy():
    z0, z1 = pair()
    assert_close_with_grads(InfoNCELoss(0.1, form="cross_view"),
                            lambda a, b: _manual_infonce(a, b, 0.1), z0, z1)


def test_dcl_drops_the_positive_from_the_denominator():
    z0, z1 = pair()
    a, b = torch.nn.functional.normalize(z0, dim=1), torch.nn.functional.normalize(z1, dim=1)
    logits = a @ b.T / 0.2
    eye = torch.eye(len(a), dtype=torch.bool)
    expected = (torch.logsumexp(logits.masked_fill(eye, float("-inf")), 1) - logits.diagonal()).mean()
    torch.testing.assert_close(DCLLoss(0.2, form="cross_view")(z0, z1), expected)


def test_queue_form_is_moco():
    z0, z1 = pair()
    queue = torch.randn(40, z0.shape[1])
    a, b = torch.nn.functional.normalize(z0, dim=1), torch.nn.functional.normalize(z1, dim=1)
    qn = torch.nn.functional.normalize(queue, dim=1)
    logits = torch.cat([(a * b).sum(1, keepdim=True), a @ qn.T], 1) / 0.2
    expected = torch.nn.functional.cross_entropy(logits, torch.zeros(len(a), dtype=torch.long))
    torch.testing.assert_close(InfoNCELoss(0.2, form="queue")(z0, z1, queue), expected)


@pytest.mark.parametrize("mode", ["ascl", "ahcl", "hard"])
def test_ascl_with_zero_neighbours_is_infonce(mode):
    z0, z1 = pair()
    queue = torch.randn(32, z0.shape[1])
    assert_close_with_grads(lambda a, b: ASCLLoss(0.1, num_neighbors=0, mode=mode)(a, b, queue),
                            lambda a, b: InfoNCELoss(0.1, form="queue")(a, b, queue), z0, z1)
    assert_close_with_grads(ASCLLoss(0.1, num_neighbors=0, mode=mode, form="cross_view"),
                            InfoNCELoss(0.1, form="cross_view"), z0, z1)


def test_ascl_byol_with_zero_neighbours_is_byol():
    p, t = pair()
    expected = (2 - 2 * torch.nn.functional.cosine_similarity(p, t.detach())).mean()
    torch.testing.assert_close(ASCLBYOLLoss(num_neighbors=0)(p, t), expected)


@pytest.mark.parametrize("form", FORMS)
def test_amcl_one_head_constant_temperature_is_its_fixed_form(form):
    z0, z1 = pair()
    fixed = ConstantTemperature(0.2)
    assert_close_with_grads(
        AMCLLoss(fixed, beta=0.0, negative_term="softmax", objective="infonce", form=form),
        InfoNCELoss(0.2, form=form), z0, z1)
    assert_close_with_grads(
        AMCLLoss(fixed, beta=0.0, negative_term="softmax", objective="nt_xent", form=form),
        DCLLoss(0.2, form=form), z0, z1)


def test_amcl_top1_is_the_hardest_negative():
    z0, z1 = pair()
    loss = AMCLLoss(ConstantTemperature(0.5), beta=0.0, negative_term="topk", kappa=1,
                    form="cross_view")(z0, z1)
    a, b = torch.nn.functional.normalize(z0, dim=1), torch.nn.functional.normalize(z1, dim=1)
    sim = a @ b.T
    hardest = sim.masked_fill(torch.eye(len(a), dtype=torch.bool), -2).max(1).values
    torch.testing.assert_close(loss, ((-sim.diagonal() + hardest) / 0.5).mean())


def test_amcl_heads_sum():
    z0, z1 = pair()
    fn = AMCLLoss(ConstantTemperature(0.2), beta=0.0, negative_term="softmax", objective="infonce")
    two = fn(torch.stack([z0, z1]), torch.stack([z1, z0]))
    torch.testing.assert_close(two, fn(z0, z1) + fn(z1, z0))


def test_dual_temperature_with_equal_temperatures_is_infonce():
    z0, z1 = pair()
    assert_close_with_grads(DualTemperatureLoss(0.3, temperature_beta=0.3), InfoNCELoss(0.3), z0, z1)


@pytest.mark.parametrize("make", [
    lambda: InfoNCELoss(0.1), lambda: DCLLoss(0.1), lambda: MACLLoss(0.1, 0.5, 0.0),
    lambda: MACLLoss(0.05, 2.0, 0.8, reweight=False, form="cross_view_symmetric"),
    lambda: InfoNCELoss(0.1, form="cross_view_symmetric"),
])
def test_symmetric_forms_are_swap_invariant(make):
    z0, z1 = pair()
    fn = make()
    torch.testing.assert_close(fn(z0, z1), fn(z1, z0))


def test_nt_xent_is_the_mean_of_both_directions_with_same_view_negatives():
    z0, z1 = pair()
    a, b = torch.nn.functional.normalize(z0, dim=1), torch.nn.functional.normalize(z1, dim=1)
    out = torch.cat([a, b])
    logits = out @ out.T / 0.1
    logits.fill_diagonal_(float("-inf"))
    n = len(a)
    target = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
    expected = torch.nn.functional.cross_entropy(logits, target)
    torch.testing.assert_close(InfoNCELoss(0.1)(z0, z1), expected)
