"""Multi-positive targets from labels (SupCon's L_out, Khosla et al. 2020, Eq. 2) against the
formula written out here in float64 over SupCon's multi-view batch: every same-class candidate
a positive with weight 1/|P(i)|, the designated positive one of them, the anchor itself neither
a positive nor in the denominator. With any temperature rule (InfoNCE, MACL's batch temperature,
DySTreSS's pair temperatures), tiled == materialised, gradchecks, exact reductions to InfoNCE,
the queue with labelled negatives, hostile labels and the errors."""

from __future__ import annotations

import math

import pytest
import torch

from adaptcl.plugins import (
    DCLLoss,
    DySTreSSLoss,
    FlatNCELoss,
    InfoNCELoss,
    MACLLoss,
    dystress_temperature,
    macl_temperature,
)
from adaptcl.plugins import functional as F

from ._helpers import pair

pytestmark = pytest.mark.usefixtures("one_thread")

D64 = torch.float64
LABELS = torch.tensor([0, 1, 0, 2, 1, 0, 3])  # classes of 3, 2, 1 and 1 pairs


def _unit(x):
    return x / x.norm(dim=1, keepdim=True)


def _l_out(logits, positive, allowed):
    """Eq. 2: -1/|P(i)| sum_{p in P(i)} log(exp(l_ip) / sum_{a in A(i)} exp(l_ia))."""
    log_prob = logits - torch.logsumexp(logits.masked_fill(~allowed, -math.inf), dim=1,
                                        keepdim=True)
    return -(log_prob * positive).sum(dim=1) / positive.sum(dim=1)


def _supcon_reference(z0, z1, labels, *, form="nt_xent", logits_of=lambda s: s / 0.1,
                      negatives=None, negative_labels=None):
    """L_out over SupCon's batch: ``"nt_xent"`` has both views as anchors and candidates (the
    anchor itself excluded), ``"cross_view"`` has z0 against z1 (and any extra negatives)."""
    a0, a1 = _unit(z0), _unit(z1)
    if form == "nt_xent":
        feats = torch.cat([a0, a1])
        y = torch.cat([labels, labels])
        logits = logits_of(feats @ feats.T)
        allowed = ~torch.eye(len(y), dtype=torch.bool)
        positive = (y[:, None] == y[None, :]) & allowed
        return _l_out(logits, positive, allowed).mean()
    keys, key_y = a1, labels
    if negatives is not None:
        keys = torch.cat([a1, _unit(negatives)])
        extra = (torch.full((len(negatives),), -1) if negative_labels is None
                 else negative_labels)
        key_y = torch.cat([labels, extra])
    logits = logits_of(a0 @ keys.T)
    allowed = torch.ones_like(logits, dtype=torch.bool)
    positive = labels[:, None] == key_y[None, :]
    return _l_out(logits, positive, allowed).mean()


def _both(ours, ref, inputs, tol=1e-12):
    la, lb = ours(*inputs), ref(*inputs)
    torch.testing.assert_close(la, lb, rtol=tol, atol=tol)
    for ga, gb in zip(torch.autograd.grad(la, inputs), torch.autograd.grad(lb, inputs), strict=True):
        torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("tile", [None, 1, 4])
@pytest.mark.parametrize("form", ["nt_xent", "cross_view"])
def test_infonce_with_labels_is_supcon_l_out(form, tile):
    z0, z1 = pair(7, 5, seed=1, dtype=D64)
    ours = InfoNCELoss(0.1, form=form, tile_size=tile)
    _both(lambda a, b: ours(a, b, labels=LABELS),
          lambda a, b: _supcon_reference(a, b, LABELS, form=form), (z0, z1))


@pytest.mark.parametrize("tile", [None, 3])
def test_macl_temperature_with_labels(tile):
    """MACL's alignment-adaptive temperature (detached) with SupCon's targets."""
    z0, z1 = pair(7, 5, seed=2, dtype=D64)
    ours = MACLLoss(0.05, 2.0, 0.8, reweight=False, form="cross_view", tile_size=tile)

    def ref(a, b):
        align = (_unit(a) * _unit(b)).sum(1).detach().mean()
        tau = max(0.05 * (1 + 2.0 * (float(align) - 0.8)), 0.005)
        return _supcon_reference(a, b, LABELS, form="cross_view", logits_of=lambda s: s / tau)

    _both(lambda a, b: ours(a, b, labels=LABELS), ref, (z0, z1))
    torch.testing.assert_close(ours.last_stats["temperature"],
                               macl_temperature(ours.last_stats["alignment"], 0.05, 2.0, 0.8))


@pytest.mark.parametrize("tile", [None, 2])
def test_dystress_pair_temperatures_with_labels(tile):
    z0, z1 = pair(7, 5, seed=3, dtype=D64)
    ours = DySTreSSLoss(0.1, 0.2, tile_size=tile)

    def logits_of(s):
        return s / dystress_temperature(s.detach(), 0.1, 0.2)

    _both(lambda a, b: ours(a, b, labels=LABELS),
          lambda a, b: _supcon_reference(a, b, LABELS, logits_of=logits_of), (z0, z1))


