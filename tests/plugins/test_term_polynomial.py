"""The fused kernels' polynomial for DySTreSS's temperature (``_triton_rowstats.E0`` ..
``E5``): ``sin(pi sqrt(w) / 2)^2 / w`` on ``0 <= w <= 1.0404``, refitted here by the procedure
its comment names (iteratively reweighted least squares towards the minimax fit), in float64.
The kernels' float32 values are checked against DySTreSS under the interpreter
(``interpreted_fused.py``); this pins where the coefficients come from and how close they are."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("triton", reason="the coefficients live in the Triton kernels' module")

from adaptcl.plugins.tiles import _triton_rowstats as K  # noqa: E402 - after the skip

WIDEST = 1.0404  # (1.02)^2: cosines and the products that round a little past 1


def _share(w: np.ndarray) -> np.ndarray:
    """``sin(pi sqrt(w) / 2)^2 / w``, ``(pi / 2)^2`` at 0."""
    safe = np.where(w > 0, w, 1.0)
    return np.where(w > 0, np.sin(math.pi * np.sqrt(safe) / 2) ** 2 / safe, (math.pi / 2) ** 2)


def _refit(degree: int = 5, nodes: int = 400, rounds: int = 80) -> np.ndarray:
    """Least squares at Chebyshev nodes, each node reweighted towards the largest error."""
    x = (np.cos(math.pi * (np.arange(nodes) + 0.5) / nodes) * 0.5 + 0.5) * WIDEST
    weight = np.ones(nodes)
    for _ in range(rounds):
        c = np.linalg.lstsq(np.vander(x, degree + 1) * weight[:, None], _share(x) * weight,
                            rcond=None)[0]
        err = np.abs(np.polyval(c, x) - _share(x))
        weight = weight * (err / err.max() + 1e-3) ** 0.3
        weight /= weight.max()
    return c[::-1]


def _stored() -> np.ndarray:
    return np.array([float(getattr(K, f"E{i}").value) for i in range(6)])


def test_the_coefficients_are_the_documented_fit_to_float32_accuracy():
    grid = np.linspace(0.0, WIDEST, 200_001)
    stored = _stored()
    error = np.abs(np.polyval(stored[::-1], grid) - _share(grid)).max()
    assert error < 3e-8, error  # below float32's half ulp of the share's largest values
    np.testing.assert_allclose(stored, _refit(), rtol=1e-6, atol=1e-9)


def test_one_degree_less_would_not_be_float32_accurate():
    """Why degree 5: the same fit at degree 4 is 50 times further off."""
    grid = np.linspace(0.0, WIDEST, 200_001)
    error = np.abs(np.polyval(_refit(4)[::-1], grid) - _share(grid)).max()
    assert error > 1e-6, error
