"""Parity with the installed peers on random inputs: same value, same gradient."""

from __future__ import annotations

import pytest
import torch

from adaptcl.plugins import DCLLoss, InfoNCELoss, MACLLoss

from ._helpers import assert_close_with_grads, grads, pair

lightly_loss = pytest.importorskip("lightly.loss")


@pytest.mark.parametrize("t", [0.1, 0.5])
@pytest.mark.parametrize("n,d", [(2, 4), (16, 32), (33, 7)])
def test_nt_xent_matches_lightly(t, n, d):
    z0, z1 = pair(n, d, seed=n)
    assert_close_with_grads(lightly_loss.NTXentLoss(t), InfoNCELoss(t), z0, z1)
    assert_close_with_grads(lightly_loss.NTXentLoss(t),
                            MACLLoss(t, alpha=0.0, reweight=False), z0, z1)


def test_nt_xent_with_memory_bank_matches_lightly():
    """Lightly's memory-bank mode is MoCo's: anchors z0, positive z1, the bank as negatives."""
    torch.manual_seed(0)
    dim, bank = 8, 24
    theirs = lightly_loss.NTXentLoss(0.2, memory_bank_size=(bank, dim))
    for step in range(4):  # the bank fills up over steps; compare on every one
        z0, z1 = pair(6, dim, seed=step)
        negatives = theirs.memory_bank.bank.detach().clone()  # [K, D], state before this update
        expected = theirs(z0, z1)
        ours = InfoNCELoss(0.2, form="queue")(z0, z1, negatives)
        torch.testing.assert_close(ours, expected)
        g_theirs = grads(lightly_loss.NTXentLoss(0.2)(z0, z1), z0)  # sanity: a different loss
        g_ours = grads(InfoNCELoss(0.2, form="queue")(z0, z1, negatives), z0)
        g_ref = torch.autograd.grad(expected, z0, retain_graph=False)
        torch.testing.assert_close(g_ours, g_ref)
        assert not torch.allclose(g_theirs[0], g_ours[0])


@pytest.mark.parametrize("t", [0.1, 0.5])
def test_dcl_matches_lightly(t):
    z0, z1 = pair(16, 32)
    assert_close_with_grads(lightly_loss.DCLLoss(t), DCLLoss(t), z0, z1)


@pytest.mark.parametrize("alpha,a0", [(0.5, 0.0), (1.0, 0.2), (0.0, 0.0)])
def test_macl_matches_lightly_where_lightly_is_finite(alpha, a0):
    z0, z1 = pair(16, 32)
    # Lightly adds eps=1e-8 inside 1/(1 - P + eps); on random inputs P is far from 1 and the
    # difference is ~1e-8 relative.
    assert_close_with_grads(lightly_loss.MACLLoss(0.1, alpha, a0),
                            MACLLoss(0.1, alpha, a0), z0, z1, rtol=1e-5, atol=1e-6)


def test_macl_is_exact_where_lightly_loses_the_reweighting():
    """Opposite unit vectors at tau0 0.05: 1 - P_pos ~ 1e-12 rounds P to 1 in float32.

    The exact Algorithm 1 value (float64) is V * (-log P) ~ 1. Lightly's 1/(1 - P + eps) caps V
    at 1e8 and returns ~1e-4 (the reweighting silently vanishes); ours matches float64.
    """
    e = torch.zeros(2, 4)
    e[0, 0], e[1, 0] = 1.0, -1.0
    z0, z1 = e.clone().requires_grad_(), e.clone().requires_grad_()

    def algorithm_1(a, b, t0=0.05, alpha=0.5, a0=0.0):  # the paper's pseudocode, in float64
        a, b = torch.nn.functional.normalize(a.double(), dim=1), torch.nn.functional.normalize(b.double(), dim=1)
        out = torch.cat([a, b])
        sim = out @ out.T
        n = len(a)
        pos = torch.cat([sim.diagonal(n), sim.diagonal(-n)])[:, None]
        mask = torch.ones_like(sim, dtype=torch.bool)
        mask.fill_diagonal_(False)
        mask[torch.arange(2 * n), torch.cat([torch.arange(n, 2 * n), torch.arange(n)])] = False
        neg = sim[mask].view(2 * n, -1)
        t = t0 * (1 + alpha * (pos.mean() - a0))
        p = torch.softmax(torch.cat([pos, neg], 1) / t, 1)[:, 0]
        return (-(1 / (1 - p)).detach() * torch.log(p)).mean()

    reference = algorithm_1(z0, z1)
    ours = MACLLoss(0.05, 0.5, 0.0)(z0, z1)
    theirs = lightly_loss.MACLLoss(0.05, 0.5, 0.0)(z0, z1)
    assert 0.9 < reference.item() < 1.1
    torch.testing.assert_close(ours.double(), reference, rtol=1e-4, atol=1e-6)
    assert theirs.item() < 0.01  # what the eps version returns instead
    assert all(torch.isfinite(g).all() for g in grads(ours, z0, z1))


def test_cross_view_matches_sentence_transformers_mnrl():
    st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    mnrl = st_losses.MultipleNegativesRankingLoss(model=None, scale=20.0)
    anchors, positives = pair(10, 24)
    hard = torch.randn(10, 24, requires_grad=True)

    def theirs(a, p, h):
        return mnrl.compute_loss_from_embeddings([a, p, h], labels=None)

    def ours(a, p, h):
        return InfoNCELoss(1 / 20.0, form="cross_view")(a, p, negatives=h)

    assert_close_with_grads(theirs, ours, anchors, positives, hard)