@pytest.mark.parametrize("tile", [None, 3])
def test_extra_negatives_have_no_class_unless_labelled(tile):
    z0, z1 = pair(7, 4, seed=4, dtype=D64)
    neg = torch.randn(5, 4, generator=torch.Generator().manual_seed(5), dtype=D64,
                      requires_grad=True)
    neg_labels = torch.tensor([0, -1, 3, 7, 0])
    ours = InfoNCELoss(0.1, form="cross_view", tile_size=tile)
    _both(lambda a, b, q: ours(a, b, q, labels=LABELS),
          lambda a, b, q: _supcon_reference(a, b, LABELS, form="cross_view", negatives=q),
          (z0, z1, neg))
    _both(lambda a, b, q: ours(a, b, q, labels=LABELS, negative_labels=neg_labels),
          lambda a, b, q: _supcon_reference(a, b, LABELS, form="cross_view", negatives=q,
                                            negative_labels=neg_labels), (z0, z1, neg))


def test_queue_form_with_labelled_queue():
    """MoCo with labels: the anchor's positive plus the queue entries of its class."""
    z0, z1 = pair(7, 4, seed=6, dtype=D64)
    queue = torch.randn(6, 4, generator=torch.Generator().manual_seed(7), dtype=D64,
                        requires_grad=True)
    queue_labels = torch.tensor([1, 0, -1, 2, 0, 5])

    def ref(a, b, q):
        a0, a1, k = _unit(a), _unit(b), _unit(q)
        logits = torch.cat([(a0 * a1).sum(1, keepdim=True), a0 @ k.T], dim=1) / 0.2
        positive = torch.cat([torch.ones(7, 1, dtype=torch.bool),
                              LABELS[:, None] == queue_labels[None, :]], dim=1)
        return _l_out(logits, positive, torch.ones_like(positive)).mean()

    for tile in (None, 4):
        ours = InfoNCELoss(0.2, form="queue", tile_size=tile)
        _both(lambda a, b, q, ours=ours: ours(a, b, q, labels=LABELS,
                                              negative_labels=queue_labels),
              ref, (z0, z1, queue))


@pytest.mark.parametrize("form", ["nt_xent", "cross_view", "cross_view_symmetric"])
def test_distinct_labels_are_infonce(form):
    """One positive per anchor (all labels different, e.g. pair indices as solo-learn's
    unsupervised ``indexes``): exactly InfoNCE, to float64 precision."""
    z0, z1 = pair(6, 5, seed=8, dtype=D64)
    ours = InfoNCELoss(0.1, form=form)
    _both(lambda a, b: ours(a, b, labels=torch.arange(6) * 3),
          lambda a, b: InfoNCELoss(0.1, form=form)(a, b), (z0, z1))


def test_one_positive_per_anchor_l_out_equals_solo_learns_l_in():
    """solo-learn's supervised SimCLR, -log(sum_P exp / sum_A exp) (L_in), agrees with L_out
    where every anchor has exactly one positive, and not where it has several."""
    z0, z1 = pair(6, 5, seed=9, dtype=D64)

    def l_in(labels):
        feats = _unit(torch.cat([z0, z1]))
        y = torch.cat([labels, labels])
        sim = torch.exp(feats @ feats.T / 0.1)
        pos_mask = (y[:, None] == y[None, :]).fill_diagonal_(False)
        neg_mask = y[:, None] != y[None, :]
        pos, neg = (sim * pos_mask).sum(1), (sim * neg_mask).sum(1)
        return -torch.log(pos / (pos + neg)).mean()

    unique, grouped = torch.arange(6), torch.tensor([0, 0, 1, 1, 1, 2])
    ours = InfoNCELoss(0.1)
    torch.testing.assert_close(ours(z0, z1, labels=unique), l_in(unique))
    assert not torch.allclose(ours(z0, z1, labels=grouped), l_in(grouped))


