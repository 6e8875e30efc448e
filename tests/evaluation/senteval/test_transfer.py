"""SentEval's transfer protocol: the logistic-regression probe, its validation, the parameter sets,
MRPC's features and SentEval's sample order (the folds)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

from adaptcl.evaluation.senteval import transfer as te
from adaptcl.evaluation.senteval.data import load_binary


def _blobs(n=240, dim=8, seed=0, shift=2.5):
    rng = np.random.RandomState(seed)
    y = np.arange(n) % 2
    X = rng.randn(n, dim).astype(np.float32)
    X[:, 0] += np.where(y == 1, shift, -shift)
    return X, y.astype(np.int64)


def test_senteval_logreg_learns_is_seeded_and_leaves_global_rng_alone():
    X, y = _blobs()
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    np_state = np.random.get_state()[1].copy()
    a = te.SentEvalLogReg(8, 2, l2reg=1e-4, seed=1111, optim="adam", batch_size=64)
    best = a.fit(X[:200], y[:200], validation_data=(X[200:], y[200:]))
    assert best == pytest.approx(a.score(X[200:], y[200:]))  # the best model is kept
    assert a.score(X[200:], y[200:]) > 0.9
    assert torch.equal(torch.random.get_rng_state(), state)  # SentEval reseeds; we fork the RNG
    assert np.array_equal(np.random.get_state()[1], np_state)
    b = te.SentEvalLogReg(8, 2, l2reg=1e-4, seed=1111, optim="adam", batch_size=64)
    b.fit(X[:200], y[:200], validation_data=(X[200:], y[200:]))
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)  # same seed, same data -> identical weights
    c = te.SentEvalLogReg(8, 2, seed=7)
    assert not torch.equal(c.model[0].weight, te.SentEvalLogReg(8, 2, seed=1111).model[0].weight)


def test_early_stopping_follows_senteval_loop():
    X, y = _blobs(n=120)
    clf = te.SentEvalLogReg(8, 2, optim="rmsprop", batch_size=128, tenacity=3, epoch_size=2,
                            max_epoch=200)
    clf.fit(X, y, validation_split=0.05)
    # the 6-sample hold-out can improve at most 6 times; SentEval's stale counter is never reset,
    # so training stops after at most 6 + tenacity + 2 evaluations of epoch_size passes each
    assert 2 <= clf.nepoch <= 2 * (6 + 3 + 2)
    # without early stopping the loop runs while nepoch <= max_epoch: evaluations at 2, 4, 6
    clf = te.SentEvalLogReg(8, 2, optim="rmsprop", epoch_size=2, max_epoch=4)
    clf.fit(X, y, validation_split=0.05, early_stop=False)
    assert clf.nepoch == 6
    with pytest.raises(ValueError, match="validation"):
        clf.fit(X, y)
    with pytest.raises(ValueError, match="optim='lbfgs'"):
        te.SentEvalLogReg(8, 2, optim="lbfgs")


def test_inner_kfold_matches_senteval_protocol_with_sklearn():
    """Nested CV: StratifiedKFold(shuffle, 1111) outside and inside, SentEval's C grid, 2-decimal
    rounding, first best C; checked against a direct re-derivation."""
    X, y = _blobs(n=120, shift=0.6, seed=3)
    probe = te.Probe(classifier="sklearn", params="fasttest", kfold=3)
    got = te.inner_kfold_classifier(X, y, 2, probe)
    skf = StratifiedKFold(n_splits=3, shuffle=True, random_state=1111)
    dev, test, regs = [], [], [2.0**t for t in range(-2, 4)]
    for tr_idx, te_idx in skf.split(X, y):
        scores = []
        for reg in regs:
            inner = [LogisticRegression(C=reg, random_state=1111, max_iter=1000)
                     .fit(X[tr_idx][a], y[tr_idx][a]).score(X[tr_idx][b], y[tr_idx][b])
                     for a, b in skf.split(X[tr_idx], y[tr_idx])]
            scores.append(round(100 * np.mean(inner), 2))
        best = int(np.argmax(scores))
        dev.append(scores[best])
        clf = LogisticRegression(C=regs[best], random_state=1111, max_iter=1000)
        test.append(round(100 * clf.fit(X[tr_idx], y[tr_idx]).score(X[te_idx], y[te_idx]), 2))
    assert got["acc"] == pytest.approx(round(np.mean(test), 2))
    assert got["devacc"] == pytest.approx(round(np.mean(dev), 2))
    assert len(got["fold_acc"]) == 3 and got["acc"] > 60


def test_kfold_and_split_classifiers_choose_from_senteval_grid():
    X, y = _blobs(n=200, seed=1)
    Xt, yt = _blobs(n=100, seed=2)
    probe = te.Probe(params="fasttest", seed=1111)
    res = te.kfold_classifier((X, y), (Xt, yt), 2, probe)
    assert res["l2reg"] in te.TORCH_REGS and res["acc"] > 80 and res["yhat"].shape == (100,)
    res = te.split_classifier({"train": X, "dev": Xt[:50], "test": Xt[50:]},
                              {"train": y, "dev": yt[:50], "test": yt[50:]}, 2, probe)
    assert res["l2reg"] in te.TORCH_REGS and res["acc"] > 80


def test_senteval_sort_order_of_binary_samples(shared_data):
    data = te._sorted_single(load_binary(shared_data, "CR"), te.Probe(), 0)
    sentences, labels = data
    assert len(sentences) == 3775
    keys = [(len(s.split()), int(label)) for s, label in zip(sentences, labels, strict=True)]
    assert keys == sorted(keys)  # SentEval's (token count, label) order fixes the folds
    assert sentences[:4] == ["", "", "", ""]  # the 4 empty lines come first, as in SentEval


def test_param_sets_and_features():
    assert te.PARAM_SETS["test"]["kfold"] == 10
    assert te.PARAM_SETS["test"]["classifier"] == {"nhid": 0, "optim": "adam", "batch_size": 64,
                                                   "tenacity": 5, "epoch_size": 4}
    assert te.PARAM_SETS["fasttest"]["kfold"] == 5
    assert te.PARAM_SETS["fasttest"]["classifier"]["optim"] == "rmsprop"
    u, v = np.ones((3, 4)), np.zeros((3, 4))
    assert te.mrpc_features(u, v).shape == (3, 8)
    assert te.mrpc_features(u, v, "full").shape == (3, 16)
    np.testing.assert_array_equal(te.mrpc_features(u, v)[:, :4], 1.0)  # |u - v| first
