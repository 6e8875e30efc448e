"""Tiled (Inf-CL) losses equal the materialised ones, value and gradient, for every method.

The tiled path streams ``tile_size x tile_size`` tiles of the similarity matrix and recomputes
them in backward (:mod:`adaptcl.plugins.tiles._loop`); here it is compared with the materialised
path on random inputs (tile sizes that do not divide the batch, a batch smaller than one
tile, tile 1) and on hostile inputs (identical views, collapsed and zero embeddings, cosines
exactly +-1, temperature 0.01), in float32 to 1e-5, plus float64 gradchecks of the custom
backward and a check that no intermediate ever has the size of the full matrix. The losses
come from the shared table (``_helpers.LOSSES``): the survey losses and ASCL-BYOL, which have
no streaming path, are compared the same way (their ``tile_size`` processes anchors in
checkpointed row blocks).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from adaptcl.plugins import (
    AMCLLoss,
    ASCLLoss,
    ConstantTemperature,
    InfoNCELoss,
    MACLLoss,
    PairTemperature,
    dcl,
    info_nce,
)
from adaptcl.plugins.ascl import _TileTargets
from adaptcl.plugins.tiles._loop import streamed_row_stats

from ._helpers import LOSSES, names

TOL = {"rtol": 1e-5, "atol": 1e-5}


pytestmark = pytest.mark.usefixtures("one_thread")  # small ops: no OpenMP stalls on a loaded box


# Every loss that takes ``tile_size`` with the shared keywords (the streamed InfoNCE family, ASCL,
# AMCL; the survey losses and ASCL-BYOL in checkpointed row blocks), from the shared table.
METHODS = names(shared=True, tileable=True)
# A fixed seed per method (reproducible across runs, unlike ``hash(name)``).
SEEDS = {name: 101 + i for i, name in enumerate(METHODS)}


def _make(name, dim, temperature=None):
    """``make(tile)``: the table's loss ``name`` for ``dim``-dimensional inputs (AMCL's learned
    temperatures ignore ``temperature``)."""
    return lambda tile: LOSSES[name].build(tile_size=tile, temperature=temperature, dim=dim)


def _needs_negatives(name):
    return LOSSES[name].kind == "queue"


def _loss_and_grads(fn, leaves, build):
    fn = fn.to(leaves[0].device)
    z0, z1, neg = build(*leaves)
    loss = fn(z0, z1, neg)
    params = list(fn.parameters())
    grads = torch.autograd.grad(loss, [*leaves, *params], allow_unused=True, materialize_grads=True)
    return loss, grads, dict(fn.last_stats)


def _compare(name, leaves, build, tile, temperature=None, dim=None, input_grads=True,
             parameter_grads=True):
    make = _make(name, dim or leaves[0].shape[-1], temperature)
    ref = _loss_and_grads(make(None), leaves, build)
    til = _loss_and_grads(make(tile), leaves, build)
    assert torch.isfinite(til[0])
    torch.testing.assert_close(til[0], ref[0], **TOL)
    exact = None
    for i, (a, b) in enumerate(zip(til[1], ref[1], strict=True)):
        assert torch.isfinite(a).all()
        if not (input_grads or i >= len(leaves)) or not (parameter_grads or i < len(leaves)):
            continue
        if torch.allclose(a, b, **TOL):
            continue
        # A gradient entry that is a cancelling sum of terms ~50x larger (temperature 0.01)
        # carries ~1e-5 of float32 rounding in either path: then the tiled gradient must be as
        # close to the float64 truth as the materialised one, within 1e-5 of the tensor's scale.
        if exact is None:
            leaves64 = tuple(x.detach().double().requires_grad_() for x in leaves)
            exact = _loss_and_grads(make(None).double(), leaves64, build)[1]
        e = exact[i].float()
        scale = max(1.0, float(e.abs().max()))
        assert ((a - e).abs() <= (b - e).abs() + 1e-5 * scale).all(), (name, i, (a - b).abs().max())
    for key, value in ref[2].items():
        torch.testing.assert_close(til[2][key].to(value.dtype), value, **TOL, msg=f"{name}: stat {key}")


def _random_leaves(n, d, k, seed, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(rows, d, generator=g, dtype=dtype).to(device).requires_grad_()
                 for rows in (n, n, k))


def _builder(needs_negatives):
    return lambda z0, z1, neg: (z0, z1, neg if needs_negatives else None)


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("tile", [1, 3, 5, 64])
def test_tiled_equals_materialised(name, tile, device):
    """Tile 1, tiles that do not divide 2N = 14 or C, and one tile larger than the batch."""
    _compare(name, _random_leaves(7, 8, 6, seed=SEEDS[name], device=device),
             _builder(_needs_negatives(name)), tile)


@pytest.mark.parametrize("name", ["infonce", "macl", "ascl_in_batch", "amcl_softmax_infonce"])
def test_extra_negatives_appended_to_in_batch_candidates(name):
    leaves = _random_leaves(6, 8, 5, seed=3)
    _compare(name, leaves, lambda z0, z1, neg: (z0, z1, neg), tile=4)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(METHODS), n=st.integers(3, 13), d=st.integers(2, 9),
       k=st.integers(3, 11), tile=st.integers(1, 30), seed=st.integers(0, 2**16))
def test_tiled_equals_materialised_random_shapes(name, n, d, k, tile, seed):
    # d >= 2: in one dimension the gradient of x / |x| is exactly zero and both paths return
    # ~1e-5 of float32 rounding noise there (cosines of +-1 are covered by the hostile tests).
    _compare(name, _random_leaves(n, d, k, seed), _builder(_needs_negatives(name)), tile)


def _hostile(case, n=8, d=16):
    """``(base [m, d], rows of view 0, rows of view 1)``: views are ``base[rows]``."""
    g = torch.Generator().manual_seed(0)
    rows = torch.arange(n)
    if case == "identical_views":
        return torch.randn(n, d, generator=g), rows, rows
    if case == "collapsed":
        return torch.ones(1, d), torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long)
    if case == "zero_vectors":
        return torch.zeros(1, d), torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long)
    if case == "cos_plus_minus_one":
        e = torch.zeros(2, d)
        e[0, 0], e[1, 0] = 1.0, -1.0
        signs = (rows >= n // 2).long()
        return e, signs, signs
    raise AssertionError(case)


HOSTILE = ["identical_views", "collapsed", "zero_vectors", "cos_plus_minus_one"]


@pytest.mark.parametrize("case", HOSTILE)
@pytest.mark.parametrize("name", METHODS)
def test_tiled_equals_materialised_hostile(name, case):
    """Temperature 0.01 on degenerate inputs.

    Methods without a top-K selection are compared per row of each view. With a top-K, rows
    that tie exactly may be picked in a different order (``torch.topk`` itself promises no
    order among ties), so the views are built from one shared leaf and its gradient, which sums
    over identical rows and is the same whichever tied row is picked, is compared.
    """
    needs_neg, uses_top = _needs_negatives(name), LOSSES[name].top_k
    base, r0, r1 = _hostile(case)
    queue = torch.randn(6, 16, generator=torch.Generator().manual_seed(5))
    if uses_top:
        # the queue too is made of the base rows, so that every tie is between identical vectors
        rq = r0[torch.arange(6) % len(r0)]
        leaves = (base.clone().requires_grad_(),)

        def build(b):
            return b[r0], b[r1], (b[rq] if needs_neg else None)
    else:
        leaves = (base[r0].clone().requires_grad_(), base[r1].clone().requires_grad_(),
                  queue.clone().requires_grad_())

        def build(z0, z1, q):
            return z0, z1, (q if needs_neg else None)
    # Zero embeddings: F.normalize's gradient at 0 is 1/eps = 1e12 times the gradient wrt the
    # normalised vector, which for AMCL (the temperature network sees the anchors) is rounding
    # noise of ~1e-9 in both paths, so the input gradients are ~1e3 of amplified noise. There
    # only the loss, the network's gradients and finiteness are compared.
    ill_conditioned = name.startswith("amcl") and case == "zero_vectors"
    # A learned temperature's gradient is sum_j w_ij l_ij - l_pos, exactly 0 when every cosine
    # is +-1: a cancelling sum of logits of 100 at tau 0.01. The streamed weights exp(l - lse)
    # carry a relative rounding of ulp(lse) ~ 1e-5 (the materialised exp(l - max) / sum one of
    # ~1e-7), so the tiled path returns ~4e-4 of noise there and the materialised ~1e-5; both
    # are noise around 0. On random inputs (test_tiled_equals_materialised) it is compared.
    degenerate_temperature = name.startswith("learnable") and case in ("collapsed",
                                                                       "cos_plus_minus_one")
    _compare(name, leaves, build, tile=3, temperature=0.01, input_grads=not ill_conditioned,
             parameter_grads=not degenerate_temperature)


@pytest.mark.parametrize("with_soft_targets", [False, True])
def test_gradcheck_streamed_row_statistics(with_soft_targets):
    """The recomputing backward of lse_neg and of the soft-target sum, in float64, with a
    positive and a self column masked per row and tiles that do not divide the shapes."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(7, 3, generator=g, dtype=torch.float64).requires_grad_()
    k = torch.randn(9, 3, generator=g, dtype=torch.float64).requires_grad_()
    pos_idx, self_idx = torch.arange(7) + 2, torch.arange(7)
    spec = None
    if with_soft_targets:
        pk = torch.nn.functional.normalize(torch.randn(7, 3, generator=g, dtype=torch.float64), dim=1)
        spec = _TileTargets(pk, 0.5, torch.rand(7, generator=g, dtype=torch.float64),
                            torch.rand(7, generator=g, dtype=torch.float64) * 3)

    def f(a, k):
        lse, sum_ul, _ = streamed_row_stats(a, k, 4, (pos_idx, self_idx), spec)
        return lse, sum_ul

    if with_soft_targets:
        # the targets depend on the keys and are detached by design (ASCL's stop-gradient),
        # so the numerical Jacobian is taken wrt the anchors only
        k = k.detach()
    assert torch.autograd.gradcheck(f, (a, k), eps=1e-6, atol=1e-6)


