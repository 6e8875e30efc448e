"""The hardness term (sentence-transformers 6.2 ``MultipleNegativesRankingLoss(hardness_mode,
hardness_strength)``; Lan et al. 2025, Eq. 5) against its formula written out here in float64:
``cos / tau + alpha * sg(cos)`` on the negatives each mode selects, in sentence-transformers'
column layout (positives, then the hard-negative columns, each owned by one anchor). Off is
the same bits as without it; tiled == materialised; with labels a same-class candidate is not
penalised; ASCL with zero neighbours keeps reducing to InfoNCE with the term on."""

from __future__ import annotations

import math

import pytest
import torch

from adaptcl.plugins import ASCLLoss, DySTreSSLoss, InfoNCELoss, MACLLoss
from adaptcl.plugins import functional as F

from ._helpers import pair

pytestmark = pytest.mark.usefixtures("one_thread")

D64 = torch.float64
MODES = ["in_batch_negatives", "hard_negatives", "all_negatives"]


def _columns(n=5, d=4, hard=2, seed=0):
    """``(anchors, positives, hard negatives [hard * n], their owners)``: the negatives are
    sentence-transformers' extra columns, block ``k`` row ``i`` being anchor ``i``'s."""
    g = torch.Generator().manual_seed(seed)
    q, p = (torch.randn(n, d, generator=g, dtype=D64, requires_grad=True) for _ in range(2))
    neg = torch.randn(hard * n, d, generator=g, dtype=D64, requires_grad=True)
    owners = torch.arange(n).repeat(hard)
    return q, p, neg, owners


def _reference(q, p, neg, mode, strength, scale, labels=None):
    """The formula: logits = cos * scale + strength * sg(cos) on the selected negatives."""
    n = q.shape[0]
    docs = torch.cat([p, neg])
    cos = torch.nn.functional.normalize(q, dim=1) @ torch.nn.functional.normalize(docs, dim=1).T
    column = torch.arange(docs.shape[0])
    own = (column[None, :] % n) == torch.arange(n)[:, None]
    positive = own & (column[None, :] < n)
    selected = {"in_batch_negatives": ~own, "hard_negatives": own & (column[None, :] >= n),
                "all_negatives": ~positive}[mode]
    if labels is not None:  # a same-class candidate is a positive: never penalised
        doc_labels = torch.cat([labels, torch.full((neg.shape[0],), -1)])
        selected = selected & (labels[:, None] != doc_labels[None, :])
    logits = cos * scale + strength * cos.detach() * selected
    if labels is None:
        return (torch.logsumexp(logits, dim=1) - logits[positive]).mean()
    doc_labels = torch.cat([labels, torch.full((neg.shape[0],), -1)])
    targets = (labels[:, None] == doc_labels[None, :]).to(D64)
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    return (-(log_prob * targets).sum(1) / targets.sum(1)).mean()


def _both(ours, ref, inputs):
    la, lb = ours(*inputs), ref(*inputs)
    torch.testing.assert_close(la, lb, rtol=1e-12, atol=1e-12)
    for ga, gb in zip(torch.autograd.grad(la, inputs), torch.autograd.grad(lb, inputs), strict=True):
        torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("tile", [None, 1, 4])
@pytest.mark.parametrize("mode", MODES)
def test_each_mode_equals_the_formula(mode, tile):
    q, p, neg, owners = _columns()
    ours = InfoNCELoss(0.05, form="cross_view", hardness_mode=mode, hardness_strength=3.0,
                       tile_size=tile)
    _both(lambda a, b, c: ours(a, b, c, negative_owners=owners),
          lambda a, b, c: _reference(a, b, c, mode, 3.0, 20.0), (q, p, neg))


