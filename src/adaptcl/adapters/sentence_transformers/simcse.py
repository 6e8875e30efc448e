"""SimCSE on any BERT / RoBERTa checkpoint: the model, its poolers, the loss and the data.

Reference: Gao, Yao & Chen, "SimCSE: Simple Contrastive Learning of Sentence Embeddings",
EMNLP 2021. MACL's sentence setting: Huang et al., ICML 2023, Sec. 6.2 and App. B.4.

* Unsupervised SimCSE: every sentence is its own positive; the two columns ``anchor`` and
  ``positive`` hold the same text and go through separate forward passes, so their dropout
  masks differ (dropout is the augmentation). ``pooler="cls"`` trains with an MLP over the CLS
  vector that is used only in training (it lives in the loss, not in the saved model), so the
  saved model encodes with ``cls_before_pooler``, exactly as the paper evaluates.
* Supervised SimCSE: NLI ``(anchor, positive, hard negative)`` triplets; the MLP is kept
  at test time in the paper, so use ``pooler="cls"`` with ``keep_mlp=True``.
* Other poolers: ``cls_before_pooler``, ``avg``, ``avg_first_last`` (mean of the first
  and last layers' tokens), ``avg_top2`` (last two layers).

Any loss of :mod:`adaptcl.adapters.sentence_transformers` can be used (InfoNCE is SimCSE).
:class:`AdaptiveSentenceTransformerTrainer` adds the adaptive quantities the loss computes to
the trainer's logs; :func:`stsb_dev_evaluator` scores STS-B dev during training;
:func:`train_simcse` drives the trainer with a :class:`SimCSEConfig` (STS-B dev every
``eval_steps``, the best checkpoint kept, a plain sentence-transformers model saved to
``final/`` with the loss's own state beside it). The ``simcse`` recipe trains with them.

Example:
    >>> from adaptcl.adapters.sentence_transformers.simcse_names import PAPER_CONFIGS
    >>> model = build_simcse_model("bert-base-uncased", pooler="cls", max_seq_length=32)
    >>> loss = make_loss("macl", model, projection=training_projection("cls", model))
    >>> result = train_simcse(model, unsupervised_dataset(sentences), loss,
    ...                       SimCSEConfig(output_dir="out", **PAPER_CONFIGS["bert"]),
    ...                       dev_evaluator=stsb_dev_evaluator(s1, s2, gold))
    >>> result["final_model"], result["best_dev_spearman"], result["global_step"]
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from adaptcl.adapters import require

require("sentence_transformers", "text")

from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.sentence_transformer.evaluation import (  # noqa: E402
    EmbeddingSimilarityEvaluator,
)
from sentence_transformers.sentence_transformer.modules import (  # noqa: E402
    Pooling,
    Transformer,
    WeightedLayerPooling,
)
from sentence_transformers.sentence_transformer.trainer import (  # noqa: E402
    SentenceTransformerTrainer,
)
from sentence_transformers.sentence_transformer.training_args import (  # noqa: E402
    SentenceTransformerTrainingArguments,
)
from transformers import PrinterCallback  # noqa: E402

from adaptcl.plugins import set_schedule_step  # noqa: E402
from adaptcl.plugins.validation import NonFiniteError  # noqa: E402
from adaptcl.registry import canonical_loss_name  # noqa: E402

from .base import AdaptiveContrastiveLoss, embedding_dimension  # noqa: E402
from .callbacks import LossStateCallback, quiet_model_card  # noqa: E402
from .losses import AMCLLoss, ASCLLoss, DySTreSSLoss, InfoNCELoss, MACLLoss  # noqa: E402
from .simcse_names import LOSSES, POOLERS, model_unavailable  # noqa: E402
from .temperatures import LearnableTemperatureLoss, TemperatureScheduleLoss  # noqa: E402

__all__ = ["LOSSES", "POOLERS", "AdaptiveSentenceTransformerTrainer", "SimCSEConfig",
           "SimCSEProjection", "build_simcse_model", "make_loss", "stsb_dev_evaluator",
           "supervised_dataset", "train_simcse", "training_projection", "unsupervised_dataset",
           "validate_text_dataset"]


class SimCSEProjection(nn.Sequential):
    """SimCSE's training-only MLP over the CLS vector: ``Linear(d, d) -> Tanh`` (Gao et al. 2021)."""

    def __init__(self, dim: int) -> None:
        super().__init__(nn.Linear(dim, dim), nn.Tanh())