class _FixedBias:
    """A detached bias that does not depend on the inputs (a TileBias), with -inf entries."""

    def __init__(self, matrix):
        self.matrix = matrix

    def tile(self, r0, r1, keys, masks, c0, c1):
        return self.matrix[r0:r1, c0:c1].clone()


@pytest.mark.parametrize("with_term", [False, True])
@pytest.mark.parametrize("with_weights", [False, True])
def test_gradcheck_streamed_row_statistics_with_a_bias_and_a_term(with_weights, with_term):
    """The recomputing backward with a detached bias in the log-sum-exp (the hardness term; one
    entry -inf) and an elementwise term (DySTreSS's s / tau(s), differentiable), in float64."""
    from adaptcl.plugins.dystress import _PairTemperatureTerm

    g = torch.Generator().manual_seed(1)
    a = torch.nn.functional.normalize(torch.randn(7, 3, generator=g, dtype=torch.float64), dim=1)
    k = torch.nn.functional.normalize(torch.randn(9, 3, generator=g, dtype=torch.float64), dim=1)
    a, k = a.requires_grad_(), k.requires_grad_()
    bias = torch.randn(7, 9, generator=g, dtype=torch.float64)
    bias[3, 5] = float("-inf")
    masks = (torch.arange(7) + 2, torch.arange(7))
    weights = _FixedBias(torch.rand(7, 9, generator=g, dtype=torch.float64)) if with_weights else None
    term = _PairTemperatureTerm(0.1, 0.3, "cosine", 0.4, 0.7, detach=False) if with_term else None

    def f(a, k):
        lse, sum_ul, _ = streamed_row_stats(a, k, 4, masks, weights, bias=_FixedBias(bias),
                                            term=term)
        return lse, sum_ul

    assert torch.autograd.gradcheck(f, (a, k), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("make", [
    lambda: MACLLoss(0.1, 0.5, adaptive=False, reweight=False, tile_size=2),
    lambda: AMCLLoss(PairTemperature(4, iota=2.0), beta=0.1, negative_term="softmax", tile_size=2),
    lambda: AMCLLoss(PairTemperature(4, iota=2.0), beta=0.1, negative_term="softmax",
                     objective="infonce", form="cross_view", tile_size=3),
    lambda: AMCLLoss(PairTemperature(4, iota=2.0), beta=0.1, negative_term="topk", kappa=2, tile_size=2),
], ids=["infonce", "amcl_softmax", "amcl_softmax_infonce", "amcl_topk"])
def test_gradcheck_float64(make):
    """End to end where nothing is detached (MACL's tau and V and ASCL's labels are, so a
    numerical Jacobian would see through them; their backward is covered above)."""
    torch.manual_seed(0)
    fn = make().double()
    z0, z1, neg = _random_leaves(5, 4, 4, seed=1, dtype=torch.float64)
    params = list(fn.parameters())

    def f(a, b, q, *ps):
        return fn(a, b, None)

    assert torch.autograd.gradcheck(f, (z0, z1, neg, *params), eps=1e-6, atol=1e-5)


class _LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("name", ["macl", "dual", "ascl_in_batch", "ahcl_in_batch",
                                  "amcl_softmax_infonce", "amcl_topk", "dystress",
                                  "dystress_exact", "infonce_hardness", "ascl_hardness"])
def test_no_tensor_of_the_matrix_size(name):
    """Forward and backward never create a tensor larger than a tile or linear in the batch
    (the [2N, D] inputs; the [2N, K, D] gathered top-K pairs, K = 2 here)."""
    n, d, tile = 96, 4, 8
    make, needs_neg = _make(name, d), _needs_negatives(name)
    z0, z1, neg = _random_leaves(n, d, 8, seed=0)
    fn = make(tile)
    rows = 2 * n
    with _LargestTensor() as probe:
        fn(z0, z1, neg if needs_neg else None).backward()
    assert probe.largest <= max(tile * tile, rows * d * 2), probe.largest
    with _LargestTensor() as full:
        make(None)(z0, z1, neg if needs_neg else None).backward()
    assert full.largest >= n * n  # the materialised path does hold the matrix


def test_functional_forms_take_tile_size():
    z0, z1, _ = _random_leaves(9, 8, 1, seed=2)
    torch.testing.assert_close(info_nce(z0, z1, 0.2, tile_size=4), info_nce(z0, z1, 0.2), **TOL)
    torch.testing.assert_close(dcl(z0, z1, 0.2, tile_size=4, form="cross_view"),
                               dcl(z0, z1, 0.2, form="cross_view"), **TOL)


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-3, ValueError), (1.5, TypeError),
                                        (True, TypeError), ("8", ValueError),
                                        ("Auto", ValueError)])
