"""The regimes the rest of the suite never visits, each against an independent float64
computation written from the papers' formulas (never through the code under test).

* easy positives for MACL (P_pos from 0.9 to 1 - 1e-6 and beyond, where the kernel switches
  from ``log(softplus(r))`` to ``r``), value and gradient (Huang et al., ICML 2023, Eq. 8, 11);
* peaked and flat neighbour distributions for ASCL's targets and confidence (Feng & Patras,
  Eq. 7-11: the caps ``min(1, c K q)`` and ``c in [0, 1]``), and the kernel's log-weight cap;
* small-norm but valid embeddings (norm 1e-5 .. 1e-2) keep exactly ``F.normalize``'s direction;
* tiles in which a whole row is masked (the streaming engine's guards for empty rows);
* AMCL's SimSiam and Barlow Twins forms against Table 2.2 / 2.3 of Wang et al. (ECCV 2024),
  and the temperature network's gradient outside its clamp range, tiled and materialised;
* FlatNCE's reported value (1 per anchor) and its logged InfoNCE value.

``test_every_last_stats_entry`` checks every ``last_stats`` entry of every loss of the shared
table (``_helpers.LOSSES``) against its own float64 computation.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from adaptcl.plugins import (
    AMCLBarlowTwinsLoss,
    AMCLLoss,
    AMCLSimSiamLoss,
    ASCLLoss,
    FlatNCELoss,
    InfoNCELoss,
    MACLLoss,
    PairTemperature,
    build_candidates,
    contrastive_kernel,
    soft_labels,
)
from adaptcl.plugins.candidates import normalize

from ._helpers import DIM, LOSSES, seeded

pytestmark = pytest.mark.usefixtures("one_thread")

D64 = torch.float64


def unit(x):
    """Row directions in float64 (the reference normalisation)."""
    return F.normalize(x.detach().to(D64), dim=1)


def direction_logits(z0, z1, form, temperature, negatives=None):
    """Float64 ``(positive logit [A], negative logits [A, C] with -inf where masked)`` of each
    direction of ``form``, built from the definitions of the forms (SimCLR's 2N anchors,
    the one-way cross-view form, its symmetric mean, MoCo's queue)."""
    a, b = unit(z0), unit(z1)
    neg = None if negatives is None else unit(negatives)
    n = a.shape[0]
    if form == "queue":
        return [((a * b).sum(1) / temperature, a @ neg.T / temperature)]
    if form == "nt_xent":
        z = torch.cat([a, b])
        keys = z if neg is None else torch.cat([z, neg])
        logits = z @ keys.T / temperature
        idx = torch.arange(2 * n)
        partner = torch.cat([idx[n:], idx[:n]])
        pos = logits[idx, partner]
        logits[idx, idx] = -math.inf
        logits[idx, partner] = -math.inf
        return [(pos, logits)]
    out = []
    for x, y in ((a, b), (b, a))[: 2 if form == "cross_view_symmetric" else 1]:
        keys = y if neg is None else torch.cat([y, neg])
        logits = x @ keys.T / temperature
        pos = logits.diagonal().clone()
        logits[torch.arange(n), torch.arange(n)] = -math.inf
        out.append((pos, logits))
    return out


def log_ratio(pos, negs):
    """``r = log sum_neg exp(l) - l_pos``: P_pos = sigmoid(-r), W = 1 - P_pos = sigmoid(r)."""
    return torch.logsumexp(negs, dim=1) - pos


# --------------------------------------------------------------------------------------------
# MACL: easy positives
# --------------------------------------------------------------------------------------------

# r = log(W / P_pos): P_pos = 0.9, 0.99, 0.999, 1 - 1e-4, 1 - 1e-6, then the float32 range
# beyond the kernel's switch to r (softplus(r) underflows to 0 in float32 below r ~ -104).
EASY_R = [math.log(0.1 / 0.9), math.log(0.01 / 0.99), math.log(1e-3 / 0.999),
          math.log(1e-4 / (1 - 1e-4)), math.log(1e-6 / (1 - 1e-6)), -30.0, -120.0]


def _easy_batch(r_target: float):
    """Queue-form inputs whose anchors have P_pos ~ sigmoid(-r_target) at temperature tau:
    anchor ``e_i``, its positive ``e_i`` (plus noise), five negatives at cosine ~ -0.58."""
    g = torch.Generator().manual_seed(3)
    n, d, k = 3, 8, 5
    z0 = torch.eye(n, d) + 1e-3 * torch.randn(n, d, generator=g)
    z1 = torch.eye(n, d) + 1e-3 * torch.randn(n, d, generator=g)
    centre = -torch.ones(d)
    centre[n:] = 0.0
    negatives = centre / math.sqrt(n) + 1e-3 * torch.randn(k, d, generator=g)
    # r = log k + (cos_neg - 1) / tau with cos_neg ~ -1/sqrt(3)
    tau = (1 + 1 / math.sqrt(n)) / (math.log(k) - r_target)
    return z0.requires_grad_(), z1.requires_grad_(), negatives.requires_grad_(), tau


def _macl_reference(z0, z1, negatives, tau0, alpha, a0):
    """MACL in float64 from its definitions: tau_a = tau0 (1 + alpha (A - A0)) (Eq. 7, A the
    detached mean positive cosine), L = -log P_pos, V = sg(1 / W), W = 1 - P_pos (Eq. 8, 11);
    -log P_pos = log(1 + e^r) and W = e^r / (1 + e^r) are exact forms of the same quantities."""
    a = (unit(z0) * unit(z1)).sum(1).mean()
    tau = tau0 * (1 + alpha * (a - a0))
    z0, z1, neg = (x.detach().to(D64).requires_grad_() for x in (z0, z1, negatives))
    a0n, a1n, nn_ = (x / x.norm(dim=1, keepdim=True) for x in (z0, z1, neg))
    pos, negs = (a0n * a1n).sum(1) / tau, a0n @ nn_.T / tau  # differentiable in float64
    r = torch.logsumexp(negs, dim=1) - pos
    nll = torch.log1p(torch.exp(r))
    v = ((1 + torch.exp(r)) / torch.exp(r)).detach()
    loss = (v * nll).mean()
    grads = torch.autograd.grad(loss, (z0, z1, neg))
    return loss, grads, r.detach(), tau


@pytest.mark.parametrize("r_target", EASY_R,
                         ids=["p0.9", "p0.99", "p0.999", "p1-1e-4", "p1-1e-6", "r-30", "r-120"])
def test_macl_easy_positives_value_and_gradient(r_target):
    z0, z1, negatives, tau = _easy_batch(r_target)
    alpha, a0 = 0.5, 0.1
    tau0 = tau / (1 + alpha * (1 - a0))  # A ~ 1 here: the adaptive temperature lands on tau
    loss_fn = MACLLoss(tau0, alpha, a0, form="queue")
    loss = loss_fn(z0, z1, negatives)
    grads = torch.autograd.grad(loss, (z0, z1, negatives))
    ref, ref_grads, r, ref_tau = _macl_reference(z0, z1, negatives, tau0, alpha, a0)
    assert abs(r.mean().item() - r_target) < 0.1  # the batch is in the intended regime
    torch.testing.assert_close(loss_fn.last_stats["temperature"].double(), ref_tau,
                               rtol=1e-6, atol=0)
    torch.testing.assert_close(loss.double(), ref, rtol=2e-6, atol=0)
    for g, e in zip(grads, ref_grads, strict=True):
        # float32 rounding of logits ~ 1 / tau
        torch.testing.assert_close(g.double(), e, rtol=1e-4, atol=1e-6 / tau)
    p_pos = torch.sigmoid(-r)
    torch.testing.assert_close(loss_fn.last_stats["positive_probability"].double(), p_pos.mean(),
                               rtol=1e-6, atol=0)
    torch.testing.assert_close(loss_fn.last_stats["mean_w"].double(), torch.sigmoid(r).mean(),
                               rtol=1e-3, atol=1e-44)  # W = e^-120 is below float32's range


def test_macl_easy_positives_kernel_switch_over():
    """The kernel's ``log(softplus(r))`` against float64 across the switch-over to ``r``."""
    r = torch.tensor([-1.0, -2.2, -5.0, -13.8, -19.9, -20.1, -30.0, -90.0, -120.0, -200.0])
    out = contrastive_kernel(r[:, None].clone(), torch.zeros_like(r), log_weights=lambda lw: -lw)
    r64 = r.double()
    expected = torch.log1p(torch.exp(r64)) * (1 + torch.exp(r64)) / torch.exp(r64)
    torch.testing.assert_close(out.loss.double(), expected, rtol=2e-6, atol=0)


# --------------------------------------------------------------------------------------------
# ASCL: peaked and flat neighbour distributions
# --------------------------------------------------------------------------------------------


def _ascl_reference(q, k, queue, tau, sharpen, num_neighbors, mode):
    """ASCL in float64 from Feng & Patras: d_ij = cos(k_i, z_j); q = softmax(d / tau') (Eq. 7);
    c = 1 - H(q) / log n (Eq. 8); targets 1 (Hard, Eq. 6), c (AHCL, Eq. 9) on the top-K or
    min(1, c K q_ij) (ASCL, Eq. 10); the positive keeps 1; rows normalised (Eq. 11); loss the
    cross-entropy of the targets with softmax([l_pos, l_neg])."""
    qq, kk, zz = unit(q), unit(k), unit(queue)
    d = kk @ zz.T
    p = torch.softmax(d / sharpen, dim=1)
    entropy = -(p * torch.log(p)).nan_to_num().sum(1)
    conf = 1 - entropy / math.log(zz.shape[0])
    if mode == "ascl":
        y = torch.minimum(torch.ones_like(p), conf[:, None] * num_neighbors * p)
    else:
        # ties go to the lowest columns (``soft_labels``' documented choice): a stable sort
        top = torch.sort(d, dim=1, descending=True, stable=True).indices[:, :num_neighbors]
        fill = torch.ones_like(conf) if mode == "hard" else conf
        y = torch.zeros_like(p).scatter(1, top, fill[:, None].expand(-1, num_neighbors))
    targets = torch.cat([torch.ones_like(conf)[:, None], y], dim=1)
    targets = targets / targets.sum(1, keepdim=True)
    logits = torch.cat([(qq * kk).sum(1, keepdim=True), qq @ zz.T], dim=1) / tau
    loss = -(targets * torch.log_softmax(logits, dim=1)).sum(1)
    return loss, targets, conf


def _in_batch_soft_labels(keys, sharpen, num_neighbors):
    """ASCL's in-batch targets in float64 (Eqs. 7, 8, 10, 11): the other keys of the batch are
    the candidates, the positive (the diagonal) keeps 1, rows normalised. Returns (y, c)."""
    eye = torch.eye(keys.shape[0], dtype=torch.bool)
    p = torch.softmax((keys @ keys.T / sharpen).masked_fill(eye, -math.inf), dim=1)
    conf = 1 - (-(p * torch.log(p)).nan_to_num().sum(1)) / math.log(keys.shape[0] - 1)
    y = torch.minimum(torch.ones_like(p), conf[:, None] * num_neighbors * p).masked_fill(eye, 0.0)
    y = y + eye.to(y.dtype)
    return y / y.sum(1, keepdim=True), conf


def _neighbour_batch(kind: str):
    """Queries, keys and a queue: ``"peaked"``, every key has a near-duplicate in the queue
    (sharpened q concentrates on it, c ~ 1, c K q ~ K > 1: the cap min(1, .) bites);
    ``"flat"``, every queue entry is equally far from every key (q uniform, c = 0)."""
    g = torch.Generator().manual_seed(5)
    n, d = 4, 16
    q = torch.randn(n, d, generator=g)
    k = q + 0.3 * torch.randn(n, d, generator=g)
    if kind == "peaked":
        queue = torch.cat([k + 0.02 * torch.randn(n, d, generator=g),
                           torch.randn(4, d, generator=g)])
    else:
        # keys in the first 8 coordinates, the queue in the last 8: every cos(k_i, z_j) = 0
        k = torch.cat([k[:, :8], torch.zeros(n, 8)], dim=1)
        queue = torch.cat([torch.zeros(6, 8), torch.randn(6, 8, generator=g)], dim=1)
    return q, k, queue


@pytest.mark.parametrize("mode", ["ascl", "ahcl", "hard"])
@pytest.mark.parametrize("kind", ["peaked", "flat"])
@pytest.mark.parametrize("tile", [None, 3])
def test_ascl_peaked_and_flat_neighbour_distributions(kind, mode, tile):
    q, k, queue = _neighbour_batch(kind)
    tau, sharpen, neighbours = 0.2, 0.05, 2
    loss_fn = ASCLLoss(tau, sharpen, neighbours, mode, tile_size=tile, reduction="none")
    q64 = q.double().requires_grad_()
    per_anchor = loss_fn(q64, k.double(), queue.double())
    ref, targets, conf = _ascl_reference(q, k, queue, tau, sharpen, neighbours, mode)
    if kind == "peaked":
        assert (conf > 0.99).all()
        if mode == "ascl":  # c K q_ij ~ 2 is capped at 1: targets 1/2 on positive and neighbour
            torch.testing.assert_close(targets[:, 0], torch.full_like(conf, 0.5), atol=1e-3,
                                       rtol=0)
    else:
        torch.testing.assert_close(conf, torch.zeros_like(conf), atol=1e-12, rtol=0)
    torch.testing.assert_close(per_anchor, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(loss_fn.last_stats["confidence"], conf.mean(), rtol=1e-10,
                               atol=1e-12)
    if tile is None:
        # the labels themselves (materialised path)
        cands = build_candidates(q.double(), k.double(), "queue", queue.double())[0]
        y_pos, y_neg, c = soft_labels(cands.positive_keys @ cands.keys.T,
                                      torch.ones(4, queue.shape[0], dtype=torch.bool),
                                      mode=mode, num_neighbors=neighbours,
                                      sharpen_temperature=sharpen)
        torch.testing.assert_close(torch.cat([y_pos[:, None], y_neg], 1), targets, rtol=1e-10,
                                   atol=1e-12)
        torch.testing.assert_close(c, conf, rtol=1e-10, atol=1e-12)


def test_ascl_confidence_stays_in_unit_interval_on_a_uniform_distribution():
    """All queue entries at the same cosine to each key: q is exactly uniform in float32 and
    H(q) rounds to log n or just above it; c must be 0, never negative."""
    k = torch.zeros(4, 8)
    k[:, 0] = 1.0
    queue = torch.zeros(7, 8)
    queue[:, 1:] = torch.eye(7)
    _, _, conf = soft_labels(k @ queue.T, torch.ones(4, 7, dtype=torch.bool), num_neighbors=1)
    assert (conf >= 0).all() and (conf <= 1).all()
    torch.testing.assert_close(conf, torch.zeros(4), atol=1e-6, rtol=0)


def test_kernel_log_weight_cap_with_soft_targets():
    """Per-anchor weights above e^80 are capped (their product with the loss would overflow
    float32 at e^88.7); below the cap the weight multiplies the loss exactly."""
    neg = torch.tensor([[0.0, 1.0], [2.0, -1.0]])
    pos = torch.tensor([3.0, 0.5])
    y_pos = torch.tensor([0.6, 0.5])
    y_neg = torch.tensor([[0.3, 0.1], [0.25, 0.25]])
    log_w = torch.tensor([100.0, 3.0])
    out = contrastive_kernel(neg.clone(), pos, soft_targets=(y_pos, y_neg), log_weights=log_w)
    logits = torch.cat([pos[:, None], neg], 1).double()
    targets = torch.cat([y_pos[:, None], y_neg], 1).double()
    plain = -(targets * torch.log_softmax(logits, 1)).sum(1)
    weight = torch.exp(torch.minimum(log_w.double(), torch.tensor(80.0, dtype=D64)))
    assert torch.isfinite(out.loss).all()
    torch.testing.assert_close(out.loss.double(), weight * plain, rtol=1e-5, atol=0)
    out_dcl = contrastive_kernel(neg.clone(), pos, positive_in_denominator=False,
                                 log_weights=log_w)
    r = torch.logsumexp(neg.double(), 1) - pos.double()
    torch.testing.assert_close(out_dcl.loss.double(), weight * r, rtol=1e-5, atol=0)


# --------------------------------------------------------------------------------------------
# Small-norm but valid embeddings
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", [1e-5, 1e-4, 1e-3, 1e-2])
def test_small_norm_rows_keep_f_normalize_direction(norm):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, 16, generator=g)
    x = x / x.norm(dim=1, keepdim=True) * norm  # an untrained or weight-decayed head
    torch.testing.assert_close(normalize(x).double(), unit(x), rtol=1e-6, atol=1e-7)
    z1 = torch.randn(6, 16, generator=g)
    z0 = x.clone().requires_grad_()
    loss = InfoNCELoss(0.2, form="cross_view")(z0, z1)
    ((pos, negs),) = direction_logits(x, z1, "cross_view", 0.2)
    expected = F.softplus(log_ratio(pos, negs)).mean()
    torch.testing.assert_close(loss.double(), expected, rtol=1e-6, atol=0)
    (grad,) = torch.autograd.grad(loss, z0)
    assert grad.abs().max() > 0  # a direction that is learned, not a zeroed row


# --------------------------------------------------------------------------------------------
# Tiles in which a whole row is masked
# --------------------------------------------------------------------------------------------


def _masked_row_case(form):
    g = torch.Generator().manual_seed(9)
    z0 = torch.randn(5, 6, generator=g, dtype=D64).requires_grad_()
    z1 = torch.randn(5, 6, generator=g, dtype=D64).requires_grad_()
    return z0, z1


@pytest.mark.parametrize("form", ["nt_xent", "cross_view", "cross_view_symmetric"])
@pytest.mark.parametrize("tile", [1, 2])
def test_tiles_with_a_whole_row_masked(form, tile):
    """With tile 1 (and, in the NT-Xent form, tile 2: row 0 sees only itself... and row N its
    positive) the first tile of some rows holds only masked columns: the online log-sum-exp
    must start from an empty row without NaN; value and gradient as the float64 formula."""
    z0, z1 = _masked_row_case(form)
    for make, formula in (
        (lambda: InfoNCELoss(0.3, form=form, tile_size=tile), F.softplus),
        (lambda: MACLLoss(0.3, 0.0, form=form, tile_size=tile),
         lambda r: F.softplus(r) / torch.sigmoid(r).detach()),
    ):
        loss = make()(z0, z1)
        g = torch.autograd.grad(loss, (z0, z1))
        a, b = z0.detach().clone().requires_grad_(), z1.detach().clone().requires_grad_()
        rs = [log_ratio(p, n) for p, n in _differentiable_logits(a, b, form, 0.3)]
        expected = torch.cat([formula(r) for r in rs]).mean()
        eg = torch.autograd.grad(expected, (a, b))
        torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-12)
        for x, y in zip(g, eg, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-8, atol=1e-10)


