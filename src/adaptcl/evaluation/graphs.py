"""Evaluation of graph embeddings: the SVM of ``tu``, the multi-task ROC-AUC of ``moleculenet``.

:func:`masked_bce_loss` and :func:`multitask_roc_auc` are Hu et al.'s (ICLR 2020) multi-task
fine-tuning loss and metric, used by ``moleculenet``. The rest of this page is the SVM
evaluation of frozen graph embeddings (the protocol of InfoGraph and GraphCL).

GraphCL (You et al., NeurIPS 2020; code ``unsupervised_TU/evaluate_embedding.py``) feeds the
graph embeddings to an RBF ``sklearn.svm.SVC`` under 10-fold stratified cross-validation; in
each outer fold ``C`` is picked from ``{1e-3, ..., 1e3}`` by an inner 5-fold grid search on
the training part, and the mean test accuracy over the folds is reported.

Differences you can switch:

* ``cv_seed=None`` reproduces GraphCL exactly: the outer folds are shuffled without a seed
  (``random_state=None``), so the splits differ between runs and between the losses being
  compared. An integer (the default in the recipes) fixes the splits, so two losses are
  compared on the same folds and a rerun gives the same number.
* ``classifier="linear"`` uses ``LinearSVC`` (a linear kernel; faster on large sets, and a
  probe of linear separability) instead of the RBF ``SVC``.
* ``standardize=True`` puts a ``StandardScaler`` (fitted on each training part) in front of
  the classifier. GraphCL does not scale; sum-pooled embeddings can be large.

GraphCL also computes a "validation" accuracy on a resampled split that it never uses when
only the SVC is evaluated; it is not computed here.

Example::

    res = svm_cv_accuracy(embeddings, labels, cv_seed=0)
    res["accuracy"], res["fold_accuracies"], res["best_C"]
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

C_GRID: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3)
CLASSIFIERS = ("svc", "linear")


def _make_classifier(classifier: str, standardize: bool, C: float = 1.0):
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC, LinearSVC

    if classifier == "svc":
        clf = SVC(C=C)
    elif classifier == "linear":
        clf = LinearSVC(C=C, max_iter=5000)
    else:
        raise ValueError(f"classifier must be one of {CLASSIFIERS}, got {classifier!r}")
    return make_pipeline(StandardScaler(), clf) if standardize else clf


def svm_cv_accuracy(x: Any, y: Any, *, folds: int = 10, inner_folds: int = 5,
                    c_grid: Sequence[float] = C_GRID, classifier: str = "svc",
                    cv_seed: int | None = 0, standardize: bool = False, search: bool = True,
                    n_jobs: int | None = 1) -> dict[str, Any]:
    """Stratified ``folds``-fold CV accuracy of an SVM with an inner grid search over ``C``.

    Args:
        x: ``[n, d]`` embeddings (numpy array or tensor). y: ``[n]`` labels (any hashable).
        folds / inner_folds: outer and inner (grid-search) fold counts (GraphCL: 10 / 5).
        c_grid: values of ``C`` searched. classifier: ``"svc"`` (RBF, GraphCL) or
            ``"linear"``. cv_seed: seed of the outer and inner splits, or ``None`` for
            GraphCL's unseeded outer shuffle. standardize: scale features per training part.
        search: ``False`` uses ``C=10`` without a grid, GraphCL's ``search=False`` branch.

    Returns a dict with ``accuracy`` (mean over folds, in [0, 1]), ``std``,
    ``fold_accuracies``, ``best_C`` (per fold) and the settings used.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.model_selection import GridSearchCV, StratifiedKFold
    from sklearn.preprocessing import LabelEncoder

    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    x = np.asarray(x, dtype=np.float64)
    y = LabelEncoder().fit_transform(np.asarray(y).reshape(-1))
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"x must be [n, d] matching y [n]; got {x.shape} and {y.shape}")
    if folds < 2 or inner_folds < 2:
        raise ValueError("folds and inner_folds must be >= 2")
    if not np.isfinite(x).all():
        raise ValueError("embeddings contain NaN or inf")

    outer = StratifiedKFold(n_splits=folds, shuffle=True, random_state=cv_seed)
    accuracies: list[float] = []
    best_c: list[float] = []
    param = "linearsvc__C" if classifier == "linear" else "svc__C"
    for train_idx, test_idx in outer.split(x, y):
        base = _make_classifier(classifier, standardize, C=10.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            if search:
                key = param if standardize else "C"
                inner = StratifiedKFold(n_splits=inner_folds, shuffle=True,
                                        random_state=cv_seed) if cv_seed is not None else inner_folds
                model = GridSearchCV(base, {key: list(c_grid)}, cv=inner, scoring="accuracy",
                                     n_jobs=n_jobs)
                model.fit(x[train_idx], y[train_idx])
                best_c.append(float(model.best_params_[key]))
            else:
                model = base
                model.fit(x[train_idx], y[train_idx])
                best_c.append(10.0)
        accuracies.append(float((model.predict(x[test_idx]) == y[test_idx]).mean()))
    acc = np.asarray(accuracies)
    return {
        "accuracy": float(acc.mean()),
        "std": float(acc.std()),
        "fold_accuracies": accuracies,
        "best_C": best_c,
        "folds": folds,
        "inner_folds": inner_folds,
        "classifier": classifier,
        "standardize": standardize,
        "cv_seed": cv_seed,
        "c_grid": list(c_grid),
    }


def masked_bce_loss(logits, y):
    """Multi-task BCE over the present labels only (Hu et al.'s fine-tuning loss).

    ``y`` holds 0/1 with ``NaN`` where a label is missing; the loss is the mean of
    ``BCEWithLogits(logits, y)`` over the present entries (0 with a zero gradient when a batch
    has none).
    """
    import torch
    import torch.nn.functional as F

    y = y.to(logits.dtype).view_as(logits)
    mask = ~torch.isnan(y)
    target = torch.where(mask, y, torch.zeros_like(y))
    per_entry = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    per_entry = torch.where(mask, per_entry, torch.zeros_like(per_entry))
    return per_entry.sum() / mask.sum().clamp(min=1)


def multitask_roc_auc(y_true, scores) -> dict[str, Any]:
    """ROC-AUC per task and its mean over the tasks whose labels hold both classes.

    ``y_true`` [N, T] 0/1 with ``NaN`` = missing, ``scores`` [N, T]. Tasks with a single class
    among the present labels are skipped (Hu et al.'s ``eval``); ``num_skipped`` counts them.
    ``mean`` is NaN when every task is skipped.
    """
    import numpy as np
    from sklearn.metrics import roc_auc_score

    y = np.asarray(y_true, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    if y.ndim == 1:
        y, s = y[:, None], s[:, None]
    if y.shape != s.shape:
        raise ValueError(f"labels {y.shape} and scores {s.shape} differ")
    per_task: list[float | None] = []
    for t in range(y.shape[1]):
        labels = y[~np.isnan(y[:, t]), t]
        if labels.size == 0 or labels.min() == labels.max():
            per_task.append(None)
            continue
        per_task.append(float(roc_auc_score(labels, s[~np.isnan(y[:, t]), t])))
    valid = [v for v in per_task if v is not None]
    return {"mean": float(np.mean(valid)) if valid else math.nan, "per_task": per_task,
            "num_tasks": int(y.shape[1]), "num_evaluated": len(valid),
            "num_skipped": int(y.shape[1] - len(valid))}