def test_tile_size_validation(bad, error):
    with pytest.raises(error, match="tile_size"):
        InfoNCELoss(0.1, tile_size=bad)
    with pytest.raises(error, match="tile_size"):
        MACLLoss(0.1, tile_size=bad)
    with pytest.raises(error, match="tile_size"):
        ASCLLoss(0.1, tile_size=bad)
    with pytest.raises(error, match="tile_size"):
        AMCLLoss(PairTemperature(4), tile_size=bad)


def test_amcl_with_an_untileable_temperature_network_raises():
    class Learned(torch.nn.Module):
        def forward(self, a, b):
            return torch.sigmoid(a @ b.T) + 0.05

        def pairwise(self, a, b):
            return torch.sigmoid((a * b).sum(1)) + 0.05

    with pytest.raises(ValueError, match="cannot be tiled"):
        AMCLLoss(Learned(), tile_size=16)
    AMCLLoss(Learned())  # fine without tiling


def test_ascl_num_neighbors_larger_than_negatives_raises_when_tiled():
    z0, z1, neg = _random_leaves(4, 8, 2, seed=0)
    with pytest.raises(ValueError, match="num_neighbors"):
        ASCLLoss(0.1, 0.05, 3, tile_size=2)(z0, z1, neg)


def test_default_is_auto_and_repr_shows_tiles():
    assert InfoNCELoss(0.1).tile_size == "auto"
    assert "tile_size=128" in repr(MACLLoss(0.1, tile_size=128))