def _differentiable_logits(z0, z1, form, tau):
    a, b = (x / x.norm(dim=1, keepdim=True) for x in (z0, z1))
    n = a.shape[0]
    out = []
    if form == "nt_xent":
        z = torch.cat([a, b])
        logits = z @ z.T / tau
        idx = torch.arange(2 * n)
        partner = torch.cat([idx[n:], idx[:n]])
        mask = torch.zeros_like(logits, dtype=torch.bool)
        mask[idx, idx] = True
        mask[idx, partner] = True
        return [(logits[idx, partner], logits.masked_fill(mask, -math.inf))]
    eye = torch.eye(n, dtype=torch.bool)
    for x, y in ((a, b), (b, a))[: 2 if form == "cross_view_symmetric" else 1]:
        logits = x @ y.T / tau
        out.append((logits.diagonal(), logits.masked_fill(eye, -math.inf)))
    return out


@pytest.mark.parametrize("tile", [1, 2])
def test_tiles_with_a_whole_row_masked_ascl_in_batch(tile):
    """ASCL's first (statistics) pass over tiles where a row's only column is its masked
    positive: normaliser and entropy of the sharpened distribution start from an empty row."""
    g = torch.Generator().manual_seed(10)
    q = torch.randn(5, 6, generator=g, dtype=D64)
    k = torch.randn(5, 6, generator=g, dtype=D64)
    loss_fn = ASCLLoss(0.3, 0.1, 2, "ascl", form="cross_view", tile_size=tile, reduction="none")
    per_anchor = loss_fn(q, k)
    qq, kk = unit(q), unit(k)
    y, conf = _in_batch_soft_labels(kk, 0.1, 2)
    expected = -(y * torch.log_softmax(qq @ kk.T / 0.3, dim=1)).sum(1)
    torch.testing.assert_close(per_anchor, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(loss_fn.last_stats["confidence"], conf.mean(), rtol=1e-10,
                               atol=1e-12)


# --------------------------------------------------------------------------------------------
# AMCL: Table 2 forms and the temperature network outside its clamp range
# --------------------------------------------------------------------------------------------


def _pair_tau(net, a, b, *, pairwise):
    """tau(a, b) = iota sigmoid(-clamp(<phi(a), phi(b)>)) + eta (AMCL's bounded sigmoid),
    with phi the network's linear layer, in float64."""
    w, bias = net.phi.weight.to(D64), net.phi.bias.to(D64)
    fa, fb = a @ w.T + bias, b @ w.T + bias
    r = (fa * fb).sum(1) if pairwise else fa @ fb.T
    return net.iota * torch.sigmoid(-r.clamp(-net.clamp, net.clamp)) + net.eta


def _omega(tau, d):
    return d / 2 * torch.log(tau) + 1 / tau  # Eq. (4)


@pytest.mark.parametrize("heads", [1, 2])
def test_amcl_simsiam_matches_table_2(heads):
    g = torch.Generator().manual_seed(12)
    p0, p1, z0, z1 = (torch.randn(heads, 6, DIM, generator=g, dtype=D64).requires_grad_()
                      for _ in range(4))
    net = seeded(4, lambda: PairTemperature(DIM, iota=2.0)).double()
    beta = 0.05
    loss_fn = AMCLSimSiamLoss(net, beta=beta, reduction="none")
    per_sample = loss_fn(p0, p1, z0, z1)
    expected, taus = 0.0, []
    for c in range(heads):  # Table 2.2, summed over heads
        a0, a1 = (x[c] / x[c].norm(dim=1, keepdim=True) for x in (p0, p1))
        t0, t1 = (x[c].detach() / x[c].detach().norm(dim=1, keepdim=True) for x in (z0, z1))
        tau_a = _pair_tau(net, a0, t1, pairwise=True)
        tau_b = _pair_tau(net, a1, t0, pairwise=True)
        expected = expected + (-(a0 * t1).sum(1) / (2 * tau_a) - (a1 * t0).sum(1) / (2 * tau_b)
                               + beta * (_omega(tau_a, DIM) + _omega(tau_b, DIM)))
        taus.append(torch.cat([tau_a, tau_b]).mean())
    torch.testing.assert_close(per_sample, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(loss_fn.last_stats["temperature"], torch.stack(taus).mean().detach(),
                               rtol=1e-10, atol=1e-12)
    params = list(net.parameters())
    got = torch.autograd.grad(per_sample.sum(), [p0, p1, z0, z1, *params], allow_unused=True,
                              materialize_grads=True)
    want = torch.autograd.grad(expected.sum(), [p0, p1, z0, z1, *params], allow_unused=True,
                               materialize_grads=True)
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-11)
    assert got[2].abs().max() == 0 and got[3].abs().max() == 0  # sg on the projections


@pytest.mark.parametrize("lambda_param", [5e-3, 0.5])
def test_amcl_barlow_twins_matches_table_2(lambda_param):
    g = torch.Generator().manual_seed(13)
    z0, z1 = (torch.randn(2, 10, DIM, generator=g, dtype=D64).requires_grad_() for _ in range(2))
    net = seeded(5, lambda: PairTemperature(DIM, iota=2.0)).double()
    beta = 0.01
    loss_fn = AMCLBarlowTwinsLoss(net, beta=beta, lambda_param=lambda_param)
    loss = loss_fn(z0, z1)
    expected, taus = 0.0, []
    off = ~torch.eye(DIM, dtype=torch.bool)
    for c in range(2):  # Table 2.3, summed over heads
        a, b = ((x[c] - x[c].mean(0)) / torch.sqrt(x[c].var(0, unbiased=False) + 1e-5)
                for x in (z0, z1))
        corr = a.T @ b / a.shape[0]
        tau = _pair_tau(net, corr, corr.T, pairwise=False)
        reg = _omega(tau, DIM)
        expected = expected + ((1 - corr.diagonal() / tau.diagonal()) ** 2).sum() \
            + lambda_param * (corr[off] ** 2 / tau[off]).sum() \
            + beta * reg.diagonal().sum() - beta * reg[off].sum()
        taus.append(tau.diagonal().mean())
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(loss_fn.last_stats["temperature"], torch.stack(taus).mean().detach(),
                               rtol=1e-10, atol=1e-12)
    params = list(net.parameters())
    got = torch.autograd.grad(loss, [z0, z1, *params])
    want = torch.autograd.grad(expected, [z0, z1, *params])
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-11)