@pytest.mark.parametrize("mode", MODES)
def test_without_owners_no_extra_negative_is_an_anchors_own(mode):
    """A queue (no owners): in-batch mode touches every negative, hard-negative mode none."""
    q, p, neg, _ = _columns(seed=1)
    ours = InfoNCELoss(0.1, form="cross_view", hardness_mode=mode, hardness_strength=2.0)
    nobody = torch.full((neg.shape[0],), -1)
    torch.testing.assert_close(ours(q, p, neg), ours(q, p, neg, negative_owners=nobody))
    expected = InfoNCELoss(0.1, form="cross_view", hardness_mode="all_negatives",
                           hardness_strength=2.0)(q, p, neg)
    if mode == "hard_negatives":
        expected = InfoNCELoss(0.1, form="cross_view")(q, p, neg)
    torch.testing.assert_close(ours(q, p, neg), expected, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("tile", [None, 3])
def test_same_class_candidates_are_not_penalised(tile):
    q, p, neg, owners = _columns(n=6, seed=2)
    labels = torch.tensor([0, 1, 0, 2, 1, 0])
    ours = InfoNCELoss(0.1, form="cross_view", hardness_mode="all_negatives",
                       hardness_strength=4.0, tile_size=tile)
    _both(lambda a, b, c: ours(a, b, c, labels=labels),
          lambda a, b, c: _reference(a, b, c, "all_negatives", 4.0, 10.0, labels=labels),
          (q, p, neg))


@pytest.mark.parametrize("make", [
    lambda **k: InfoNCELoss(0.1, **k), lambda **k: MACLLoss(0.1, 0.5, **k),
    lambda **k: DySTreSSLoss(0.1, 0.2, **k), lambda **k: ASCLLoss(0.1, 0.05, 2, **k),
], ids=["infonce", "macl", "dystress", "ascl"])
@pytest.mark.parametrize("off", [{"hardness_mode": "all_negatives", "hardness_strength": 0.0},
                                 {"hardness_mode": None, "hardness_strength": 5.0}],
                         ids=["strength0", "no-mode"])
def test_off_is_the_same_bits_as_without_it(make, off):
    z0, z1 = pair(7, 6, seed=3)
    queue = torch.randn(5, 6, generator=torch.Generator().manual_seed(3), requires_grad=True)
    for tile in (None, 3):
        plain, with_off = make(tile_size=tile), make(tile_size=tile, **off)
        a, b = plain(z0, z1, queue), with_off(z0, z1, queue)
        assert torch.equal(a, b)
        for ga, gb in zip(torch.autograd.grad(a, (z0, z1, queue)),
                          torch.autograd.grad(b, (z0, z1, queue)), strict=True):
            assert torch.equal(ga, gb)


@pytest.mark.parametrize("form", ["nt_xent", "cross_view_symmetric"])
def test_in_batch_mode_in_the_symmetric_forms(form):
    """Both views as anchors: every candidate but the positive (and the anchor) is another
    pair's, so in-batch and all-negatives agree and equal the formula."""
    z0, z1 = pair(5, 4, seed=4, dtype=D64)

    def ref(a, b):
        a0, a1 = torch.nn.functional.normalize(a, dim=1), torch.nn.functional.normalize(b, dim=1)
        if form == "nt_xent":
            feats = torch.cat([a0, a1])
            cos = feats @ feats.T
            positive = torch.cat([torch.arange(5, 10), torch.arange(5)])
            logits = (cos / 0.2 + 1.5 * cos.detach()).fill_diagonal_(-math.inf)
            rows = torch.arange(10)
            logits[rows, positive] = cos[rows, positive] / 0.2
            return (torch.logsumexp(logits, 1) - logits[rows, positive]).mean()
        total = 0
        for x, y in ((a0, a1), (a1, a0)):
            cos = x @ y.T
            logits = cos / 0.2 + 1.5 * cos.detach() * (1 - torch.eye(5, dtype=D64))
            total = total + (torch.logsumexp(logits, 1) - logits.diagonal()).mean()
        return total / 2

    for mode in ("in_batch_negatives", "all_negatives"):
        ours = InfoNCELoss(0.2, form=form, hardness_mode=mode, hardness_strength=1.5)
        _both(ours, ref, (z0, z1))


@pytest.mark.parametrize("mode", ["ascl", "ahcl", "hard"])
@pytest.mark.parametrize("tile", [1, 3])
def test_ascl_with_the_term_tiled_equals_materialised(mode, tile):
    z0, z1 = pair(6, 5, seed=5)
    queue = torch.randn(7, 5, generator=torch.Generator().manual_seed(5), requires_grad=True)

    def run(tile_size):
        fn = ASCLLoss(0.1, 0.05, 2, mode, hardness_mode="in_batch_negatives",
                      hardness_strength=2.0, tile_size=tile_size)
        loss = fn(z0, z1, queue)
        return loss, torch.autograd.grad(loss, (z0, z1, queue))

    (la, ga), (lb, gb) = run(None), run(tile)
    torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-6)
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_ascl_without_neighbours_is_infonce_with_the_term():
    z0, z1 = pair(6, 5, seed=6, dtype=D64)
    queue = torch.randn(7, 5, generator=torch.Generator().manual_seed(6), dtype=D64,
                        requires_grad=True)
    kwargs = {"hardness_mode": "all_negatives", "hardness_strength": 2.5}
    _both(ASCLLoss(0.1, 0.05, 0, **kwargs), InfoNCELoss(0.1, form="queue", **kwargs),
          (z0, z1, queue))