def _tied_views():
    """Keys with exactly tied similarities: z1 repeats e1 in rows 1, 2 and 4, and every anchor
    leans towards e1, so its top negative is a three-way tie (dot products with basis vectors
    are exact in any summation order, so the tie is exact in both paths)."""
    g = torch.Generator().manual_seed(7)
    eye = torch.eye(8)
    z1 = eye[[0, 1, 1, 2, 1, 3]].clone()
    z0 = torch.rand(6, 8, generator=g) * 0.1
    z0[:, 1] += 1.0
    return z0.requires_grad_(), z1.requires_grad_()


@pytest.mark.parametrize("kappa,objective", [(1, "nt_xent"), (2, "nt_xent"), (2, "infonce")])
@pytest.mark.parametrize("tile", [1, 2, 4])
def test_amcl_topk_routes_tied_gradients_identically_when_tiled(kappa, objective, tile):
    def run(tile_size):
        torch.manual_seed(3)
        fn = AMCLLoss(PairTemperature(8), 1e-2, negative_term="topk", kappa=kappa, objective=objective,
                      form="cross_view", tile_size=tile_size)
        z0, z1 = _tied_views()
        loss = fn(z0, z1)
        return loss, torch.autograd.grad(loss, (z0, z1, *fn.parameters()))

    ref_loss, ref_grads = run(None)
    til_loss, til_grads = run(tile)
    torch.testing.assert_close(til_loss, ref_loss, **TOL)
    for a, b in zip(til_grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_amcl_topk_tie_goes_to_the_lowest_column():
    """Anchor 0 (positive e0) ties between the e1 keys in columns 1, 2 and 4: kappa=1 picks
    column 1, so keys 2 and 4 get no gradient from it (anchors 1, 2, 4 have their own e1 as
    positive and pick another e1 row: the lowest one that is not their positive)."""
    torch.manual_seed(3)
    z0, z1 = _tied_views()
    z0 = z0.detach()[:1].requires_grad_()
    keys = z1.detach()
    fn = AMCLLoss(ConstantTemperature(0.1), 0.0, negative_term="topk", kappa=1, form="cross_view")
    # one anchor, its positive key 0, the other five keys as extra negatives
    leaf = keys[1:].clone().requires_grad_()
    loss = fn(z0, keys[:1], negatives=leaf)
    (g,) = torch.autograd.grad(loss, leaf)
    assert g[0].abs().sum() > 0
    assert torch.equal(g[1], torch.zeros(8)) and torch.equal(g[3], torch.zeros(8))


@pytest.mark.parametrize("k", [1, 3, 9, 12])
def test_top_columns_breaks_ties_by_lowest_column_whatever_the_tiling(k):
    """Integer-valued rows full of ties and some masked (-inf) columns: the merged top-k over
    any tiling is the top-k of the whole row, ties going to the lowest columns (k = 9 and 12
    exercise the threshold method beyond the argmax rounds)."""
    from adaptcl.plugins.tiles._loop import merge_top, top_columns

    g = torch.Generator().manual_seed(k)
    values = torch.randint(0, 4, (5, 17), generator=g).float()
    values[:, ::5] = float("-inf")
    columns = torch.arange(17).expand(5, -1)
    whole_v, whole_i = top_columns(values, columns, k)
    for row in range(5):
        finite = [(-v, c) for c, v in enumerate(values[row].tolist()) if v != float("-inf")]
        expected = sorted(c for _, c in sorted(finite)[:k])
        assert whole_i[row].tolist() == expected
    for tile in (1, 2, 5, 17):
        best = None
        for c0 in range(0, 17, tile):
            best = merge_top(best, values[:, c0:c0 + tile], c0, k)
        assert torch.equal(best[1], whole_i) and torch.equal(best[0], whole_v)
