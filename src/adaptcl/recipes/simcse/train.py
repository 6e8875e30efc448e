"""Training SimCSE for the ``simcse`` recipe: the paper's settings and one training run with
sentence-transformers' trainer, keeping the best STS-B dev checkpoint.

The model, poolers, losses and data come from :mod:`adaptcl.adapters.sentence_transformers`
(its ``simcse`` module); this module only drives the trainer. Reference: Gao, Yao & Chen,
"SimCSE", EMNLP 2021; MACL's sentence setting: Huang et al., ICML 2023, App. B.4.

Example:
    >>> from adaptcl.adapters.sentence_transformers import (build_simcse_model, make_loss,
    ...     stsb_dev_evaluator, training_projection, unsupervised_dataset)
    >>> from adaptcl.adapters.sentence_transformers.simcse_names import PAPER_CONFIGS
    >>> model = build_simcse_model("bert-base-uncased", pooler="cls", max_seq_length=32)
    >>> loss = make_loss("macl", model, projection=training_projection("cls", model))
    >>> result = train_simcse(model, unsupervised_dataset(sentences), loss,
    ...                       SimCSEConfig(output_dir="out", **PAPER_CONFIGS["bert"]),
    ...                       dev_evaluator=stsb_dev_evaluator(s1, s2, gold))
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from adaptcl.adapters import require

require("sentence_transformers", "text")

from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.sentence_transformer.evaluation import (  # noqa: E402
    EmbeddingSimilarityEvaluator,
)
from sentence_transformers.sentence_transformer.training_args import (  # noqa: E402
    SentenceTransformerTrainingArguments,
)

from adaptcl.adapters.sentence_transformers import (  # noqa: E402
    AdaptiveContrastiveLoss,
    AdaptiveSentenceTransformerTrainer,
    LossStateCallback,
    validate_text_dataset,
)
from adaptcl.plugins.validation import NonFiniteError  # noqa: E402
from adaptcl.recipes.template.errors import DivergedError, RecipeError  # noqa: E402
from adaptcl.recipes.template.loggers import metric_logger  # noqa: E402
from adaptcl.recipes.template.plots import explain_empty  # noqa: E402
from adaptcl.recipes.template.torch_env import seed_everything  # noqa: E402

if TYPE_CHECKING:
    from adaptcl.recipes.simcse import SimCSERecipe, SimCSERecipeConfig
    from adaptcl.recipes.template.store import Cell, GridRun

__all__ = ["SimCSEConfig", "run_record", "train_simcse", "train_one", "untrained_run"]

@dataclass
class SimCSEConfig:
    """Training settings (defaults: a CPU-sized run; the papers':
    :data:`~adaptcl.adapters.sentence_transformers.simcse_names.PAPER_CONFIGS`)."""

    output_dir: str
    batch_size: int = 64
    learning_rate: float = 3e-5
    epochs: float = 1.0
    max_steps: int = -1
    max_seq_length: int = 32
    eval_steps: int = 125
    warmup_ratio: float = 0.0
    seed: int = 42
    logging_steps: int = 10
    save_total_limit: int = 1
    extra_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.batch_size < 2:
            raise ValueError(f"batch_size must be >= 2 (in-batch negatives), got {self.batch_size}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.eval_steps < 1:
            raise ValueError(f"eval_steps must be >= 1, got {self.eval_steps}")


def train_simcse(model: SentenceTransformer, train_dataset, loss: AdaptiveContrastiveLoss,
                 config: SimCSEConfig, *, dev_evaluator: EmbeddingSimilarityEvaluator | None = None,
                 resume_from_checkpoint: str | bool | None = None,
                 tensorboard_dir: str | Path | None = None) -> dict[str, Any]:
    """Train with ``SentenceTransformerTrainer``; keep the best STS-B dev checkpoint.

    Saves a plain sentence-transformers model to ``config.output_dir/final`` (loadable with
    ``SentenceTransformer(path)``) and the loss's own trainable state next to it.

    ``config.extra_args`` go to ``SentenceTransformerTrainingArguments`` and override the
    arguments built here (``report_to``, ``use_cpu``, ``bf16`` ...). ``tensorboard_dir``: write
    the trainer's logs (loss, learning rate, the loss's adaptive quantities under
    ``train/adaptcl/...``, dev scores under ``eval/...``) as TensorBoard event files there,
    through transformers' own ``TensorBoardCallback``.

    Returns:
        dict with ``final_model`` path, ``best_dev_spearman`` (when an evaluator is given),
        ``global_step`` and the logged ``history`` (loss and adaptive quantities per log step).
    """
    validate_text_dataset(train_dataset)
    out = Path(config.output_dir)
    evaluate = dev_evaluator is not None
    metric = f"eval_{dev_evaluator.name}_spearman_cosine" if evaluate else None
    arguments: dict[str, Any] = dict(
        output_dir=str(out / "checkpoints"),
        per_device_train_batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        warmup_ratio=config.warmup_ratio,
        seed=config.seed,
        logging_steps=config.logging_steps,
        eval_strategy="steps" if evaluate else "no",
        eval_steps=config.eval_steps if evaluate else None,
        save_strategy="steps" if evaluate else "no",
        save_steps=config.eval_steps,
        save_total_limit=config.save_total_limit,
        load_best_model_at_end=evaluate,
        metric_for_best_model=metric,
        greater_is_better=True,
        report_to="none",
        dataloader_drop_last=True,  # a last batch of one pair gives 0, but the optimiser would still step
        use_cpu=not torch.cuda.is_available(),
    )
    args = SentenceTransformerTrainingArguments(**{**arguments, **config.extra_args})
    callbacks: list[Any] = [LossStateCallback(loss)]
    if tensorboard_dir is not None:
        # transformers 5 dropped TrainingArguments(logging_dir=); the callback takes its writer
        from torch.utils.tensorboard import SummaryWriter
        from transformers.integrations import TensorBoardCallback

        callbacks.append(TensorBoardCallback(SummaryWriter(log_dir=str(tensorboard_dir))))
    trainer = AdaptiveSentenceTransformerTrainer(
        model=model, args=args, train_dataset=train_dataset, loss=loss, evaluator=dev_evaluator,
        callbacks=callbacks)
    try:
        trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    except NonFiniteError as err:  # the loss met NaN embeddings: the weights diverged
        step = trainer.state.global_step + 1
        logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        raise DivergedError(f"{config.output_dir}: {err} at step {step}", step=step,
                            loss=logged[-1] if logged else None) from None
    final = out / "final"
    if trainer.is_world_process_zero():  # one writer under torchrun
        model.save(str(final))
        loss.save_loss_state(final)
    history = [h for h in trainer.state.log_history if "loss" in h or metric in h]
    best = None
    if evaluate:
        scores = [h[metric] for h in trainer.state.log_history if metric in h]
        best = max(scores) if scores else None
    return {"final_model": str(final), "best_dev_spearman": best,
            "world_size": int(trainer.args.world_size),
            "best_checkpoint": trainer.state.best_model_checkpoint,
            "global_step": trainer.state.global_step, "history": history,
            "config": asdict(config), "loss": type(loss).__name__,
            "loss_config": loss.get_config_dict(),
            "finite": all(math.isfinite(h.get("loss", 0.0)) for h in history)}


def train_one(name: str, seed: int, recipe: SimCSERecipe, out: Path) -> dict[str, Any]:
    """Train one loss from the recipe's checkpoint with the sentence-transformers trainer."""
    from adaptcl.adapters.sentence_transformers import (
        build_simcse_model,
        make_loss,
        stsb_dev_evaluator,
        training_projection,
        unsupervised_dataset,
    )
    from adaptcl.evaluation.senteval.data import load_stsb

    config = recipe.config
    seed_everything(seed)
    model = build_simcse_model(recipe.model, config.pooler, max_seq_length=config.max_seq_length,
                               dropout=config.dropout)
    projection = None if name == "amcl" else training_projection(config.pooler, model)
    # under torchrun every rank's in-batch negatives join every other rank's
    loss = make_loss(name, model, projection=projection,
                     gather_across_devices=int(os.environ.get("WORLD_SIZE", "1")) > 1)
    dev = load_stsb(recipe.senteval_root, "dev")
    extra = {"bf16-mixed": {"bf16": True}, "16-mixed": {"fp16": True}}.get(config.precision, {})
    # use_cpu keeps a CUDA machine's GPU out of a --device cpu run
    extra = {**extra, "disable_tqdm": not config.progress, "use_cpu": config.device == "cpu"}
    tensorboard_dir = None
    if config.logger == "tensorboard":  # live, through transformers' TensorBoardCallback
        tensorboard_dir = log_folder(Path(config.output_dir) / "logs", name, seed)
        shutil.rmtree(tensorboard_dir, ignore_errors=True)  # a superseded run's curves
    return train_simcse(
        model, unsupervised_dataset(recipe.sentences), loss,
        SimCSEConfig(output_dir=str(out), batch_size=config.batch_size,
                     learning_rate=config.learning_rate, epochs=config.epochs,
                     max_seq_length=config.max_seq_length, eval_steps=config.eval_steps,
                     seed=seed, logging_steps=config.logging_steps, extra_args=extra),
        dev_evaluator=stsb_dev_evaluator(dev.sentences1, dev.sentences2, dev.scores),
        tensorboard_dir=tensorboard_dir)


