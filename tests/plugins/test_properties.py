"""Invariants every loss keeps, checked with hypothesis on every loss of the shared table
(``_helpers.LOSSES``):

* permutation equivariance: permuting the pairs permutes the per-anchor losses alike;
* scale invariance: multiplying each embedding by its own positive factor changes nothing
  (every loss normalises its inputs; Barlow Twins standardises per feature instead);
* symmetric forms give the same value with the two views swapped;
* ``reduction="sum"`` is the number of per-anchor terms times ``"mean"``;
* tiled equals materialised, value and gradients, for any tile size.

Float64 inputs (and networks), so the comparisons are tight. Deterministic: hypothesis is
derandomised and every example is a seed plus a few small integers.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ._helpers import LOSSES

pytestmark = pytest.mark.usefixtures("one_thread")

D64 = torch.float64
SETTINGS = settings(max_examples=6, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])
TOL = {"rtol": 1e-9, "atol": 1e-11}

PER_ANCHOR = [name for name, case in LOSSES.items() if case.per_anchor]
SYMMETRIC = [name for name, case in LOSSES.items() if case.symmetric]
TILEABLE = [name for name, case in LOSSES.items() if case.tileable]
SCALE_FREE = [name for name in LOSSES if name != "amcl_barlow_twins"]


def _build(name, **kw):
    loss_fn = LOSSES[name].build(**kw)
    return loss_fn.double() if any(True for _ in loss_fn.parameters()) else loss_fn


def _inputs(name, n, seed):
    return LOSSES[name].inputs(n, seed=seed, dtype=D64)


def _per_anchor(name, x):
    return _build(name, reduction="none")(*x)


@pytest.mark.parametrize("name", list(LOSSES))
@SETTINGS
@given(data=st.data(), n=st.integers(2, 6), seed=st.integers(0, 2**16))
def test_permuting_pairs_permutes_per_anchor_losses(name, data, n, seed):
    perm = torch.tensor(data.draw(st.permutations(range(n))))
    x = _inputs(name, n, seed)
    # the pairs' rows move together; a queue of negatives is not a set of pairs
    moved = tuple(t[perm] if i < 2 or LOSSES[name].kind in ("simsiam",) else t
                  for i, t in enumerate(x))
    if not LOSSES[name].per_anchor:
        torch.testing.assert_close(_build(name)(*moved), _build(name)(*x), **TOL)
        return
    before, after = _per_anchor(name, x), _per_anchor(name, moved)
    blocks = before.shape[0] // n  # one block of N per direction (NT-Xent: z0's, then z1's)
    torch.testing.assert_close(after, before.view(blocks, n)[:, perm].reshape(-1), **TOL)


@pytest.mark.parametrize("name", SCALE_FREE)
@SETTINGS
@given(n=st.integers(2, 6), seed=st.integers(0, 2**16),
       log_scale=st.floats(-5.0, 5.0, allow_nan=False))
def test_invariant_to_the_scale_of_each_embedding(name, n, seed, log_scale):
    x = _inputs(name, n, seed)
    g = torch.Generator().manual_seed(seed + 1)
    scaled = tuple((t * torch.exp(log_scale + torch.rand(t.shape[0], 1, generator=g,
                                                            dtype=D64))).detach()
                   for t in x)
    torch.testing.assert_close(_build(name)(*scaled), _build(name)(*x), **TOL)


def _swap(name, x):
    if LOSSES[name].kind == "simsiam":  # (p0, p1, z0, z1) -> (p1, p0, z1, z0)
        return (x[1], x[0], x[3], x[2])
    return (x[1], x[0], *x[2:])


@pytest.mark.parametrize("name", SYMMETRIC)
@SETTINGS
@given(n=st.integers(2, 6), seed=st.integers(0, 2**16))
def test_symmetric_forms_equal_under_swapped_views(name, n, seed):
    x = _inputs(name, n, seed)
    torch.testing.assert_close(_build(name)(*_swap(name, x)), _build(name)(*x), **TOL)


@pytest.mark.parametrize("name", PER_ANCHOR)
@SETTINGS
@given(n=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_sum_is_count_times_mean(name, n, seed):
    if LOSSES[name].kind == "simsiam" or name.startswith("amcl_topk"):
        n = max(n, 2)  # top-kappa needs kappa negatives
    x = _inputs(name, n, seed)
    count = _per_anchor(name, x).shape[0]
    total = _build(name, reduction="sum")(*x)
    torch.testing.assert_close(total, count * _build(name, reduction="mean")(*x), **TOL)


def _value_and_grads(loss_fn, x):
    loss = loss_fn(*x)
    params = [*x, *loss_fn.parameters()]
    grads = torch.autograd.grad(loss, params, allow_unused=True, materialize_grads=True)
    return loss, grads, dict(loss_fn.last_stats)


@pytest.mark.parametrize("name", TILEABLE)
@SETTINGS
@given(n=st.integers(2, 6), seed=st.integers(0, 2**16), data=st.data())
def test_tiled_equals_materialised_for_any_tile_size(name, n, seed, data):
    x = _inputs(name, n, seed)
    tile = data.draw(st.integers(1, 2 * n + 6), label="tile_size")
    ref = _value_and_grads(_build(name), x)
    til = _value_and_grads(_build(name, tile_size=tile), x)
    torch.testing.assert_close(til[0], ref[0], **TOL)
    for a, b in zip(til[1], ref[1], strict=True):
        torch.testing.assert_close(a, b, **TOL)
    for key, value in ref[2].items():
        torch.testing.assert_close(til[2][key], value, **TOL, msg=f"{name}: stat {key}")
