"""The STS protocol of SentEval and SimCSE: cosine similarities scored against gold scores.

For every sentence pair the system score is the cosine similarity of the two embeddings
(SentEval's ``STSEval``; Conneau & Kiela, 2018). STS12-STS16 are scored in SentEval's **"all"**
setting, the Spearman correlation over all subsets of a year concatenated, which is what SimCSE
(Gao et al., 2021) reports; the per-subset numbers and their plain (``mean``) and size-weighted
(``wmean``) averages are kept alongside (:func:`aggregate_subsets`). STS-B and SICK-R are scored
on their test sets directly from the cosine similarities, **without** training a regressor
(SimCSE's protocol). Embeddings are checked before they are scored
(:func:`adaptcl.evaluation.senteval.encoders.encode_checked`).

Example::

    from adaptcl.evaluation.senteval.encoders import build_encoder
    from adaptcl.evaluation.senteval.sts import evaluate_task

    encoder = build_encoder("/path/to/sentence-transformer")
    evaluate_task(encoder, "STSBenchmark", "/data")["spearman"]   # Spearman on STS-B test
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from adaptcl.evaluation.senteval.encoders import encode_checked, import_extra

STS_TASKS: tuple[str, ...] = (
    "STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness",
)


def cosine_scores(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity; a zero vector gives 0 (as SentEval's ``nan_to_num`` does).

    NaN/inf in the embeddings raise :class:`~adaptcl.plugins.validation.NonFiniteError` (a
    ``ValueError``): they must never turn into scores.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"cosine_scores needs two (n, d) arrays of one shape, got {a.shape}, {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        from adaptcl.plugins.validation import NonFiniteError

        raise NonFiniteError("cosine_scores got non-finite (NaN/inf) embeddings")
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
    embeddings = encode_checked(encoder, list(unique), dataset)
    out = {}
    for name, pairs in pairs_by_name.items():
        a = embeddings[[unique[s] for s in pairs.sentences1]]
        b = embeddings[[unique[s] for s in pairs.sentences2]]
        out[name] = (cosine_scores(a, b), pairs.scores)
    return out


def evaluate_task(encoder, task: str, data_root: str | os.PathLike | None) -> dict[str, Any]:
    """Score one STS task with ``encoder`` (an object with ``encode(sentences, dataset=...)``)."""
    from adaptcl.evaluation.senteval import data as sd

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
    (an independent cross-check of :func:`evaluate_task`'s STS-B number for a
    sentence-transformers model)."""
    from adaptcl.evaluation.senteval import data as sd

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