def untrained_run(seed: int, recipe: SimCSERecipe, out: Path) -> dict[str, Any]:
    """The starting point of every run, built and saved as :func:`train_one` saves a trained
    model (``global_step`` 0, no history): what the table compares training against."""
    from adaptcl.adapters.sentence_transformers import build_simcse_model

    cfg = recipe.config
    seed_everything(seed)
    model = build_simcse_model(recipe.model, cfg.pooler, max_seq_length=cfg.max_seq_length)
    model.save(str(out / "final"))
    return {"final_model": str(out / "final"), "global_step": 0, "history": [],
            "best_dev_spearman": None}


def run_record(run: dict[str, Any], train_seconds: float) -> dict[str, Any]:
    """The stored record of a :func:`train_one` or :func:`untrained_run` result: ``metrics``
    (``best dev`` Spearman x 100 and ``final loss``, when there are), the step count, the losses,
    the numeric history and where the model is (the recipe adds the STS scores to ``metrics``)."""
    metrics: dict[str, float] = {}
    if run.get("best_dev_spearman") is not None:
        metrics["best dev"] = 100.0 * float(run["best_dev_spearman"])
    losses = [float(h["loss"]) for h in run["history"] if "loss" in h]
    if losses:
        metrics["final loss"] = losses[-1]
    history = [{k: v for k, v in h.items() if isinstance(v, (int, float, str))}
               for h in run["history"]]
    return {"metrics": metrics, "optimisation_steps": int(run["global_step"]), "losses": losses,
            "train_seconds": train_seconds, "history": history,
            "final_model": run["final_model"], "best_checkpoint": run.get("best_checkpoint"),
            "loss": run.get("loss"), "loss_config": run.get("loss_config"),
            "processes": int(run.get("world_size") or 1)}