def _amcl_softmax_reference(z0, z1, net, beta):
    """AMCL's NT-Xent form with the softmax negative term (Eq. 3, 4, 7) in float64:
    -s_pos / tau_pos + beta Omega(tau_pos) + logsumexp_n (s_n / tau_n - beta Omega(tau_n))."""
    a, b = (x / x.norm(dim=1, keepdim=True) for x in (z0, z1))
    z = torch.cat([a, b])
    n = a.shape[0]
    idx = torch.arange(2 * n)
    partner = torch.cat([idx[n:], idx[:n]])
    s = z @ z.T
    tau = _pair_tau(net, z, z, pairwise=False)
    tau_pos = _pair_tau(net, z, z[partner], pairwise=True)
    terms = s / tau - beta * _omega(tau, z.shape[1])
    mask = torch.zeros_like(s, dtype=torch.bool)
    mask[idx, idx] = True
    mask[idx, partner] = True
    neg = torch.logsumexp(terms.masked_fill(mask, -math.inf), dim=1)
    return (-s[idx, partner] / tau_pos + beta * _omega(tau_pos, z.shape[1]) + neg).mean()


@pytest.mark.parametrize("tile", [None, 1, 3])
def test_amcl_temperature_gradient_outside_the_clamp_range(tile):
    """With a clamp of 1 most pairs' <phi(a), phi(b)> lie outside [-1, 1]: their temperature is
    constant there, so the network gets gradient only from the pairs inside (as autograd of the
    clamped formula gives); the tiled path writes this derivative out by hand."""
    g = torch.Generator().manual_seed(14)
    z0, z1 = (torch.randn(4, DIM, generator=g, dtype=D64).requires_grad_() for _ in range(2))
    net = seeded(6, lambda: PairTemperature(DIM, iota=2.0, clamp=1.0)).double()
    with torch.no_grad():
        net.phi.weight.mul_(3.0)
    beta = 0.05
    loss = AMCLLoss(net, beta=beta, tile_size=tile)(z0, z1)
    expected = _amcl_softmax_reference(z0, z1, net, beta)
    a = F.normalize(torch.cat([z0, z1]).detach(), dim=1)
    feats = a @ net.phi.weight.T.detach() + net.phi.bias.detach()
    r = feats @ feats.T
    inside = (r.abs() <= 1.0).double().mean().item()
    assert 0.05 < inside < 0.6  # both regimes are present
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-12)
    params = [z0, z1, *net.parameters()]
    for x, y in zip(torch.autograd.grad(loss, params), torch.autograd.grad(expected, params),
                    strict=True):
        torch.testing.assert_close(x, y, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("kappa", [1, 3])
@pytest.mark.parametrize("tile", [None, 2])
def test_amcl_top_kappa_per_anchor_matches_table_2(kappa, tile):
    """Table 2.1 per anchor: -s_pos / tau_pos + beta Omega(tau_pos) + the mean over the kappa
    most similar negatives of s_n / tau_n - beta Omega(tau_n) (kappa = 1: the max)."""
    g = torch.Generator().manual_seed(16)
    z0, z1 = (torch.randn(5, DIM, generator=g, dtype=D64).requires_grad_() for _ in range(2))
    net = seeded(7, lambda: PairTemperature(DIM)).double()
    beta = 0.05
    per_anchor = AMCLLoss(net, beta, negative_term="topk", kappa=kappa, tile_size=tile,
                          reduction="none")(z0, z1)
    a, b = (x / x.norm(dim=1, keepdim=True) for x in (z0, z1))
    z = torch.cat([a, b])
    idx = torch.arange(10)
    partner = torch.cat([idx[5:], idx[:5]])
    s = z @ z.T
    tau = _pair_tau(net, z, z, pairwise=False)
    tau_pos = _pair_tau(net, z, z[partner], pairwise=True)
    terms = s / tau - beta * _omega(tau, DIM)
    masked = s.detach().clone()
    masked[idx, idx] = -math.inf
    masked[idx, partner] = -math.inf
    top = masked.topk(kappa, dim=1).indices
    expected = (-s[idx, partner] / tau_pos + beta * _omega(tau_pos, DIM)
                + terms.gather(1, top).mean(dim=1))
    torch.testing.assert_close(per_anchor, expected, rtol=1e-10, atol=1e-12)
    params = [z0, z1, *net.parameters()]
    for x, y in zip(torch.autograd.grad(per_anchor.sum(), params),
                    torch.autograd.grad(expected.sum(), params), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-8, atol=1e-10)


# --------------------------------------------------------------------------------------------
# FlatNCE's reported value
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["nt_xent", "cross_view"])
def test_flatnce_reported_value(form):
    """FlatNCE's value is exp(r - sg(r)) = 1 per anchor (Chen et al. 2021), its gradient DCL's
    (the gradient of r), and ``plain_loss`` logs InfoNCE's -log P_pos."""
    g = torch.Generator().manual_seed(15)
    z0, z1 = (torch.randn(5, 6, generator=g, dtype=D64).requires_grad_() for _ in range(2))
    for reduction, count in (("mean", 1), ("sum", 10 if form == "nt_xent" else 5)):
        loss_fn = FlatNCELoss(0.3, form=form, reduction=reduction)
        loss = loss_fn(z0, z1)
        assert loss.item() == pytest.approx(count, abs=1e-12)
    per_anchor = FlatNCELoss(0.3, form=form, reduction="none")(z0, z1)
    torch.testing.assert_close(per_anchor, torch.ones_like(per_anchor), rtol=0, atol=1e-12)
    rs = torch.cat([log_ratio(p, n) for p, n in _differentiable_logits(z0, z1, form, 0.3)])
    torch.testing.assert_close(loss_fn.last_stats["plain_loss"], F.softplus(rs).mean().detach(),
                               rtol=1e-10, atol=1e-12)
    got = torch.autograd.grad(per_anchor.mean(), (z0, z1))
    want = torch.autograd.grad(rs.mean(), (z0, z1))
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-11)


