"""Method-specific behaviour: MACL's temperature and weights, ASCL's labels, AMCL's temperatures."""

from __future__ import annotations

import math

import pytest
import torch

from adaptcl.plugins import (
    AMCLLoss,
    ASCLLoss,
    InfoNCELoss,
    MACLLoss,
    MultiHeadProjection,
    PairTemperature,
    macl_temperature,
    omega,
    soft_labels,
)

from ._helpers import pair

# --- MACL -------------------------------------------------------------------------------

@pytest.mark.parametrize("a", [-1.0, 0.0, 0.3, 0.8, 1.0])
def test_macl_linear_and_exp_temperatures(a):
    align = torch.tensor(a)
    lin = macl_temperature(align, 0.1, 0.5, 0.2, min_temperature=1e-6)
    assert lin.item() == pytest.approx(0.1 * (1 + 0.5 * (a - 0.2)))
    exp = macl_temperature(align, 0.1, 2.0, temperature_form="exp")
    assert exp.item() == pytest.approx(0.1 * 2.0 ** a)
    assert 0.05 - 1e-6 <= exp.item() <= 0.2 + 1e-6  # tau0 / alpha .. tau0 * alpha


def test_macl_temperature_floor_for_the_simcse_setting():
    # alpha = 2, A0 = 0.8: 1 + 2 (A - 0.8) <= 0 once A <= 0.3; the floor keeps tau positive.
    tau = macl_temperature(torch.tensor(0.1), 0.05, 2.0, 0.8)
    assert tau.item() == pytest.approx(0.005)
    fn = MACLLoss(0.05, 2.0, 0.8, reweight=False, form="cross_view", min_temperature=0.01)
    z0, z1 = pair()
    fn(z0, z1)  # random pairs: A ~ 0
    assert fn.last_stats["temperature"].item() == pytest.approx(0.01)


def test_macl_temperature_follows_alignment_and_is_logged():
    fn = MACLLoss(0.1, 0.5, 0.0)
    z0, _ = pair()
    fn(z0, z0 + 0.01 * torch.randn_like(z0))
    aligned = fn.last_stats["temperature"].item()
    fn(z0, torch.randn_like(z0))
    random = fn.last_stats["temperature"].item()
    assert aligned == pytest.approx(0.15, abs=1e-3)  # A ~ 1
    assert random < aligned
    for key in ("loss", "plain_loss", "alignment", "temperature", "mean_w", "positive_probability"):
        assert key in fn.last_stats and fn.last_stats[key].requires_grad is False


def test_macl_reweighted_value_is_v_times_infonce():
    z0, z1 = pair(dtype=torch.float64)
    fn = MACLLoss(0.2, 0.0, reweight=True, form="cross_view")
    a = torch.nn.functional.normalize(z0, dim=1)
    b = torch.nn.functional.normalize(z1, dim=1)
    logits = a @ b.T / 0.2
    p = torch.softmax(logits, 1).diagonal()
    expected = (-torch.log(p) / (1 - p)).mean()
    torch.testing.assert_close(fn(z0, z1), expected)
    torch.testing.assert_close(fn.last_stats["plain_loss"], (-torch.log(p)).mean())
    torch.testing.assert_close(fn.last_stats["mean_w"], (1 - p).mean())


def test_macl_w_prime_variant():
    z0, z1 = pair(dtype=torch.float64)
    fn = MACLLoss(0.2, 0.0, weight_form="w_prime", form="cross_view")
    a = torch.nn.functional.normalize(z0, dim=1)
    b = torch.nn.functional.normalize(z1, dim=1)
    p = torch.softmax(a @ b.T / 0.2, 1).diagonal()
    w_prime = 2 - (a * b).sum(1)
    torch.testing.assert_close(fn(z0, z1), (-torch.log(p) * w_prime / (1 - p)).mean())


def test_macl_reweighting_restores_gradient_for_easy_positives():
    """The gradient-reduction dilemma (Sec. 5): easy pairs get tiny InfoNCE gradients; MACL's
    V = 1/W rescales each anchor's gradient to the W = 1 magnitude."""
    z = torch.randn(16, 32)
    z0 = z.clone().requires_grad_()
    z1 = (z + 0.05 * torch.randn_like(z))
    g_info = torch.autograd.grad(InfoNCELoss(0.1)(z0, z1), z0)[0].norm()
    g_macl = torch.autograd.grad(MACLLoss(0.1, 0.0, reweight=True)(z0, z1), z0)[0].norm()
    assert g_macl > 10 * g_info


