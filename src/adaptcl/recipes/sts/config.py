"""The settings of ``adaptcl sts``: the shared encoder settings, the STS tasks, and the
sentence-transformers cross-check."""

from __future__ import annotations

from dataclasses import dataclass

from adaptcl.evaluation.senteval.sts import STS_TASKS
from adaptcl.recipes.common.encoder_eval import EncoderEvalConfig
from adaptcl.recipes.engine import options
from adaptcl.recipes.engine.settings import setting


@dataclass
class STSConfig(EncoderEvalConfig):
    """Settings of ``sts`` (see :mod:`adaptcl.recipes.sts.recipe` and
    :class:`~adaptcl.recipes.common.encoder_eval.EncoderEvalConfig`).

    Example:
        >>> STSConfig(model="m:f", tasks=["sts12", "stsbenchmark"]).tasks
        ['STS12', 'STSBenchmark']
    """

    output_dir: str = options.output_dir("results/sts")
    tasks: list[str] = setting(factory=lambda: list(STS_TASKS), choices=STS_TASKS, axis="task",
                               help="tasks to evaluate (case-insensitive)")
    st_evaluator_check: bool = setting(False, identity=False, help="also score STS-B test with "
                                       "sentence-transformers' EmbeddingSimilarityEvaluator "
                                       "(sentence-transformers models only)")