# --------------------------------------------------------------------------------------------
# Every ``last_stats`` entry of every loss
# --------------------------------------------------------------------------------------------


def _family_stats(z0, z1, neg, form, tau, plain, weight_log=None):
    """InfoNCE-family statistics: mean loss, mean unweighted loss, mean positive cosine of the
    first direction, temperature, mean W = 1 - P_pos and mean P_pos over all anchors."""
    dirs = direction_logits(z0, z1, form, tau, neg)
    r = torch.cat([log_ratio(p, n) for p, n in dirs])
    plain_values = torch.cat([plain(p, n) for p, n in dirs])
    loss = plain_values if weight_log is None else torch.exp(weight_log(dirs, r)) * plain_values
    return {"loss": loss.mean(), "plain_loss": plain_values.mean(),
            "alignment": (unit(z0) * unit(z1)).sum(1).mean(),
            "temperature": (tau if isinstance(tau, torch.Tensor)  # python numbers: float32
                            else torch.tensor(tau, dtype=torch.float32)), "mean_w": torch.sigmoid(r).mean(),
            "positive_probability": torch.sigmoid(-r).mean()}


def _softplus_r(p, n):
    return F.softplus(log_ratio(p, n))


def _r(p, n):
    return log_ratio(p, n)


def _macl_tau(z0, z1, tau0, alpha, a0, form="linear"):
    a = (unit(z0) * unit(z1)).sum(1).mean()
    tau = tau0 * (1 + alpha * (a - a0)) if form == "linear" else tau0 * alpha ** a
    return tau.clamp(min=tau0 / 10)