# --- ASCL -------------------------------------------------------------------------------

def test_ascl_soft_labels_by_hand():
    # one anchor, three negatives; d = cos(positive key, negatives)
    d = torch.tensor([[0.9, 0.1, -0.5]])
    valid = torch.ones_like(d, dtype=torch.bool)
    q = torch.softmax(d / 0.5, 1)
    c = 1 - (-(q * q.log()).sum()) / math.log(3)
    y_pos, y_neg, conf = soft_labels(d, valid, mode="ascl", num_neighbors=2, sharpen_temperature=0.5)
    raw = torch.minimum(torch.ones(3), c * 2 * q[0])
    torch.testing.assert_close(conf, c.reshape(1))
    torch.testing.assert_close(y_neg[0], raw / (1 + raw.sum()))
    torch.testing.assert_close(y_pos, (1 / (1 + raw.sum())).reshape(1))

    _, hard, _ = soft_labels(d, valid, mode="hard", num_neighbors=1, sharpen_temperature=0.5)
    torch.testing.assert_close(hard[0], torch.tensor([0.5, 0.0, 0.0]))
    _, ahcl, _ = soft_labels(d, valid, mode="ahcl", num_neighbors=1, sharpen_temperature=0.5)
    torch.testing.assert_close(ahcl[0], torch.tensor([c / (1 + c), 0.0, 0.0]))


def test_ascl_labels_ignore_masked_columns_and_sum_to_one():
    d = torch.rand(5, 6)
    valid = torch.rand(5, 6) > 0.3
    valid[:, 0] = True
    valid[:, 1] = True
    y_pos, y_neg, conf = soft_labels(d, valid, num_neighbors=1, sharpen_temperature=0.05)
    assert (y_neg[~valid] == 0).all()
    torch.testing.assert_close(y_pos + y_neg.sum(1), torch.ones(5))
    assert ((conf >= 0) & (conf <= 1)).all()
    assert (y_neg <= y_pos[:, None] + 1e-7).all()  # no neighbour above the sample's own view


def test_ascl_label_path_is_detached_and_logged():
    q, k = pair()
    queue = torch.randn(20, q.shape[1], requires_grad=True)
    fn = ASCLLoss(0.1, 0.05, num_neighbors=1)
    loss = fn(q, k, queue)
    (gq,) = torch.autograd.grad(loss, q, retain_graph=True)
    assert torch.isfinite(gq).all()
    assert 0 <= fn.last_stats["confidence"].item() <= 1


# --- AMCL -------------------------------------------------------------------------------

def test_pair_temperature_bounds_and_shapes():
    net = PairTemperature(8, eta=1e-5, iota=2.0)
    with torch.no_grad():
        net.phi.weight.mul_(100)  # push the dot products to saturation
    tau = net(torch.randn(5, 8), torch.randn(7, 8))
    assert tau.shape == (5, 7)
    assert (tau >= 1e-5).all() and (tau <= 2.0 + 1e-5 + 1e-6).all()
    assert net.pairwise(torch.randn(5, 8), torch.randn(5, 8)).shape == (5,)


def test_omega_minimum_is_two_over_d():
    taus = torch.linspace(0.01, 1.0, 10_000)
    best = taus[omega(taus, 64).argmin()]
    assert best.item() == pytest.approx(2 / 64, rel=1e-2)


def test_amcl_trains_its_temperature_network():
    torch.manual_seed(0)
    net = PairTemperature(16)
    heads = MultiHeadProjection(8, 32, 16, num_heads=3)
    fn = AMCLLoss(net, beta=1e-2, negative_term="topk", kappa=4)
    x = torch.randn(12, 8)
    z0, z1 = heads(x), heads(x + 0.1 * torch.randn_like(x))
    assert z0.shape == (3, 12, 16)
    loss = fn(z0, z1)
    loss.backward()
    assert net.phi.weight.grad is not None and net.phi.weight.grad.abs().sum() > 0
    assert all(h[0].weight.grad is not None for h in heads.heads)
    stats = fn.last_stats
    assert 1e-5 < stats["temperature"].item() < 2.0
