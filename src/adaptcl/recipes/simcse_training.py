"""Training SimCSE for the ``simcse`` recipe: the paper's settings and one training run with
sentence-transformers' trainer, keeping the best STS-B dev checkpoint.

The model, poolers, losses and data come from :mod:`adaptcl.adapters.sentence_transformers`
(its ``simcse`` module); this module only drives the trainer. Reference: Gao, Yao & Chen,
"SimCSE", EMNLP 2021; MACL's sentence setting: Huang et al., ICML 2023, App. B.4.

Example:
    >>> from adaptcl.adapters.sentence_transformers import (build_simcse_model, make_loss,
    ...     stsb_dev_evaluator, training_projection, unsupervised_dataset)
    >>> model = build_simcse_model("bert-base-uncased", pooler="cls", max_seq_length=32)
    >>> loss = make_loss("macl", model, projection=training_projection("cls", model))
    >>> result = train_simcse(model, unsupervised_dataset(sentences), loss,
    ...                       SimCSEConfig(output_dir="out", **PAPER_CONFIGS["bert"]),
    ...                       dev_evaluator=stsb_dev_evaluator(s1, s2, gold))
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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

__all__ = ["PAPER_CONFIGS", "SimCSEConfig", "train_simcse"]

# The SimCSE / MACL paper configuration (one flag away for a GPU machine).
PAPER_CONFIGS: dict[str, dict[str, Any]] = {
    "bert": {"learning_rate": 3e-5, "batch_size": 64, "max_seq_length": 32, "epochs": 1,
             "eval_steps": 125},
    "roberta": {"learning_rate": 1e-5, "batch_size": 64, "max_seq_length": 32, "epochs": 1,
                "eval_steps": 125},
}



@dataclass
class SimCSEConfig:
    """Training settings (defaults: a CPU-sized run; see :data:`PAPER_CONFIGS`)."""

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
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    final = out / "final"
    model.save(str(final))
    loss.save_loss_state(final)
    history = [h for h in trainer.state.log_history if "loss" in h or metric in h]
    best = None
    if evaluate:
        scores = [h[metric] for h in trainer.state.log_history if metric in h]
        best = max(scores) if scores else None
    return {"final_model": str(final), "best_dev_spearman": best,
            "best_checkpoint": trainer.state.best_model_checkpoint,
            "global_step": trainer.state.global_step, "history": history,
            "config": asdict(config), "loss": type(loss).__name__,
            "loss_config": loss.get_config_dict(),
            "finite": all(math.isfinite(h.get("loss", 0.0)) for h in history)}
