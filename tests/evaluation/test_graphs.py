"""Graph evaluation: GraphCL's SVM cross-validation and Hu et al.'s masked BCE and multi-task
ROC-AUC."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")

from adaptcl.evaluation.graphs import (  # noqa: E402
    masked_bce_loss,
    multitask_roc_auc,
    svm_cv_accuracy,
)

NAN = math.nan


def blobs(n: int = 120, d: int = 6, shift: float = 3.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 2
    x = rng.normal(size=(n, d)) + shift * y[:, None]
    return x, np.where(y == 1, "a", "b")  # string labels are encoded


def test_svm_cv_protocol_on_separable_data():
    x, y = blobs()
    res = svm_cv_accuracy(x, y)
    assert res["folds"] == 10 and len(res["fold_accuracies"]) == 10 and len(res["best_C"]) == 10
    assert res["accuracy"] > 0.95
    assert set(res["best_C"]) <= set(res["c_grid"])
    again = svm_cv_accuracy(x, y)
    assert again["fold_accuracies"] == res["fold_accuracies"]  # fixed CV seed: reproducible
    lin = svm_cv_accuracy(x, y, classifier="linear", standardize=True, folds=5, inner_folds=3)
    assert lin["accuracy"] > 0.95 and len(lin["fold_accuracies"]) == 5
    unseeded = svm_cv_accuracy(x, y, cv_seed=None, search=False)
    assert unseeded["best_C"] == [10.0] * 10


def test_svm_cv_on_noise_is_near_chance_and_validates():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(100, 4)), np.arange(100) % 2
    res = svm_cv_accuracy(x, y, folds=5, inner_folds=3)
    assert 0.2 < res["accuracy"] < 0.8
    with pytest.raises(ValueError):
        svm_cv_accuracy(x, y[:50])
    with pytest.raises(ValueError):
        svm_cv_accuracy(np.full((100, 4), np.nan), y)
    with pytest.raises(ValueError):
        svm_cv_accuracy(x, y, classifier="rbf-typo")


def test_masked_bce_hand_computed():
    logits = torch.tensor([[0.0, 2.0], [-1.0, 0.0]], requires_grad=True)
    y = torch.tensor([[1.0, NAN], [0.0, 1.0]])
    loss = masked_bce_loss(logits, y)
    # present entries: BCE(0, 1) = log 2, BCE(-1, 0) = log(1 + e^-1), BCE(0, 1) = log 2
    expected = (2 * math.log(2) + math.log(1 + math.exp(-1))) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert loss.item() == pytest.approx(0.5665187, abs=1e-6)
    loss.backward()
    grad = logits.grad
    assert grad[0, 1] == 0  # a missing label gives no gradient
    # d/dz BCE = (sigmoid(z) - y) / (number of present labels)
    assert grad[0, 0].item() == pytest.approx((0.5 - 1) / 3, abs=1e-6)
    assert grad[1, 0].item() == pytest.approx(1 / (1 + math.e) / 3, abs=1e-6)
    assert torch.isfinite(grad).all()


def test_masked_bce_all_missing_is_zero_and_finite():
    logits = torch.randn(3, 2, requires_grad=True)
    loss = masked_bce_loss(logits, torch.full((3, 2), NAN))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logits.grad, torch.zeros(3, 2))


def test_multitask_roc_auc_skips_single_class_tasks_and_counts_them():
    y = np.array([[0, 1, 1], [0, 1, NAN], [1, 1, 0], [1, 1, 1]], dtype=float)
    s = np.array([[0.1, 0.3, 0.9], [0.4, 0.2, 0.0], [0.35, 0.5, 0.2], [0.8, 0.1, 0.1]])
    res = multitask_roc_auc(y, s)
    # task 0: positives {0.35, 0.8} vs negatives {0.1, 0.4}: 3 of 4 pairs ordered -> 0.75
    # task 1: only positives -> skipped; task 2 (row 1 missing): pos {0.9, 0.1} vs neg {0.2}
    assert res["per_task"][0] == pytest.approx(0.75)
    assert res["per_task"][1] is None
    assert res["per_task"][2] == pytest.approx(0.5)
    assert res["mean"] == pytest.approx(0.625)
    assert (res["num_tasks"], res["num_evaluated"], res["num_skipped"]) == (3, 2, 1)
    none = multitask_roc_auc(np.ones((4, 2)), s[:, :2])
    assert math.isnan(none["mean"]) and none["num_skipped"] == 2
    single = multitask_roc_auc(np.array([0, 1, 1.0]), np.array([0.2, 0.9, 0.7]))
    assert single["mean"] == 1.0
    with pytest.raises(ValueError):
        multitask_roc_auc(y, s[:, :2])
