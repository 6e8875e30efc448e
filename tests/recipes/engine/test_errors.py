"""The checks that refuse a trained model's embeddings."""

from __future__ import annotations

import pytest

from adaptcl.recipes.engine.errors import DivergedError, NonResultError, trained_embeddings


def test_non_finite_or_constant_embeddings_are_refused():
    import numpy as np

    good = np.random.default_rng(0).normal(size=(5, 3))
    trained_embeddings(good, "ok")
    nan = good.copy()
    nan[2, 1] = np.nan
    with pytest.raises(DivergedError, match="1 embeddings contain NaN"):
        trained_embeddings(nan, "encoder x")
    with pytest.raises(NonResultError, match="same vector"):
        trained_embeddings(np.ones((5, 3)), "encoder x")
