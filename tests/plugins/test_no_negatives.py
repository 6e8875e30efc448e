"""Anchors with nothing to contrast against: a batch of one pair, an empty queue.

The peers return exactly 0 with a zero gradient for a batch of one pair (Lightly's
``NTXentLoss`` and ``MACLLoss``, sentence-transformers' ``MultipleNegativesRankingLoss``), so a
``SentenceTransformerTrainer`` epoch whose last batch holds one pair goes through. Every loss
here does the same, materialised and tiled, instead of raising.
"""

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
    FlatNCELoss,
    InfoNCELoss,
    MACLLoss,
    NCELoss,
    PairTemperature,
    TripletLoss,
)

from ._helpers import grads, pair

IN_BATCH_FORMS = ("nt_xent", "cross_view", "cross_view_symmetric")

# Every loss whose value without negatives is 0: nothing to contrast, P_pos = 1.
ZERO_LOSSES = {
    "infonce": lambda form, tile: InfoNCELoss(0.1, form=form, tile_size=tile),
    "dcl": lambda form, tile: DCLLoss(0.1, form=form, tile_size=tile),
    "flatnce": lambda form, tile: FlatNCELoss(0.1, form=form, tile_size=tile),
    "dual": lambda form, tile: DualTemperatureLoss(0.1, 1.0, form=form, tile_size=tile),
    "macl": lambda form, tile: MACLLoss(0.1, 0.5, form=form, tile_size=tile),
    "macl_wprime": lambda form, tile: MACLLoss(0.1, 0.5, weight_form="w_prime", form=form,
                                               tile_size=tile),
    "amcl_topk": lambda form, tile: AMCLLoss(PairTemperature(8), negative_term="topk", form=form,
                                                 tile_size=tile),
    "amcl_softmax_infonce": lambda form, tile: AMCLLoss(
        PairTemperature(8), negative_term="softmax", objective="infonce", form=form,
        tile_size=tile),
    "amcl_constant": lambda form, tile: AMCLLoss(ConstantTemperature(0.1), form=form,
                                                 tile_size=tile),
    "triplet": lambda form, tile: TripletLoss(form=form, tile_size=tile),
    "nce": lambda form, tile: NCELoss(form=form, tile_size=tile),
}


@pytest.mark.parametrize("tile", [None, 1])
@pytest.mark.parametrize("form", IN_BATCH_FORMS)
@pytest.mark.parametrize("name", list(ZERO_LOSSES))
def test_single_pair_batch_gives_zero_loss_and_zero_gradient(name, form, tile, device):
    z0, z1 = (t.detach().to(device).requires_grad_() for t in pair(1, 8))
    loss_fn = ZERO_LOSSES[name](form, tile).to(device)
    loss = loss_fn(z0, z1)
    assert loss.item() == 0.0
    for g in grads(loss, z0, z1):
        assert torch.equal(g, torch.zeros_like(g))
    assert all(torch.isfinite(v).all() for v in loss_fn.last_stats.values()), loss_fn.last_stats


@pytest.mark.parametrize("tile", [None, 1])
def test_ascl_in_batch_single_pair_gives_zero(tile):
    z0, z1 = pair(1, 8)
    loss = ASCLLoss(num_neighbors=1, form="cross_view", tile_size=tile)(z0, z1)
    assert loss.item() == 0.0
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads(loss, z0, z1))


@pytest.mark.parametrize("make", [
    lambda: InfoNCELoss(0.2, form="queue"),
    lambda: MACLLoss(0.2, 0.5, form="queue"),
    lambda: ASCLLoss(num_neighbors=1, form="queue"),
    lambda: AMCLLoss(PairTemperature(8), form="queue"),
], ids=["infonce", "macl", "ascl", "amcl"])
def test_empty_queue_gives_zero_loss(make):
    z0, z1 = pair(4, 8)
    loss = make()(z0, z1, negatives=torch.empty(0, 8))
    assert loss.item() == 0.0
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads(loss, z0, z1))


def test_macl_single_pair_weight_stays_finite():
    """V = 1 / W with W = 1 - P_pos = 0: the loss never evaluates it (no 0 * inf)."""
    loss_fn = MACLLoss(0.05, 0.5)
    loss = loss_fn(*pair(1, 8))
    assert loss.item() == 0.0
    assert loss_fn.last_stats["mean_w"].item() == 0.0
    assert loss_fn.last_stats["positive_probability"].item() == 1.0


def test_single_pair_batch_gives_zero_loss_like_lightly():
    lightly_loss = pytest.importorskip("lightly.loss")
    for theirs, ours in [(lightly_loss.NTXentLoss(0.5), InfoNCELoss(0.5)),
                         (lightly_loss.MACLLoss(0.1, 0.5, 0.0), MACLLoss(0.1, 0.5, 0.0))]:
        z0, z1 = pair(1, 8)
        expected, got = theirs(z0, z1), ours(z0, z1)
        assert got.item() == expected.item() == 0.0
        for g_theirs, g_ours in zip(grads(expected, z0, z1), grads(got, z0, z1), strict=True):
            torch.testing.assert_close(g_ours, g_theirs)


@pytest.mark.slow  # importing sentence-transformers takes ~6 s in a fresh process
def test_single_pair_batch_gives_zero_loss_like_multiple_negatives_ranking_loss():
    st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    mnrl = st_losses.MultipleNegativesRankingLoss(model=None, scale=20.0)
    for symmetric in (False, True):
        a, p = pair(1, 8)
        expected = mnrl.compute_loss_from_embeddings([a, p], labels=None)
        form = "cross_view_symmetric" if symmetric else "cross_view"
        got = InfoNCELoss(1 / 20.0, form=form)(a, p)
        assert got.item() == expected.item() == 0.0
        assert all(torch.equal(g, torch.zeros_like(g)) for g in grads(got, a, p))


def test_dcl_single_pair_is_zero_where_lightly_gives_minus_inf():
    """Lightly's DCLLoss returns -inf (log of an empty sum); ours documents 0."""
    lightly_loss = pytest.importorskip("lightly.loss")
    z0, z1 = pair(1, 8)
    assert lightly_loss.DCLLoss(0.1)(z0, z1).item() == float("-inf")
    assert DCLLoss(0.1)(z0, z1).item() == 0.0


def test_single_pair_margin_loss_keeps_its_positive_term():
    from adaptcl.plugins import MarginContrastiveLoss

    z0, z1 = pair(1, 8)
    cos = torch.nn.functional.cosine_similarity(z0, z1).squeeze()
    loss = MarginContrastiveLoss(margin=1.0)(z0, z1)
    torch.testing.assert_close(loss, 0.5 * (2 - 2 * cos))


def test_single_sample_byol_regresses_onto_its_own_target():
    p, t = pair(1, 8)
    cos = torch.nn.functional.cosine_similarity(p, t).squeeze()
    torch.testing.assert_close(ASCLBYOLLoss(num_neighbors=1)(p, t), 2 - 2 * cos)


def test_extra_negatives_still_count_for_a_single_pair():
    z0, z1 = pair(1, 8)
    negatives = torch.randn(3, 8)
    loss = InfoNCELoss(form="cross_view")(z0, z1, negatives=negatives)
    assert loss.item() > 0.0
