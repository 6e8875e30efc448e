"""The survey losses (margin contrastive, triplet, NCE) against float64 formulas written from
their papers (Hadsell et al. 2006; Schroff et al. 2015; Wu et al. 2018 with P_n = 1/n, as the
survey ``002_748363f490ab5580.txt`` states them), value and gradient, in every form, with extra
negatives and in row blocks."""

from __future__ import annotations

import math

import pytest
import torch

from adaptcl.plugins import MarginContrastiveLoss, NCELoss, TripletLoss

pytestmark = pytest.mark.usefixtures("one_thread")

D64 = torch.float64


def _directions(z0, z1, form, negatives):
    """``(anchors [A, D], positive [A, D], negatives [A, M, D])`` per direction of ``form``."""
    a, b = (x / x.norm(dim=1, keepdim=True) for x in (z0, z1))
    extra = None if negatives is None else negatives / negatives.norm(dim=1, keepdim=True)
    n = a.shape[0]

    def others(keys, skip):  # every key except the listed columns of each row, plus the extra
        rows = []
        for i in range(n if keys.shape[0] == n else keys.shape[0]):
            keep = [j for j in range(keys.shape[0]) if j not in skip(i)]
            row = keys[keep]
            rows.append(row if extra is None else torch.cat([row, extra]))
        return torch.stack(rows)

    if form == "queue":
        return [(a, b, extra.expand(n, -1, -1))]
    if form == "nt_xent":
        z = torch.cat([a, b])
        partner = lambda i: i + n if i < n else i - n  # noqa: E731
        return [(z, torch.cat([b, a]), others(z, lambda i: {i, partner(i)}))]
    out = [(a, b, others(b, lambda i: {i}))]
    if form == "cross_view_symmetric":
        out.append((b, a, others(a, lambda i: {i})))
    return out


def _dist(x, y):
    return (x - y).norm(dim=-1)


def _margin(a, p, negs, margin, squared):
    d_pos, d_neg = _dist(a, p), _dist(a[:, None], negs)
    hinge = (margin - d_neg).clamp(min=0)
    if squared:
        d_pos, hinge = d_pos ** 2, hinge ** 2
    return 0.5 * d_pos + 0.5 * hinge.mean(dim=1)


def _triplet(a, p, negs, margin, mining):
    d_pos, d_neg = _dist(a, p), _dist(a[:, None], negs)
    if mining == "hardest":
        return (d_pos - d_neg.min(dim=1).values + margin).clamp(min=0)
    return (d_pos[:, None] - d_neg + margin).clamp(min=0).mean(dim=1)


def _nce(a, p, negs, temperature):
    """P(i|x) = softmax over the n = m + 1 candidates; h = P / (P + m P_n), P_n = 1/n;
    L = -log h(positive) - sum_negatives log(1 - h)."""
    logits = torch.cat([(a * p).sum(1, keepdim=True), (a[:, None] * negs).sum(-1)], 1) / temperature
    prob = torch.softmax(logits, dim=1)
    m = negs.shape[1]
    noise = m / (m + 1)
    h = prob / (prob + noise)
    return -torch.log(h[:, 0]) - torch.log(1 - h[:, 1:]).sum(1)


CASES = {
    "margin_squared": (lambda **kw: MarginContrastiveLoss(0.8, **kw),
                       lambda a, p, n: _margin(a, p, n, 0.8, True)),
    "margin_unsquared": (lambda **kw: MarginContrastiveLoss(1.3, squared=False, **kw),
                         lambda a, p, n: _margin(a, p, n, 1.3, False)),
    "triplet_all": (lambda **kw: TripletLoss(0.7, **kw), lambda a, p, n: _triplet(a, p, n, 0.7, "all")),
    "triplet_hardest": (lambda **kw: TripletLoss(0.4, mining="hardest", **kw),
                        lambda a, p, n: _triplet(a, p, n, 0.4, "hardest")),
    "nce": (lambda **kw: NCELoss(0.3, **kw), lambda a, p, n: _nce(a, p, n, 0.3)),
}


@pytest.mark.parametrize("form, extra, tile", [
    ("cross_view", False, None), ("nt_xent", False, None), ("cross_view_symmetric", True, None),
    ("queue", True, None), ("cross_view", True, 2), ("nt_xent", False, 3)])
@pytest.mark.parametrize("name", list(CASES))
def test_survey_losses_match_their_formulas(name, form, extra, tile):
    make, formula = CASES[name]
    g = torch.Generator().manual_seed(31)
    z0, z1, neg = (torch.randn(rows, 6, generator=g, dtype=D64).requires_grad_()
                   for rows in (5, 5, 3))
    negatives = neg if extra else None
    loss_fn = make(form=form, tile_size=tile, reduction="none")
    per_anchor = loss_fn(z0, z1, negatives)
    expected = torch.cat([formula(a, p, n) for a, p, n in _directions(z0, z1, form, negatives)])
    torch.testing.assert_close(per_anchor, expected, rtol=1e-10, atol=1e-12)
    leaves = [z0, z1] + ([neg] if extra else [])
    got = torch.autograd.grad(per_anchor.sum(), leaves)
    want = torch.autograd.grad(expected.sum(), leaves)
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-11)
    assert loss_fn.last_stats["loss"].item() == pytest.approx(expected.mean().item(), abs=1e-12)


def test_nce_noise_ratio_uses_the_number_of_candidates():
    """With m noise samples among n = m + 1 candidates, m P_n = m / (m + 1) (not m or 1)."""
    z = torch.eye(3, dtype=D64)
    loss = NCELoss(1.0, form="cross_view", reduction="none")(z, z)
    p = math.e / (math.e + 2)  # cos 1 for the positive, 0 for the two negatives
    q = 1 / (math.e + 2)
    noise = 2 / 3
    expected = -math.log(p / (p + noise)) - 2 * math.log(1 - q / (q + noise))
    torch.testing.assert_close(loss, torch.full((3,), expected, dtype=D64), rtol=1e-12, atol=0)
