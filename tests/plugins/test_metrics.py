"""Metrics against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from adaptcl.plugins import (
    alignment,
    alignment_magnitude,
    gradient_scaling_factor,
    semantic_sensitivity,
    tolerance,
    uniformity,
    w_statistics,
)


def test_alignment_and_magnitude_relation():
    torch.manual_seed(0)
    z0, z1 = torch.randn(20, 5), torch.randn(20, 5)
    # A = 1 - L_align / 2 on the sphere (MACL Eq. 6)
    assert alignment_magnitude(z0, z1).item() == pytest.approx(1 - alignment(z0, z1).item() / 2, abs=1e-6)
    assert alignment(z0, z0).item() == pytest.approx(0.0, abs=1e-6)


def test_uniformity_of_antipodal_points():
    z = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    # one pair at squared distance 4: log exp(-2 * 4) = -8
    assert uniformity(z).item() == pytest.approx(-8.0, abs=1e-5)
    collapsed = torch.ones(10, 3)
    assert uniformity(collapsed).item() == pytest.approx(0.0, abs=1e-6)


def test_tolerance_and_semantic_sensitivity():
    z = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    labels = torch.tensor([0, 0, 1, 1])
    # same-class distinct pairs: (0,1) cos 1 twice, (2,3) cos 0 twice; 12 distinct ordered pairs
    assert tolerance(z, labels).item() == pytest.approx(2 / 12)
    cos = torch.nn.functional.normalize(z, dim=1) @ torch.nn.functional.normalize(z, dim=1).T
    h = (labels[:, None] == labels[None, :]).float() * 2 - 1
    assert semantic_sensitivity(z, z, labels).item() == pytest.approx(torch.exp(-(h - cos) ** 2).mean().item())
    perfect = torch.tensor([[1.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0]])
    assert semantic_sensitivity(perfect, perfect, labels).item() == pytest.approx(1.0)


def test_gradient_scaling_factor_extreme_case_of_figure_2():
    # positive similarity 1 and negatives -1 (MACL Fig. 2): W = K e^{-1/t} / (e^{1/t} + K e^{-1/t})
    e = torch.zeros(4, 4)
    e[0, 0] = 1.0
    e[1:, 0] = -1.0
    z0 = torch.cat([e[:1], e[1:2]])  # anchor (1,0,..) and a negative (-1,0,..)
    w = gradient_scaling_factor(z0, z0, 0.5)
    k = 1
    expected = k * math.exp(-2) / (math.exp(2) + k * math.exp(-2))
    assert w[0].item() == pytest.approx(expected, rel=1e-5)
    stats = w_statistics(w)
    assert set(stats) == {"mean", "std", "min", "max", "frac_below_half"}


def test_metric_argument_checks():
    with pytest.raises(ValueError, match="labels"):
        tolerance(torch.randn(4, 3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="at least 2"):
        uniformity(torch.randn(1, 3))
    with pytest.raises(ValueError, match="t must be"):
        uniformity(torch.randn(4, 3), t=0.0)
