"""Evaluation protocols for frozen encoders, usable without the recipes.

What the recipes score their encoders with, as a library (the way Lightly keeps its kNN and
linear-probe benchmarks in ``lightly.utils.benchmarking``):

* :mod:`adaptcl.evaluation.senteval`: SentEval's tasks for sentence encoders: the data
  readers (:mod:`~adaptcl.evaluation.senteval.data`), sentence encoders with an embedding cache
  (:mod:`~adaptcl.evaluation.senteval.encoders`), the STS protocol
  (:mod:`~adaptcl.evaluation.senteval.sts`) and the transfer tasks' logistic-regression probe
  (:mod:`~adaptcl.evaluation.senteval.transfer`);
* :mod:`adaptcl.evaluation.images`: weighted kNN and a linear probe on image-backbone features;
* :mod:`adaptcl.evaluation.clip`: zero-shot top-1 (CLIP's prompt ensembling) and image/text
  R@1 of a CLIP model;
* :mod:`adaptcl.evaluation.graphs`: the SVM cross-validation of graph embeddings and the
  multi-task ROC-AUC of molecule fine-tuning;
* :mod:`adaptcl.evaluation.checks`: the refusal of NaN/inf or constant embeddings that every
  protocol applies before scoring.

Dependency direction: the recipes import this package, and it imports the adapters and the loss
core, never :mod:`adaptcl.recipes`. Its refusals are ``ValueError``\\s
(:class:`~adaptcl.plugins.validation.NonFiniteError` for NaN/inf); a recipe turns them into its
own errors.
"""
