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


class _DeviceRecorder(torch.nn.Module):
    """A backbone that records the device of every batch it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3 * 4 * 4, 8)
        self.seen: list[str] = []

    def forward(self, images):
        self.seen.append(images.device.type)
        return self.linear(images.flatten(1))


def test_backbone_features_run_on_the_device_given_not_the_modules():
    """Lightning's teardown leaves a trained module on the CPU: the features are computed on
    the device the caller names (``meta`` here, standing for CUDA), the backbone moved there."""
    from adaptcl.evaluation.images import backbone_features

    images, labels = torch.randn(6, 3, 4, 4), torch.arange(6) % 2
    loader = [(images[:4], labels[:4]), (images[4:], labels[4:])]
    backbone = _DeviceRecorder()  # on the CPU, as after fit
    train_x, train_y, test_x, test_y = backbone_features(backbone, loader, loader[:1], "meta")
    assert backbone.seen == ["meta"] * 3
    assert {p.device.type for p in backbone.parameters()} == {"meta"}
    assert {t.device.type for t in (train_x, train_y, test_x, test_y)} == {"meta"}
    assert train_x.shape == (6, 8) and test_y.shape == (4,)

