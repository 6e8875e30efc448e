"""The settings of ``adaptcl transfer``: the encoder's, the tasks, the classifier seeds and
SentEval's probe (the ``"protocol"`` part of a run's identity)."""

from __future__ import annotations

from dataclasses import dataclass

from adaptcl.evaluation.senteval.transfer import (
    CLASSIFIERS,
    MRPC_FEATURES,
    PARAM_SETS,
    TRANSFER_TASKS,
    Probe,
)
from adaptcl.recipes.common.encoder_eval import EncoderEvalConfig
from adaptcl.recipes.engine import options
from adaptcl.recipes.engine.settings import at_least, check_settings, setting

BACKENDS = ("adaptcl", "senteval")


@dataclass
class TransferConfig(EncoderEvalConfig):
    """Settings of ``transfer`` (see :mod:`adaptcl.recipes.transfer.recipe` and
    :class:`~adaptcl.recipes.common.encoder_eval.EncoderEvalConfig`).

    Example:
        >>> TransferConfig(model="m:f", tasks=["mr", "trec"]).probe(1111).k
        5
    """

    output_dir: str = options.output_dir("results/transfer")
    tasks: list[str] = setting(factory=lambda: list(TRANSFER_TASKS), choices=TRANSFER_TASKS,
                               axis="task", help="tasks to evaluate (case-insensitive)")
    seeds: list[int] = setting(factory=lambda: [1111], axis="seed", help="seeds of the folds, "
                               "the classifier and the subsamples (SentEval's 1111), integers "
                               "in [0, 2**32 - 1]")
    params: str = setting("fasttest", choices=tuple(PARAM_SETS), identity="protocol",
                          help="SimCSE's parameter set: test (10-fold, adam) or fasttest "
                          "(5-fold, rmsprop)")
    classifier: str = setting("torch", choices=CLASSIFIERS, identity="protocol",
                              help="torch: SentEval's logistic regression (usepytorch=True); "
                              "sklearn: LogisticRegression over SentEval's C grid")
    backend: str = setting("adaptcl", choices=BACKENDS, identity="protocol",
                           help="senteval: run SentEval itself (needs the senteval package)")
    kfold: int | None = setting(None, check=at_least(2), identity="protocol",
                                help="override the parameter set's k")
    mrpc_features: str = setting("senteval", choices=MRPC_FEATURES, identity="protocol",
                                 help="senteval: [|u-v|, u*v]; full: [u, v, |u-v|, u*v]")
    limit: int | None = setting(None, check=at_least(10), identity="protocol",
                                help="subsample every split to at most N examples (smoke "
                                "tests only)")

    def __post_init__(self) -> None:
        check_settings(self)
        if self.backend == "senteval" and len(self.seeds) > 1:
            raise ValueError("backend='senteval' runs one seed; pass a single seed")

    def probe(self, seed: int) -> Probe:
        """The protocol of one cell (seed ``seed``)."""
        return Probe(params=self.params, classifier=self.classifier, kfold=self.kfold,
                     mrpc_features=self.mrpc_features, limit=self.limit, seed=int(seed))