def _expected_stats(name, x):
    """The float64 statistics of table entry ``name`` on inputs ``x``."""
    z0, z1 = x[0], x[1]
    neg = x[2] if len(x) == 3 else None
    if name in ("infonce", "infonce_cross_view", "infonce_symmetric", "infonce_queue"):
        form = {"infonce": "nt_xent", "infonce_cross_view": "cross_view",
                "infonce_symmetric": "cross_view_symmetric", "infonce_queue": "queue"}[name]
        return _family_stats(z0, z1, neg, form, 0.2, _softplus_r)
    if name == "dcl":
        return _family_stats(z0, z1, None, "nt_xent", 0.2, _r)
    if name == "flatnce":
        s = _family_stats(z0, z1, None, "nt_xent", 0.2, _softplus_r)
        return {"loss": torch.tensor(1.0, dtype=D64), "plain_loss": s["plain_loss"],
                "alignment": s["alignment"], "temperature": s["temperature"]}
    if name == "dual":
        beta_dirs = direction_logits(z0, z1, "nt_xent", 1.0)
        r_beta = torch.cat([log_ratio(p, n) for p, n in beta_dirs])
        return _family_stats(z0, z1, None, "nt_xent", 0.2, _softplus_r,
                             lambda dirs, r: F.logsigmoid(r_beta) - F.logsigmoid(r))
    if name in ("macl", "macl_queue"):
        form, a0 = ("nt_xent", 0.1) if name == "macl" else ("queue", 0.2)
        tau = _macl_tau(z0, z1, 0.2, 0.5, a0)
        return _family_stats(z0, z1, neg, form, tau, _softplus_r, lambda dirs, r: -F.logsigmoid(r))
    if name == "macl_wprime_symmetric":
        tau = _macl_tau(z0, z1, 0.2, 0.5, 0.0)
        cos = (unit(z0) * unit(z1)).sum(1)
        return _family_stats(z0, z1, None, "cross_view_symmetric", tau, _softplus_r,
                             lambda dirs, r: torch.log(2 - cos).repeat(2) - F.logsigmoid(r))
    if name == "macl_exp_dcl":
        tau = _macl_tau(z0, z1, 0.2, 2.0, 0.0, form="exp")
        return _family_stats(z0, z1, None, "nt_xent", tau, _r)
    if name in ("ascl_queue", "ahcl_queue", "hard_queue"):
        mode = name.split("_")[0]
        loss, targets, conf = _ascl_reference(z0, z1, neg, 0.2, 0.1, 2, mode)
        ((pos, negs),) = direction_logits(z0, z1, "queue", 0.2, neg)
        r = log_ratio(pos, negs)
        return {"loss": loss.mean(), "plain_loss": loss.mean(),
                "alignment": (unit(z0) * unit(z1)).sum(1).mean(),
                "temperature": torch.tensor(0.2, dtype=torch.float32), "mean_w": torch.sigmoid(r).mean(),
                "positive_probability": torch.sigmoid(-r).mean(), "confidence": conf.mean()}
    if name == "ascl_in_batch":
        q, k = unit(z0), unit(z1)
        eye = torch.eye(q.shape[0], dtype=torch.bool)
        y, conf = _in_batch_soft_labels(k, 0.1, 1)
        logits = q @ k.T / 0.2
        loss = -(y * torch.log_softmax(logits, 1)).sum(1)
        r = torch.logsumexp(logits.masked_fill(eye, -math.inf), 1) - logits.diagonal()
        return {"loss": loss.mean(), "plain_loss": loss.mean(),
                "alignment": (q * k).sum(1).mean(), "temperature": torch.tensor(0.2, dtype=torch.float32),
                "mean_w": torch.sigmoid(r).mean(), "positive_probability": torch.sigmoid(-r).mean(),
                "confidence": conf.mean()}
    if name == "ascl_byol":  # appendix A: L_i = 2 - 2 sum_j y_ij cos(t_i, p_j)
        pred, tgt = unit(z0), unit(z1)
        y, conf = _in_batch_soft_labels(tgt, 0.1, 1)
        loss = 2 - 2 * (y * (tgt @ pred.T)).sum(1)
        return {"loss": loss.mean(), "alignment": (pred * tgt).sum(1).mean(),
                "confidence": conf.mean()}
    if name.startswith("amcl_") and name not in ("amcl_simsiam", "amcl_barlow_twins"):
        net = LOSSES[name].build().temperature_net.double()
        form = "queue" if name == "amcl_queue" else "nt_xent"
        a, b = unit(z0), unit(z1)
        if form == "queue":
            anchors, positives, keys = a, b, unit(neg)
        else:
            anchors, positives, keys = torch.cat([a, b]), torch.cat([b, a]), torch.cat([a, b])
        tau_pos = _pair_tau(net, anchors, positives, pairwise=True)
        tau_all = _pair_tau(net, anchors, keys, pairwise=False)
        return {"temperature": tau_pos.mean(), "negative_temperature": tau_all.mean(),
                "alignment": (a * b).sum(1).mean()}  # the loss value: see the Table 2 tests
    if name == "amcl_simsiam":
        net = LOSSES[name].build().temperature_net.double()
        p0, p1, t0, t1 = (unit(t) for t in x)
        tau = torch.cat([_pair_tau(net, p0, t1, pairwise=True),
                         _pair_tau(net, p1, t0, pairwise=True)])
        return {"temperature": tau.mean()}
    if name == "amcl_barlow_twins":
        net = LOSSES[name].build().temperature_net.double()
        a, b = ((t.detach().double() - t.detach().double().mean(0))
                / torch.sqrt(t.detach().double().var(0, unbiased=False) + 1e-5) for t in x)
        corr = a.T @ b / a.shape[0]
        return {"temperature": _pair_tau(net, corr, corr.T, pairwise=False).diagonal().mean()}
    if name in ("margin", "margin_symmetric", "triplet", "triplet_hardest", "nce", "nce_nt_xent"):
        return {"alignment": (unit(z0) * unit(z1)).sum(1).mean()}  # values: test_methods
    raise KeyError(name)