@pytest.mark.parametrize("name", ["infonce", "macl", "dystress"])
def test_gradcheck_with_labels(name):
    make = {"infonce": lambda t: InfoNCELoss(0.2, tile_size=t),
            "macl": lambda t: MACLLoss(0.2, 0.0, reweight=False, tile_size=t),
            "dystress": lambda t: DySTreSSLoss(0.1, 0.3, detach_temperature=False, tile_size=t)}
    labels = torch.tensor([0, 1, 0, 1, 2])
    z0, z1 = pair(5, 3, seed=10, dtype=D64)
    for tile in (None, 3):
        fn = make[name](tile)
        assert torch.autograd.gradcheck(lambda a, b, fn=fn: fn(a, b, labels=labels), (z0, z1),
                                         eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("tile", [None, 3])
def test_one_class_for_the_whole_batch(tile):
    """Every candidate a positive: L_out is the cross-entropy against the uniform target over
    all 2N - 1 candidates (>= log(2N - 1)), finite, with a finite gradient."""
    z0, z1 = pair(5, 4, seed=11, dtype=D64)
    same = torch.zeros(5, dtype=torch.long)
    ours = InfoNCELoss(0.1, tile_size=tile)
    _both(lambda a, b: ours(a, b, labels=same),
          lambda a, b: _supcon_reference(a, b, same), (z0, z1))
    assert ours(z0, z1, labels=same) >= math.log(9) - 1e-12


def test_a_single_pair_gives_zero_like_infonce():
    z0, z1 = pair(1, 4, seed=12)
    loss = InfoNCELoss(0.1, form="cross_view")(z0, z1, labels=torch.tensor([3]))
    loss.backward()
    assert loss == 0 and torch.equal(z0.grad, torch.zeros_like(z0))


def test_functional_forms_take_labels():
    z0, z1 = pair(7, 5, seed=13)
    for fn, module in ((F.info_nce, InfoNCELoss(0.1, reduction="none")),
                       (F.macl, MACLLoss(0.1, reweight=False, reduction="none")),
                       (F.dystress, DySTreSSLoss(reduction="none"))):
        kwargs = {"reweight": False} if fn is F.macl else {}
        torch.testing.assert_close(fn(z0, z1, labels=LABELS, reduction="none", **kwargs),
                                   module(z0, z1, labels=LABELS), rtol=0, atol=0)


def test_what_labels_do_not_combine_with():
    z0, z1 = pair(4, 3)
    labels = torch.tensor([0, 0, 1, 1])
    with pytest.raises(ValueError, match="reweight=False"):
        MACLLoss(0.1, 0.5)(z0, z1, labels=labels)  # MACL's V = 1/W assumes one positive
    with pytest.raises(ValueError, match="positive_in_denominator=True"):
        InfoNCELoss(0.1, positive_in_denominator=False)(z0, z1, labels=labels)
    with pytest.raises(ValueError, match="positive_in_denominator=True"):
        DySTreSSLoss(positive_in_denominator=False)(z0, z1, labels=labels)
    for cls in (DCLLoss, FlatNCELoss):
        with pytest.raises(TypeError, match=f"{cls.__name__} takes no labels"):
            cls(0.1)(z0, z1, labels=labels)


@pytest.mark.parametrize("bad, error, match", [
    (torch.tensor([0.0, 1.0, 0.0, 1.0]), TypeError, "labels must be an integer tensor"),
    (torch.tensor([True, False, True, False]), TypeError, "labels must be an integer tensor"),
    ([0, 1, 0, 1], TypeError, "labels must be a torch.Tensor"),
    (torch.tensor([0, 1, 0]), ValueError, r"labels must have shape \[4\]"),
    (torch.tensor([[0, 1, 0, 1]]), ValueError, r"labels must have shape \[4\]"),
    (torch.tensor([0, -1, 0, 1]), ValueError, "labels must be >= 0"),
])
def test_bad_labels_are_named(bad, error, match):
    z0, z1 = pair(4, 3)
    with pytest.raises(error, match=match):
        InfoNCELoss(0.1)(z0, z1, labels=bad)


def test_bad_negative_labels_are_named():
    z0, z1 = pair(4, 3)
    neg = torch.randn(2, 3)
    labels = torch.tensor([0, 0, 1, 1])
    fn = InfoNCELoss(0.1, form="cross_view")
    with pytest.raises(ValueError, match="negative_labels need labels"):
        fn(z0, z1, neg, negative_labels=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="negative_labels were given without negatives"):
        fn(z0, z1, labels=labels, negative_labels=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="negative_labels must be >= -1"):
        fn(z0, z1, neg, labels=labels, negative_labels=torch.tensor([0, -2]))
    with pytest.raises(ValueError, match=r"negative_labels must have shape \[2\]"):
        fn(z0, z1, neg, labels=labels, negative_labels=torch.tensor([0, 1, 1]))


@pytest.mark.parametrize("make", [lambda t: InfoNCELoss(0.1, tile_size=t),
                                  lambda t: DySTreSSLoss(detach_temperature=False, tile_size=t)],
                         ids=["infonce", "dystress"])
def test_tiled_labels_never_hold_a_tensor_of_the_matrix_size(make):
    """The targets are rebuilt per tile: forward and backward stay within a tile or linear in
    the batch (the materialised path does hold the matrix)."""
    from .test_tiled import _LargestTensor

    n, d, tile = 96, 4, 8
    z0, z1 = pair(n, d, seed=14)
    labels = torch.arange(n) % 5
    with _LargestTensor() as probe:
        make(tile)(z0, z1, labels=labels).backward()
    assert probe.largest <= max(tile * tile, 2 * n * d), probe.largest
    with _LargestTensor() as full:
        make(None)(z0, z1, labels=labels).backward()
    assert full.largest >= n * n
