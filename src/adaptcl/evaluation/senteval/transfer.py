"""SentEval's transfer protocol: the logistic-regression probe, its validation and the tasks.

MR, CR, SUBJ, MPQA, SST2, TREC and MRPC are evaluated with a logistic-regression probe trained the
way SentEval does it (Conneau & Kiela, 2018, "SentEval: An Evaluation Toolkit for Universal
Sentence Representations"), with the parameter sets of SimCSE's ``evaluation.py`` (Gao et al.,
2021):

* ``test``: 10-fold, ``{'nhid': 0, 'optim': 'adam', 'batch_size': 64, 'tenacity': 5,
  'epoch_size': 4}``;
* ``fasttest``: 5-fold, ``{'nhid': 0, 'optim': 'rmsprop', 'batch_size': 128, 'tenacity': 3,
  'epoch_size': 2}``.

Protocol per task (SentEval's ``tools/validation.py``):

* MR, CR, SUBJ, MPQA: ``InnerKFoldClassifier``: k outer folds; in each, the L2 penalty is chosen
  from ``{1e-5, 1e-4, 1e-3, 1e-2}`` by k inner folds, then a model is refit on the outer training
  part (holding out 5 % for early stopping) and scored on the outer test fold; accuracy is the mean.
* SST2: ``SplitClassifier``: penalty chosen on dev, accuracy on test.
* TREC, MRPC: ``KFoldClassifier``: penalty chosen by k-fold CV on train, refit on all of train
  (5 % held out for early stopping), accuracy on test; MRPC also reports F1.
* Folds: ``StratifiedKFold(shuffle=True, random_state=1111)``, applied, as in SentEval, to the
  samples sorted by (number of tokens, label) (MRPC: (tokens A, tokens B, label)), so the splits are
  SentEval's.
* MRPC features: SentEval's ``mrpc.py`` uses ``[|u - v|, u * v]`` (``mrpc_features="senteval"``,
  the default, comparable with published SentEval/SimCSE tables); ``"full"`` gives
  ``[u, v, |u - v|, u * v]`` (InferSent's SNLI/SICK-E features).

Classifier (``classifier=``): ``"torch"`` (default) is a re-implementation of SentEval's
``PyTorchClassifier``/``MLP`` with ``nhid=0``: one ``nn.Linear``, cross-entropy (mean), the
optimizer with ``weight_decay`` = L2 penalty, mini-batches drawn from a fresh permutation each
pass, ``epoch_size`` passes between dev evaluations, early stopping after ``tenacity`` evaluations
without improvement (at most 200 passes), the best model kept, and every classifier seeded with
the run seed (numpy permutations and the torch initialisation, as SentEval does, without touching
the global RNG state). ``"sklearn"`` is SentEval's ``usepytorch=False`` path: scikit-learn's
``LogisticRegression(C=...)`` over SentEval's C grids (``2**-2 .. 2**3``; TREC/MRPC ``2**-1 ..
2**5``). :func:`senteval_engine` runs SentEval itself when the ``senteval`` package is
importable. Every setting of one evaluation is a :class:`Probe`.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from adaptcl.evaluation.senteval.encoders import (
    checked_sentence_embeddings,
    encode_checked,
    import_extra,
)

if TYPE_CHECKING:
    import torch

TRANSFER_TASKS: tuple[str, ...] = ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")
PARAM_SETS: dict[str, dict[str, Any]] = {  # SimCSE evaluation.py
    "test": {"kfold": 10, "classifier": {"nhid": 0, "optim": "adam", "batch_size": 64,
                                         "tenacity": 5, "epoch_size": 4}},
    "fasttest": {"kfold": 5, "classifier": {"nhid": 0, "optim": "rmsprop", "batch_size": 128,
                                            "tenacity": 3, "epoch_size": 2}},
}
TORCH_REGS: tuple[float, ...] = tuple(10.0**t for t in range(-5, -1))  # 1e-5 .. 1e-2
SKLEARN_REGS_INNER: tuple[float, ...] = tuple(2.0**t for t in range(-2, 4))
SKLEARN_REGS_KFOLD: tuple[float, ...] = tuple(2.0**t for t in range(-1, 6))
MRPC_FEATURES = ("senteval", "full")
CLASSIFIERS = ("torch", "sklearn")
log = logging.getLogger("adaptcl.evaluation")
# SentEval's optimizer names -> torch.optim classes (looked up lazily: the CLI parser imports
# this module, and must not import torch)
_OPTIMIZERS = {"adam": "Adam", "rmsprop": "RMSprop", "sgd": "SGD", "adagrad": "Adagrad",
               "adadelta": "Adadelta", "adamax": "Adamax"}


@dataclass(frozen=True)
class Probe:
    """One evaluation's protocol: SimCSE's parameter set, the classifier, k, the MRPC features,
    the subsample size (``limit``, smoke tests only) and the seed of the folds, the classifier
    initialisation and the subsamples (SentEval's 1111)."""

    params: str = "fasttest"
    classifier: str = "torch"
    kfold: int | None = None  # override the parameter set's k
    mrpc_features: str = "senteval"
    limit: int | None = None
    seed: int = 1111

    @property
    def k(self) -> int:
        return self.kfold if self.kfold is not None else PARAM_SETS[self.params]["kfold"]

    @property
    def classifier_params(self) -> dict[str, Any]:
        return dict(PARAM_SETS[self.params]["classifier"])

    def identity(self) -> dict[str, Any]:
        """What a cell's identity records of the protocol (the seed is recorded apart)."""
        return {"params": self.params, "k": self.k, "classifier": self.classifier,
                "mrpc_features": self.mrpc_features, "limit": self.limit}

    def describe(self) -> str:
        return (f"SentEval logistic regression, params={self.params} (k={self.k}, "
                f"{self.classifier_params}), classifier={self.classifier}")


# -------------------------------------------------------------------------------- classifiers
def _parse_optimizer(spec: str):
    """SentEval's ``utils.get_optimizer``: ``"adam"`` or ``"sgd,lr=0.1"`` -> (class, kwargs)."""
    method, _, rest = spec.partition(",")
    if method not in _OPTIMIZERS:
        raise ValueError(f"optim={spec!r}: unknown method {method!r}; choose from {list(_OPTIMIZERS)}")
    kwargs = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        kwargs[key] = float(value)
    if method == "sgd" and "lr" not in kwargs:
        raise ValueError(f"optim={spec!r}: sgd needs an explicit lr (e.g. 'sgd,lr=0.1')")
    import torch

    return getattr(torch.optim, _OPTIMIZERS[method]), kwargs


@contextmanager
def _torch_threads(n: int):
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class SentEvalLogReg:
    """SentEval's ``MLP(nhid=0)``: logistic regression trained with early stopping (CPU)."""

    def __init__(self, inputdim: int, nclasses: int, l2reg: float = 0.0, seed: int = 1111,
                 optim: str = "adam", batch_size: int = 64, tenacity: int = 5,
                 epoch_size: int = 4, max_epoch: int = 200, **_ignored: Any) -> None:
        import torch
        from torch import nn

        self.rng = np.random.RandomState(seed)  # == SentEval's np.random.seed(seed)
        with torch.random.fork_rng(devices=[]):  # == torch.manual_seed(seed), RNG state restored
            torch.manual_seed(seed)
            self.model = nn.Sequential(nn.Linear(inputdim, nclasses))
        self.loss_fn = nn.CrossEntropyLoss()
        optim_cls, optim_kwargs = _parse_optimizer(optim)
        self.optimizer = optim_cls(self.model.parameters(), **optim_kwargs)
        self.optimizer.param_groups[0]["weight_decay"] = l2reg
        self.batch_size, self.tenacity = batch_size, tenacity
        self.epoch_size, self.max_epoch = epoch_size, max_epoch
        self.nepoch = 0

    def fit(self, X: np.ndarray, y: np.ndarray, validation_data=None,
            validation_split: float | None = None, early_stop: bool = True) -> float:
        """Train with early stopping on ``validation_data`` or a ``validation_split`` hold-out;
        returns the best dev accuracy. Runs on one torch thread: these matmuls are tiny, and
        intra-op threads only add synchronisation (tens of times slower on a busy machine)."""
        with _torch_threads(1):
            return self._fit(X, y, validation_data, validation_split, early_stop)

    def _fit(self, X, y, validation_data, validation_split, early_stop) -> float:
        import torch

        if validation_data is not None:
            trainX, trainy = X, y
            devX, devy = validation_data
        elif validation_split:
            permutation = self.rng.permutation(len(X))
            cut = int(validation_split * len(X))
            if cut == 0 or cut == len(X):
                raise ValueError(f"validation_split={validation_split} of {len(X)} samples leaves "
                                 "an empty train or dev part")
            trainX, trainy = X[permutation[cut:]], y[permutation[cut:]]
            devX, devy = X[permutation[:cut]], y[permutation[:cut]]
        else:
            raise ValueError("fit needs validation_data or validation_split")
        trainX = torch.as_tensor(np.asarray(trainX), dtype=torch.float32)
        trainy = torch.as_tensor(np.asarray(trainy), dtype=torch.int64)
        self.nepoch, best, stale, stop = 0, -1.0, 0, False
        best_model = copy.deepcopy(self.model)
        while not stop and self.nepoch <= self.max_epoch:
            self._train_epochs(trainX, trainy)
            accuracy = self.score(devX, devy)
            if accuracy > best:
                best, best_model = accuracy, copy.deepcopy(self.model)
            elif early_stop:
                if stale >= self.tenacity:
                    stop = True
                stale += 1
        self.model = best_model
        return best

    def _train_epochs(self, X: torch.Tensor, y: torch.Tensor) -> None:
        import torch

        self.model.train()
        for _ in range(self.epoch_size):
            permutation = torch.from_numpy(self.rng.permutation(len(X))).long()
            for i in range(0, len(X), self.batch_size):
                idx = permutation[i:i + self.batch_size]
                loss = self.loss_fn(self.model(X[idx]), y[idx])
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
        self.nepoch += self.epoch_size

    def predict(self, X: np.ndarray) -> np.ndarray:
        import torch

        self.model.eval()
        with torch.no_grad():
            logits = self.model(torch.as_tensor(np.asarray(X), dtype=torch.float32))
        return logits.argmax(dim=1).numpy()

    def score(self, X: np.ndarray, y: np.ndarray) -> float:
        return float((self.predict(X) == np.asarray(y)).mean())


def _make_classifier(probe: Probe, inputdim: int, nclasses: int, reg: float):
    if probe.classifier == "torch":
        return SentEvalLogReg(inputdim, nclasses, l2reg=reg, seed=probe.seed,
                              **probe.classifier_params)
    linear_model = import_extra("sklearn.linear_model", "recipes")
    return linear_model.LogisticRegression(C=reg, random_state=probe.seed, max_iter=1000)


def _fit(clf, X, y, validation_data=None, validation_split=None):
    if isinstance(clf, SentEvalLogReg):
        clf.fit(X, y, validation_data=validation_data, validation_split=validation_split)
    else:
        clf.fit(X, y)
    return clf


def _skf(probe: Probe):
    return import_extra("sklearn.model_selection", "recipes").StratifiedKFold(
        n_splits=probe.k, shuffle=True, random_state=probe.seed)


def inner_kfold_classifier(X: np.ndarray, y: np.ndarray, nclasses: int,
                           probe: Probe) -> dict[str, Any]:
    """SentEval's ``InnerKFoldClassifier`` (MR, CR, SUBJ, MPQA): nested k-fold CV."""
    regs = TORCH_REGS if probe.classifier == "torch" else SKLEARN_REGS_INNER
    dev_results, test_results, chosen = [], [], []
    for train_idx, test_idx in _skf(probe).split(X, y):
        X_train, y_train = X[train_idx], y[train_idx]
        scores = []
        for reg in regs:
            reg_scores = []
            for in_train, in_test in _skf(probe).split(X_train, y_train):
                clf = _make_classifier(probe, X.shape[1], nclasses, reg)
                _fit(clf, X_train[in_train], y_train[in_train],
                     validation_data=(X_train[in_test], y_train[in_test]))
                reg_scores.append(clf.score(X_train[in_test], y_train[in_test]))
            scores.append(round(100 * float(np.mean(reg_scores)), 2))
        best = int(np.argmax(scores))
        chosen.append(regs[best])
        dev_results.append(scores[best])
        clf = _make_classifier(probe, X.shape[1], nclasses, regs[best])
        _fit(clf, X_train, y_train, validation_split=0.05)
        test_results.append(round(100 * clf.score(X[test_idx], y[test_idx]), 2))
    return {"devacc": round(float(np.mean(dev_results)), 2),
            "acc": round(float(np.mean(test_results)), 2), "fold_acc": test_results,
            "l2reg": chosen}


def kfold_classifier(train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                     nclasses: int, probe: Probe) -> dict[str, Any]:
    """SentEval's ``KFoldClassifier`` (TREC, MRPC): k-fold CV on train, refit, test."""
    (X, y), (X_test, y_test) = train, test
    regs = TORCH_REGS if probe.classifier == "torch" else SKLEARN_REGS_KFOLD
    scores = []
    for reg in regs:
        fold_scores = []
        for tr, te in _skf(probe).split(X, y):
            clf = _make_classifier(probe, X.shape[1], nclasses, reg)
            _fit(clf, X[tr], y[tr], validation_data=(X[te], y[te]))
            fold_scores.append(clf.score(X[te], y[te]))
        scores.append(round(100 * float(np.mean(fold_scores)), 2))
    best = int(np.argmax(scores))
    clf = _make_classifier(probe, X.shape[1], nclasses, regs[best])
    _fit(clf, X, y, validation_split=0.05)
    yhat = clf.predict(X_test)
    return {"devacc": scores[best], "acc": round(100 * float((yhat == y_test).mean()), 2),
            "l2reg": regs[best], "yhat": yhat}


def split_classifier(X: Mapping[str, np.ndarray], y: Mapping[str, np.ndarray], nclasses: int,
                     probe: Probe) -> dict[str, Any]:
    """SentEval's ``SplitClassifier`` (SST2): penalty chosen on dev, accuracy on test."""
    regs = TORCH_REGS if probe.classifier == "torch" else SKLEARN_REGS_INNER
    scores = []
    for reg in regs:
        clf = _make_classifier(probe, X["train"].shape[1], nclasses, reg)
        _fit(clf, X["train"], y["train"], validation_data=(X["dev"], y["dev"]))
        scores.append(round(100 * clf.score(X["dev"], y["dev"]), 2))
    best = int(np.argmax(scores))
    clf = _make_classifier(probe, X["train"].shape[1], nclasses, regs[best])
    _fit(clf, X["train"], y["train"], validation_data=(X["dev"], y["dev"]))
    return {"devacc": scores[best], "acc": round(100 * clf.score(X["test"], y["test"]), 2),
            "l2reg": regs[best]}


# ----------------------------------------------------------------------------------- tasks
def _ntok(sentence: str) -> int:
    return len(sentence.split())


def _limit(n: int, probe: Probe, salt: int) -> np.ndarray:
    """Indices of a seeded random subset of ``range(n)`` (all of it when ``limit`` is None)."""
    if probe.limit is None or n <= probe.limit:
        return np.arange(n)
    return np.sort(np.random.RandomState(probe.seed + salt).choice(n, probe.limit, replace=False))


def _sorted_single(data, probe: Probe, salt: int) -> tuple[list[str], np.ndarray]:
    keep = _limit(len(data), probe, salt)
    pairs = sorted(((data.sentences[i], int(data.labels[i])) for i in keep),
                   key=lambda z: (_ntok(z[0]), z[1]))
    return [s for s, _ in pairs], np.array([label for _, label in pairs], dtype=np.int64)


def evaluate_binary(encoder, task: str, root: Path, probe: Probe) -> dict[str, Any]:
    from adaptcl.evaluation.senteval.data import load_binary

    sentences, labels = _sorted_single(load_binary(root, task), probe, 0)
    X = encode_checked(encoder, sentences, task)
    result = inner_kfold_classifier(X, labels, 2, probe)
    return {**result, "ndev": len(labels), "ntest": len(labels)}


def evaluate_sst2(encoder, root: Path, probe: Probe) -> dict[str, Any]:
    from adaptcl.evaluation.senteval.data import load_sst2

    X, y = {}, {}
    for salt, split in enumerate(("train", "dev", "test")):
        sentences, y[split] = _sorted_single(load_sst2(root, split), probe, salt)
        X[split] = encode_checked(encoder, sentences, f"SST2-{split}")
    result = split_classifier(X, y, 2, probe)
    return {**result, "ndev": len(y["dev"]), "ntest": len(y["test"])}


def evaluate_trec(encoder, root: Path, probe: Probe) -> dict[str, Any]:
    from adaptcl.evaluation.senteval.data import TREC_CLASSES, load_trec

    data = {}
    for salt, split in enumerate(("train", "test")):
        sentences, labels = _sorted_single(load_trec(root, split), probe, salt)
        data[split] = (encode_checked(encoder, sentences, f"TREC-{split}"), labels)
    result = kfold_classifier(data["train"], data["test"], len(TREC_CLASSES), probe)
    result.pop("yhat")
    return {**result, "ndev": len(data["train"][1]), "ntest": len(data["test"][1])}


def mrpc_features(a: np.ndarray, b: np.ndarray, kind: str = "senteval") -> np.ndarray:
    """``[|u-v|, u*v]`` (SentEval's mrpc.py) or ``[u, v, |u-v|, u*v]`` (``kind="full"``)."""
    if kind == "senteval":
        return np.c_[np.abs(a - b), a * b]
    if kind == "full":
        return np.c_[a, b, np.abs(a - b), a * b]
    raise ValueError(f"mrpc_features={kind!r} is not one of {MRPC_FEATURES}")


def evaluate_mrpc(encoder, root: Path, probe: Probe) -> dict[str, Any]:
    from adaptcl.evaluation.senteval.data import load_mrpc

    metrics = import_extra("sklearn.metrics", "recipes")
    data = {}
    for salt, split in enumerate(("train", "test")):
        pairs = load_mrpc(root, split)
        keep = _limit(len(pairs), probe, salt)
        rows = sorted(((pairs.sentences1[i], pairs.sentences2[i], int(pairs.labels[i])) for i in keep),
                      key=lambda z: (_ntok(z[0]), _ntok(z[1]), z[2]))
        unique = {s: None for row in rows for s in row[:2]}
        index = {s: i for i, s in enumerate(unique)}
        emb = encode_checked(encoder, list(unique), f"MRPC-{split}")
        a = emb[[index[r[0]] for r in rows]]
        b = emb[[index[r[1]] for r in rows]]
        data[split] = (mrpc_features(a, b, probe.mrpc_features),
                       np.array([r[2] for r in rows], dtype=np.int64))
    result = kfold_classifier(data["train"], data["test"], 2, probe)
    yhat = result.pop("yhat")
    result["f1"] = round(100 * float(metrics.f1_score(data["test"][1], yhat)), 2)
    return {**result, "ndev": len(data["train"][1]), "ntest": len(data["test"][1]),
            "features": probe.mrpc_features}


def evaluate_task(encoder, task: str, root: Path, probe: Probe) -> dict[str, Any]:
    """Run one transfer task with ``encoder`` (anything with ``encode(sentences, dataset=)``)."""
    if task in ("MR", "CR", "SUBJ", "MPQA"):
        return evaluate_binary(encoder, task, root, probe)
    if task == "SST2":
        return evaluate_sst2(encoder, root, probe)
    if task == "TREC":
        return evaluate_trec(encoder, root, probe)
    if task == "MRPC":
        return evaluate_mrpc(encoder, root, probe)
    raise ValueError(f"task={task!r} not recognised; choose from {list(TRANSFER_TASKS)}")


def senteval_engine(encoder, root: Path, probe: Probe, batch_size: int):
    """SentEval's own engine on ``encoder``'s embeddings (``backend="senteval"``; only if the
    ``senteval`` package is importable): ``engine.eval(task)`` runs one task."""
    import senteval

    def batcher(params, batch):
        sentences = [" ".join(w.decode("utf-8") if isinstance(w, bytes) else w for w in s)
                     for s in batch]
        return checked_sentence_embeddings(encoder._encode_all(sentences, "senteval"),
                                           encoder.model_id, "senteval")

    params = {"task_path": str(root.parent), "usepytorch": probe.classifier == "torch",
              "kfold": probe.k, "seed": probe.seed, "batch_size": batch_size,
              "classifier": probe.classifier_params}
    return senteval.engine.SE(params, batcher, lambda params, samples: None)