def log_folder(log_dir: Path, method: str, seed: int) -> Path:
    """Where one run's curves go: ``log_dir/<loss>/seed<k>``."""
    return log_dir / method / f"seed{seed}"


def write_training_logs(cell: Cell, record: dict[str, Any], kind: str, log_dir: Path) -> None:
    """For ``--logger csv``, write a run's logged curves with
    :class:`~adaptcl.recipes.template.loggers.MetricLogger` (``metrics.csv``: step, name, value)
    under :func:`log_folder`. ``--logger tensorboard`` is written live by the trainer instead."""
    if kind != "csv":
        return
    folder = log_folder(log_dir, cell.method, cell.seed)
    shutil.rmtree(folder, ignore_errors=True)  # a superseded run's curves
    with metric_logger(kind, folder) as logger:
        for row in record.get("history", []):
            logger.log({k: v for k, v in row.items() if k not in ("step", "epoch")},
                       int(row.get("step", 0)))


def read_sentences(path: Path, limit: int | None) -> list[str]:
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


def require_model(model: str) -> dict[str, str]:
    """The model's identity: a local folder's resolved path and files' fingerprint, or the hub
    name. Fails with one line, before any work, when ``model`` has no loadable configuration (a
    missing folder, a hub name not available here)."""
    from transformers import AutoConfig

    from adaptcl.adapters.sentence_transformers.simcse_names import model_unavailable
    from adaptcl.evaluation.senteval.encoders import _folder_fingerprint

    try:
        AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as err:
        raise RecipeError(str(model_unavailable(model, err))) from err
    path = Path(model).expanduser()
    return ({"path": str(path.resolve()), "files": _folder_fingerprint(path.resolve())}
            if path.is_dir() else {"hub": model})


def framework_versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in ("torch", "transformers", "sentence-transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def draw_curves(grid: GridRun, axes: list[Any], config: SimCSERecipeConfig) -> None:
    """Temperature and alignment per logged step of every trained run; empty panels say why."""
    trained = {c: r for c, r in grid.records.items() if c.method != "untrained"}
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
