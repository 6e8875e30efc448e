"""The embedding check every evaluation protocol applies: NaN/inf is a NonFiniteError, a collapsed
or empty set of embeddings a plain ValueError, each naming what was checked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaptcl.evaluation.checks import check_embeddings
from adaptcl.plugins.validation import NonFiniteError


def test_finite_varied_embeddings_pass_as_array_or_tensor():
    good = np.random.default_rng(0).normal(size=(5, 3))
    check_embeddings(good, "ok")
    check_embeddings(torch.from_numpy(good).requires_grad_(), "ok")
    check_embeddings(np.ones((5, 3)), "scores", allow_constant=True)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_embeddings_are_a_non_finite_error_counting_the_rows(bad):
    x = np.random.default_rng(0).normal(size=(5, 3))
    x[2, 1] = x[4, 0] = bad
    with pytest.raises(NonFiniteError, match=r"^encoder x: 2 embeddings contain NaN or inf$"):
        check_embeddings(torch.from_numpy(x), "encoder x")


def test_empty_or_constant_embeddings_are_a_plain_value_error():
    with pytest.raises(ValueError, match="^e: no embeddings$") as empty:
        check_embeddings(np.zeros((0, 4)), "e")
    with pytest.raises(ValueError, match=r"^e: every embedding is the same vector \(a collapsed or "
                                         r"constant encoder\)$") as same:
        check_embeddings(np.full((4, 3), 0.5), "e")
    assert not isinstance(empty.value, NonFiniteError)
    assert not isinstance(same.value, NonFiniteError)
    check_embeddings(np.full((1, 3), 0.5), "one row is not a collapse")
