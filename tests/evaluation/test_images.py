"""Image evaluation: Lightly's weighted kNN and the linear probe on frozen features."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("lightly")

from adaptcl.evaluation.images import knn_accuracy, linear_probe  # noqa: E402


def test_knn_and_linear_probe_on_separable_features():
    g = torch.Generator().manual_seed(0)
    centers = 5 * torch.randn(4, 16, generator=g)
    ytr, yte = torch.arange(400) % 4, torch.arange(100) % 4
    xtr = centers[ytr] + torch.randn(400, 16, generator=g)
    xte = centers[yte] + torch.randn(100, 16, generator=g)
    assert knn_accuracy(xtr, ytr, xte, yte, 4, k=20) > 0.95
    assert linear_probe(xtr, ytr, xte, yte, 4, epochs=20) > 0.95
    assert math.isnan(linear_probe(xtr, ytr, xte, yte, 4, epochs=0))