# The table entries ``_expected_stats`` has a float64 formula for (each at the table's
# hyper-parameters); the other entries' statistics are the same code at other settings.
WITH_REFERENCE = [
    "infonce", "infonce_cross_view", "infonce_symmetric", "infonce_queue", "dcl", "flatnce",
    "dual", "macl", "macl_wprime_symmetric", "macl_exp_dcl", "macl_queue", "ascl_queue",
    "ahcl_queue", "hard_queue", "ascl_in_batch", "ascl_byol", "amcl_softmax",
    "amcl_softmax_infonce", "amcl_topk", "amcl_queue", "amcl_simsiam", "amcl_barlow_twins",
    "margin", "margin_symmetric", "triplet", "triplet_hardest", "nce", "nce_nt_xent",
]


@pytest.mark.parametrize("name", WITH_REFERENCE)
def test_every_last_stats_entry(name):
    case = LOSSES[name]
    x = case.inputs(seed=21, dtype=D64)
    loss_fn = case.build(tile_size=None, reduction="mean")
    if name.startswith("amcl_"):
        loss_fn.double()
    loss = loss_fn(*x)
    stats = loss_fn.last_stats
    expected = _expected_stats(name, x)
    assert set(stats) == set(expected) | {"loss"}, f"{name}: keys of last_stats"
    torch.testing.assert_close(stats["loss"], loss.detach(), rtol=1e-12, atol=1e-12)
    for key, value in expected.items():
        got = stats[key]
        assert not got.requires_grad and got.ndim == 0, (name, key)
        torch.testing.assert_close(got.double(), value.detach().double(), rtol=1e-9, atol=1e-11,
                                   msg=f"{name}: last_stats[{key!r}]")
