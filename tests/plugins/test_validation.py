"""Bad input gets a clear ValueError / TypeError naming the argument."""

from __future__ import annotations

import pytest
import torch

from adaptcl.plugins import (
    AMCLLoss,
    ASCLLoss,
    ConstantTemperature,
    InfoNCELoss,
    MACLLoss,
    PairTemperature,
)

from ._helpers import LOSSES, names

# Every loss of the shared table that takes the shared keywords (passed through ``build``).
EVERY_LOSS = names(shared=True)


def _make(name, **kw):
    return LOSSES[name].build(**kw)


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"temperature": 0.0}, ValueError, "temperature"),
    ({"temperature": -0.1}, ValueError, "temperature"),
    ({"temperature": float("nan")}, ValueError, "temperature"),
    ({"temperature": "0.1"}, TypeError, "temperature"),
    ({"alpha": -1.0}, ValueError, "alpha"),
    ({"alpha": 0.0, "temperature_form": "exp"}, ValueError, "alpha"),
    ({"temperature_form": "cubic"}, ValueError, "temperature_form"),
    ({"weight_form": "square"}, ValueError, "weight_form"),
    ({"min_temperature": 0.0}, ValueError, "min_temperature"),
    ({"form": "simclr"}, ValueError, "form"),
    ({"positive_in_denominator": False}, ValueError, "reweight"),
])
def test_macl_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        MACLLoss(**kwargs)


def test_papers_settings_are_accepted():
    MACLLoss(0.05, alpha=2.0, a0=0.8, reweight=False)  # SimCSE: alpha is not capped at 1
    MACLLoss(0.15, 0.5, 0.2, form="queue")  # MoCo
    MACLLoss(0.2, 0.5, 0.0, reweight=False, form="cross_view", positive_in_denominator=False)


@pytest.mark.parametrize("z0,z1,exc,match", [
    (torch.randn(4, 8), torch.randn(5, 8), ValueError, "same shape"),
    (torch.randn(4, 8), torch.randn(4, 9), ValueError, "same shape"),
    (torch.randn(4, 8, 2), torch.randn(4, 8, 2), ValueError, "z0 must have shape"),
    (torch.randint(0, 3, (4, 8)), torch.randn(4, 8), TypeError, "z0 must be a floating-point"),
    ([[1.0]], torch.randn(1, 1), TypeError, "z0 must be a torch.Tensor"),
    (torch.full((4, 8), float("nan")), torch.randn(4, 8), ValueError, "z0 contains NaN"),
    (torch.randn(4, 8), torch.full((4, 8), float("inf")), ValueError, "z1 contains NaN or inf"),
    (torch.randn(4, 0), torch.randn(4, 0), ValueError, "empty feature"),
])
def test_bad_embeddings(z0, z1, exc, match):
    with pytest.raises(exc, match=match):
        MACLLoss()(z0, z1)


def test_queue_form_needs_negatives():
    with pytest.raises(ValueError, match="negatives"):
        InfoNCELoss(form="queue")(torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(ValueError, match="negatives has feature dimension"):
        InfoNCELoss(form="queue")(torch.randn(4, 8), torch.randn(4, 8), torch.randn(10, 7))


def test_kappa_larger_than_candidates():
    fn = AMCLLoss(ConstantTemperature(0.1), negative_term="topk", kappa=10, form="cross_view")
    with pytest.raises(ValueError, match="kappa=10"):
        fn(torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(ValueError, match="kappa"):
        AMCLLoss(ConstantTemperature(0.1), kappa=0)


def test_ascl_neighbours_larger_than_negatives():
    with pytest.raises(ValueError, match="num_neighbors=5"):
        ASCLLoss(num_neighbors=5, form="cross_view")(torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(ValueError, match="form"):
        ASCLLoss(form="nt_xent")
    with pytest.raises(ValueError, match="mode"):
        ASCLLoss(mode="soft")


def test_amcl_argument_checks():
    with pytest.raises(TypeError, match="temperature_net"):
        AMCLLoss(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="beta"):
        AMCLLoss(PairTemperature(4), beta=-1.0)
    with pytest.raises(ValueError, match="eta"):
        PairTemperature(4, eta=0.0)
    with pytest.raises(ValueError, match="heads"):
        AMCLLoss(PairTemperature(4))(torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4))


@pytest.mark.parametrize("name", EVERY_LOSS)
@pytest.mark.parametrize("kwargs,match", [
    ({"gather_distributed": "yes"}, "gather_distributed must be a bool"),
    ({"gather_distributed": 1}, "gather_distributed must be a bool"),
    ({"gather_fn": "all_gather"}, "gather_fn must be callable"),
    ({"check_finite": "no"}, "check_finite must be a bool"),
    ({"tile_size": 2.5}, "tile_size must be an int"),
])
def test_shared_keywords_rejected_the_same_way_by_every_loss(name, kwargs, match):
    with pytest.raises(TypeError, match=match):
        _make(name, **kwargs)


@pytest.mark.parametrize("name", EVERY_LOSS)
def test_zero_tile_size_rejected_by_every_loss(name):
    with pytest.raises(ValueError, match="tile_size must be an int >= 1, .auto. or None, got 0"):
        _make(name, tile_size=0)


@pytest.mark.parametrize("name", EVERY_LOSS)
def test_float64_float32_mix_accepted_by_every_loss_as_float64(name):
    """A float64 input promotes the whole computation to float64, whichever argument it is."""
    x = [t.detach() for t in LOSSES[name].inputs(seed=3, dtype=torch.float64)]
    all64 = _make(name)(*x)
    for i in range(len(x)):  # each input in float32 in turn
        mixed_inputs = list(x)
        mixed_inputs[i] = x[i].float()
        mixed = _make(name)(*mixed_inputs)
        assert mixed.dtype == torch.float64
        torch.testing.assert_close(mixed, all64, rtol=1e-6, atol=1e-6)


def test_float64_negatives_promote_a_float32_batch():
    z0, z1 = torch.randn(4, 8), torch.randn(4, 8)
    queue = torch.randn(10, 8, dtype=torch.float64)
    for loss_fn in (InfoNCELoss(form="queue"), ASCLLoss(form="queue"), MACLLoss(form="queue")):
        assert loss_fn(z0, z1, negatives=queue).dtype == torch.float64


@pytest.mark.parametrize("name", EVERY_LOSS)
def test_check_finite_off_skips_the_nan_check_for_every_loss(name):
    x = [t.detach() for t in LOSSES[name].inputs(4)]
    x[0] = torch.full_like(x[0], float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        _make(name)(*x)
    _make(name, check_finite=False)(*x)  # no check, no exception: NaN out
