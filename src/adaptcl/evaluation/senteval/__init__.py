"""SentEval's tasks for sentence encoders (Conneau & Kiela, 2018), as SimCSE runs them (Gao et al., 2021).

* :mod:`~adaptcl.evaluation.senteval.data`: readers of SentEval's ``data/downstream`` files;
* :mod:`~adaptcl.evaluation.senteval.encoders`: any model or callable as a batched, checked
  ``encode(list[str])`` with a verified disk cache;
* :mod:`~adaptcl.evaluation.senteval.sts`: STS12-16, STS-B and SICK-R from cosine similarities;
* :mod:`~adaptcl.evaluation.senteval.transfer`: MR, CR, SUBJ, MPQA, SST2, TREC and MRPC with
  SentEval's logistic-regression probe.
"""