def build_simcse_model(model_name_or_path: str, pooler: str = "cls", *, max_seq_length: int = 32,
                       dropout: float | None = None, device: str | None = None) -> SentenceTransformer:
    """A ``SentenceTransformer`` over a BERT/RoBERTa checkpoint with a SimCSE pooler.

    Args:
        model_name_or_path: local folder or hub name of a Hugging Face encoder.
        pooler: one of :data:`POOLERS` (``"cls"`` and ``"cls_before_pooler"`` both take the
            CLS vector; ``"cls"`` adds a training-only MLP in the loss, see
            :func:`training_projection`).
        max_seq_length: truncation length (SimCSE: 32).
        dropout: override ``hidden_dropout_prob`` / ``attention_probs_dropout_prob`` (SimCSE:
            0.1; the MACL paper found 0.2 better with MACL).
    """
    if pooler not in POOLERS:
        raise ValueError(f"pooler={pooler!r} is not one of {POOLERS}")
    config_kwargs: dict[str, Any] = {}
    if dropout is not None:
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        config_kwargs.update(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    if pooler in ("avg_first_last", "avg_top2"):
        config_kwargs["output_hidden_states"] = True
    try:
        transformer = Transformer(model_name_or_path, max_seq_length=max_seq_length,
                                  config_kwargs=config_kwargs or None)
    except OSError as err:
        raise model_unavailable(model_name_or_path, err) from err
    tokenizer = getattr(transformer, "tokenizer", None)
    if pooler in ("cls", "cls_before_pooler") and tokenizer is not None and tokenizer.cls_token is None:
        raise ValueError(
            f"pooler={pooler!r} needs a tokenizer with a CLS token (BERT's [CLS], RoBERTa's <s>); "
            f"the tokenizer of {model_name_or_path!r} has none: use pooler='avg'")
    dim = transformer.get_embedding_dimension()
    modules: list[nn.Module] = [transformer]
    if pooler in ("avg_first_last", "avg_top2"):
        layers = transformer.auto_model.config.num_hidden_layers
        if pooler == "avg_first_last":
            # hidden_states[0] is the embedding layer; SimCSE averages layer 1 and the last
            weights = torch.zeros(layers)
            weights[0] = weights[-1] = 1.0
            layer_pool = WeightedLayerPooling(dim, num_hidden_layers=layers, layer_start=1,
                                              layer_weights=nn.Parameter(weights, requires_grad=False))
        else:
            layer_pool = WeightedLayerPooling(dim, num_hidden_layers=layers, layer_start=layers - 1,
                                              layer_weights=nn.Parameter(torch.ones(2), requires_grad=False))
        modules += [layer_pool, Pooling(dim, pooling_mode="mean")]
    else:
        modules.append(Pooling(dim, pooling_mode="mean" if pooler == "avg" else "cls"))
    return SentenceTransformer(modules=modules, device=device)


def training_projection(pooler: str, model: SentenceTransformer, *, keep_mlp: bool = False) -> nn.Module | None:
    """SimCSE's MLP for ``pooler="cls"`` (used only in training unless ``keep_mlp``).

    With ``keep_mlp=True`` (supervised SimCSE) append the MLP to the model instead, so it is
    trained and saved with it, and return ``None``.
    """
    if pooler != "cls":
        return None
    dim = embedding_dimension(model)
    if keep_mlp:
        from sentence_transformers.sentence_transformer.modules import Dense

        model.append(Dense(dim, dim, activation_function=nn.Tanh()))
        return None
    return SimCSEProjection(dim)


def make_loss(name: str, model: SentenceTransformer, *, projection: nn.Module | None = None,
              temperature: float = 0.05, **kwargs: Any) -> AdaptiveContrastiveLoss:
    """One of :data:`LOSSES` with SimCSE's temperature (0.05) and the papers' defaults.

    ``macl``: alpha 2, A0 0.8, no reweighting (MACL App. B.4); ``ascl``: in-batch soft labels;
    ``amcl``: 2 heads, learned pair temperature; ``dystress``: the DySTreSS authors' SimCSE run,
    the piecewise temperature from ``0.8 * temperature`` (0.04) to ``temperature`` (0.05);
    ``infonce``: SimCSE itself; ``temperature_schedule``: Kukleva et al.'s cosine from
    ``temperature`` (tau_min) up to their tau_max 1.0 with their period of 400 (here trainer
    steps; ``max_temperature=``, ``period=`` override them); ``learnable_temperature``: tau =
    exp(-s) learned from ``temperature``, within open_clip's bounds [0.01, 1]. Names are resolved
    by :func:`~adaptcl.registry.canonical_loss_name` (case-insensitive; an older
    spelling such as ``"nt_xent"`` builds InfoNCE with a ``FutureWarning``).
    """
    name = canonical_loss_name(name, allowed=LOSSES)
    if name == "infonce":
        return InfoNCELoss(model, temperature=temperature, projection=projection, **kwargs)
    if name == "macl":
        return MACLLoss(model, temperature=temperature, projection=projection, **kwargs)
    if name == "ascl":
        return ASCLLoss(model, temperature=temperature, projection=projection, **kwargs)
    if name == "dystress":
        kwargs.setdefault("min_temperature", 0.8 * temperature)
        return DySTreSSLoss(model, max_temperature=temperature, projection=projection, **kwargs)
    if name == "temperature_schedule":
        return TemperatureScheduleLoss(model, min_temperature=temperature, projection=projection,
                                       **kwargs)
    if name == "learnable_temperature":
        return LearnableTemperatureLoss(model, temperature=temperature, projection=projection,
                                        **kwargs)
    if projection is not None:  # amcl
        raise ValueError("AMCL brings its own projection heads; use pooler='cls_before_pooler' or 'avg'")
    return AMCLLoss(model, **kwargs)


def unsupervised_dataset(sentences: Sequence[str]):
    """``datasets.Dataset`` with ``anchor`` and ``positive`` columns holding the same sentence."""
    from datasets import Dataset

    sentences = [s for s in (str(x).strip() for x in sentences) if s]
    if not sentences:
        raise ValueError("no non-empty sentences to train on")
    return Dataset.from_dict({"anchor": sentences, "positive": list(sentences)})


def supervised_dataset(triplets: Sequence[tuple[str, str, str]]):
    """``(anchor, positive, negative)`` NLI triplets (SimCSE's ``sent0, sent1, hard_neg``)."""
    from datasets import Dataset

    if not triplets:
        raise ValueError("no triplets to train on")
    for i, triplet in enumerate(triplets):
        if len(triplet) != 3:
            raise ValueError(f"triplet {i} has {len(triplet)} fields; expected (anchor, positive, negative)")
    anchors, positives, negatives = zip(*triplets, strict=True)
    return Dataset.from_dict({"anchor": list(anchors), "positive": list(positives),
                              "negative": list(negatives)})


def stsb_dev_evaluator(sentences1: Sequence[str], sentences2: Sequence[str],
                       scores: Sequence[float], name: str = "sts-dev") -> EmbeddingSimilarityEvaluator:
    """Spearman of cosine similarity on STS-B dev (gold scores 0-5 rescaled to 0-1)."""
    return EmbeddingSimilarityEvaluator(list(sentences1), list(sentences2),
                                        [float(s) / 5.0 for s in scores], name=name,
                                        main_similarity="cosine", batch_size=128)


def validate_text_dataset(dataset) -> None:
    """At least two text columns of equal length, no empty or non-string entries.

    Raises ``ValueError`` naming the column and the first offending row.
    """
    columns = [c for c in dataset.column_names if c not in ("label", "labels", "score")]
    if len(columns) < 2:
        raise ValueError(f"the training data needs at least two text columns (anchor, positive), "
                         f"got {columns}")
    for column in columns:
        for i, text in enumerate(dataset[column]):
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"column {column!r} row {i} is empty or not a string: {text!r}")


