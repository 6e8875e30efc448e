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


def test_batch_of_one_without_negatives():
    with pytest.raises(ValueError, match="no negatives"):
        InfoNCELoss(form="cross_view")(torch.randn(1, 8), torch.randn(1, 8))
    # nt_xent with one pair still has the other view... of itself only: no negatives either
    with pytest.raises(ValueError, match="no negatives"):
        MACLLoss()(torch.randn(1, 8), torch.randn(1, 8))
    # ...but explicit negatives make it valid
    assert torch.isfinite(InfoNCELoss(form="cross_view")(torch.randn(1, 8), torch.randn(1, 8),
                                                          negatives=torch.randn(3, 8)))


def test_queue_form_needs_negatives():
    with pytest.raises(ValueError, match="negatives"):
        InfoNCELoss(form="queue")(torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(ValueError, match="negatives has feature dimension"):
        InfoNCELoss(form="queue")(torch.randn(4, 8), torch.randn(4, 8), torch.randn(10, 7))


def test_kappa_larger_than_candidates():
    fn = AMCLLoss(ConstantTemperature(0.1), kappa=10, form="cross_view")
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