def test_the_term_is_divided_by_no_temperature():
    """The same term at two temperatures: the logits differ by cos / tau only (the term is
    ``alpha * cos``, not ``alpha * cos / tau``)."""
    q, p, neg, owners = _columns(seed=7)
    for tau in (0.05, 0.5):
        ours = InfoNCELoss(tau, form="cross_view", hardness_mode="in_batch_negatives",
                           hardness_strength=9.0)
        torch.testing.assert_close(ours(q, p, neg, negative_owners=owners),
                                   _reference(q, p, neg, "in_batch_negatives", 9.0, 1 / tau))


def test_functional_forms_take_the_term():
    q, p, neg, owners = _columns(seed=8)
    kw = {"hardness_mode": "hard_negatives", "hardness_strength": 5.0, "negative_owners": owners,
          "form": "cross_view", "negatives": neg}
    torch.testing.assert_close(F.info_nce(q, p, 0.05, **kw),
                               _reference(q, p, neg, "hard_negatives", 5.0, 20.0))
    ref = InfoNCELoss(0.05, form="cross_view", hardness_mode="hard_negatives",
                      hardness_strength=5.0, positive_in_denominator=False)
    torch.testing.assert_close(F.dcl(q, p, 0.05, **kw), ref(q, p, neg, negative_owners=owners))
    for fn, extra in ((F.macl, {"alpha": 0.0, "reweight": False}), (F.dystress, {})):
        assert torch.isfinite(fn(q, p, **kw, **extra))
    assert torch.isfinite(F.ascl(q, p, **kw))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"hardness_mode": "negatives"}, ValueError, "hardness_mode must be one of"),
    ({"hardness_strength": -1.0}, ValueError, "hardness_strength must be"),
    ({"hardness_strength": "9"}, TypeError, "hardness_strength must be a float"),
])
def test_bad_arguments_are_named(kwargs, error, match):
    for cls in (InfoNCELoss, MACLLoss, DySTreSSLoss, ASCLLoss):
        with pytest.raises(error, match=match):
            cls(**kwargs)


def test_negative_owners_are_checked():
    q, p, neg, owners = _columns()
    fn = InfoNCELoss(0.1, form="cross_view", hardness_mode="hard_negatives", hardness_strength=1.0)
    with pytest.raises(ValueError, match="negative_owners were given without negatives"):
        fn(q, p, negative_owners=owners)
    with pytest.raises(ValueError, match=r"negative_owners must have shape \[10\]"):
        fn(q, p, neg, negative_owners=owners[:4])
    with pytest.raises(TypeError, match="negative_owners must be an integer tensor"):
        fn(q, p, neg, negative_owners=owners.double())