class AdaptiveSentenceTransformerTrainer(SentenceTransformerTrainer):
    """``SentenceTransformerTrainer`` that adds the loss's adaptive quantities to every log and
    drives a scheduled temperature with ``state.global_step`` (restored on resume) before every
    training step."""

    def training_step(self, model: nn.Module, inputs: dict[str, Any],
                      num_items_in_batch: Any = None) -> torch.Tensor:
        for loss in self.loss.values() if isinstance(self.loss, dict) else (self.loss,):
            set_schedule_step(loss, self.state.global_step)
        return super().training_step(model, inputs, num_items_in_batch)

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        stats = getattr(self.loss, "last_stats", None)
        if stats and "loss" in logs:
            logs = {**logs, **{f"adaptcl/{k}": round(float(v), 6) for k, v in stats.items()}}
        super().log(logs, *args, **kwargs)


@dataclass
class SimCSEConfig:
    """Training settings of :func:`train_simcse` (defaults: a CPU-sized run; the papers':
    :data:`~adaptcl.adapters.sentence_transformers.simcse_names.PAPER_CONFIGS`).

    ``extra_args`` go to ``SentenceTransformerTrainingArguments`` and override the arguments
    :func:`train_simcse` builds (``report_to``, ``use_cpu``, ``bf16`` ...).
    """

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
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")


def _training_arguments(config: SimCSEConfig, metric: str | None, progress: bool = True
                        ) -> SentenceTransformerTrainingArguments:
    """The trainer's arguments: ``config``'s, STS-B dev (``metric``) every ``eval_steps`` with
    the best checkpoint kept when there is a dev evaluator; ``config.extra_args`` win."""
    evaluate = metric is not None
    arguments: dict[str, Any] = dict(
        output_dir=str(Path(config.output_dir) / "checkpoints"),
        per_device_train_batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        warmup_steps=config.warmup_ratio,  # transformers 5 reads a float < 1 as the ratio
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
        dataloader_pin_memory=torch.cuda.is_available(),  # pinning is for copies to a GPU
        **({} if progress else {"disable_tqdm": True}),
    )
    return SentenceTransformerTrainingArguments(**{**arguments, **config.extra_args})


