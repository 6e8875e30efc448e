"""What ``torch.compile`` reads once, while tracing, instead of breaking the graph."""

from __future__ import annotations


def constant_under_compile(fn):
    """Mark ``fn`` as :func:`torch.compiler.assume_constant_result` does (it sets this one
    attribute), without its ``import torch._dynamo``: that import would add about 2 s to every
    ``import adaptcl.plugins``. ``tests/plugins/test_budget.py`` checks that the public
    decorator still marks functions this way."""
    fn._dynamo_marked_constant = True
    return fn
