"""SimCSE's poolers and the losses its training takes, by name.

Imports no framework, so a command line lists them (``--help``) without loading
sentence-transformers; :func:`adaptcl.adapters.sentence_transformers.build_simcse_model` and
:func:`~adaptcl.adapters.sentence_transformers.make_loss` build what they name.
"""

from __future__ import annotations

__all__ = ["LOSSES", "POOLERS"]

#: SimCSE's poolers (Gao et al. 2021): the CLS vector with (``cls``) or without
#: (``cls_before_pooler``) the training-only MLP, the mean of the last layer's tokens (``avg``),
#: of the first and last layers' (``avg_first_last``) and of the last two layers' (``avg_top2``).
POOLERS = ("cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2")
#: the losses :func:`~adaptcl.adapters.sentence_transformers.make_loss` builds (InfoNCE is SimCSE)
LOSSES = ("infonce", "macl", "ascl", "amcl")