def train_simcse(model: SentenceTransformer, train_dataset, loss: AdaptiveContrastiveLoss,
                 config: SimCSEConfig, *, dev_evaluator: EmbeddingSimilarityEvaluator | None = None,
                 resume_from_checkpoint: str | bool | None = None,
                 tensorboard_dir: str | Path | None = None, progress: bool = True
                 ) -> dict[str, Any]:
    """Train with :class:`AdaptiveSentenceTransformerTrainer`; keep the best STS-B dev checkpoint.

    Saves a plain sentence-transformers model to ``config.output_dir/final`` (loadable with
    ``SentenceTransformer(path)``) and the loss's own trainable state next to it (on the main
    process only under ``torchrun``). ``resume_from_checkpoint`` is the trainer's (a checkpoint
    folder, ``True`` for the newest in ``config.output_dir/checkpoints``); under ``torchrun``
    rank 0's value is every rank's. ``tensorboard_dir``: write the trainer's logs (loss,
    learning rate, the loss's adaptive quantities under ``train/adaptcl/...``, dev scores under
    ``eval/...``) as TensorBoard event files there, through transformers' own
    ``TensorBoardCallback``. ``progress=False``: no progress bar (the model card's own
    included) and no printed log dicts (``disable_tqdm=True`` alone would have transformers'
    ``PrinterCallback`` print every log); the logs still reach ``history`` and the loggers.

    Raises :class:`~adaptcl.plugins.validation.NonFiniteError` with the optimisation ``step``
    when the loss meets NaN/inf embeddings (training diverged); that step computed no loss
    (``loss`` is ``None``), the message names the last logged one.

    Returns:
        dict with ``final_model`` path, ``best_dev_spearman`` (when an evaluator is given),
        ``global_step``, ``world_size``, the logged ``history`` (loss and adaptive quantities
        per log step) and the loss's name and config.
    """
    validate_text_dataset(train_dataset)
    metric = f"eval_{dev_evaluator.name}_spearman_cosine" if dev_evaluator is not None else None
    callbacks: list[Any] = [LossStateCallback(loss)]
    if tensorboard_dir is not None:
        # transformers 5 dropped TrainingArguments(logging_dir=); the callback takes its writer
        from torch.utils.tensorboard import SummaryWriter
        from transformers.integrations import TensorBoardCallback

        callbacks.append(TensorBoardCallback(SummaryWriter(log_dir=str(tensorboard_dir))))
    args = _training_arguments(config, metric, progress)
    if args.world_size > 1:  # every rank resumes from the checkpoint rank 0 found
        from accelerate.utils import broadcast_object_list

        resume_from_checkpoint = broadcast_object_list([resume_from_checkpoint], from_process=0)[0]
    with contextlib.nullcontext() if progress else quiet_model_card():  # its own bar
        trainer = AdaptiveSentenceTransformerTrainer(
            model=model, args=args, train_dataset=train_dataset,
            loss=loss, evaluator=dev_evaluator, callbacks=callbacks)
    if not progress:
        trainer.remove_callback(PrinterCallback)
    try:
        trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    except NonFiniteError as err:  # the loss met NaN embeddings: the weights diverged
        step = trainer.state.global_step + 1  # its loss was never computed: loss stays None
        logged = [h for h in trainer.state.log_history if "loss" in h]
        before = (f"; the last logged loss was {logged[-1]['loss']:.4g} at step "
                  f"{logged[-1]['step']}" if logged else "")
        raise NonFiniteError(f"{config.output_dir}: {err} at step {step}{before}",
                             step=step) from None
    final = Path(config.output_dir) / "final"
    if trainer.is_world_process_zero():  # one writer under torchrun
        model.save(str(final))
        loss.save_loss_state(final)
    log = trainer.state.log_history
    history = [h for h in log if "loss" in h or metric in h]
    scores = [h[metric] for h in log if metric in h]
    return {"final_model": str(final), "best_dev_spearman": max(scores) if scores else None,
            "world_size": int(trainer.args.world_size),
            "best_checkpoint": trainer.state.best_model_checkpoint,
            "global_step": trainer.state.global_step, "history": history,
            "config": asdict(config), "loss": type(loss).__name__,
            "loss_config": loss.get_config_dict(),
            "finite": all(math.isfinite(h.get("loss", 0.0)) for h in history)}
