"""The grid's cells through the Python API: duplicates run once, seeds in numpy's range."""

from __future__ import annotations

import pytest

from adaptcl.recipes.template.errors import RecipeError
from adaptcl.recipes.template.store import Cell, run_grid


def _compute(calls):
    def compute(cell):
        calls.append(cell)
        return {"metrics": {"acc": 0.5}, "optimisation_steps": 1, "train_seconds": 0.0}

    return compute


def test_a_cell_listed_twice_is_computed_once(tmp_path, capsys):
    a, b = Cell("MUTAG", "dcl", 0), Cell("MUTAG", "dcl", 1)
    calls: list = []
    grid = run_grid("toy", tmp_path, [a, b, a, a], identity=lambda c: {}, compute=_compute(calls),
                    progress_bar=False)
    assert calls == [a, b] and grid.cells == [a, b] and grid.complete
    assert capsys.readouterr().err == ("adaptcl: note: 1 runs are listed more than once "
                                       "(MUTAG/dcl/seed0); running each once\n")


@pytest.mark.parametrize("seed", [-1, 2**32, 1.5, "3", True])
def test_a_seed_outside_numpys_range_is_refused_before_anything_runs(tmp_path, seed):
    calls: list = []
    cells = [Cell("d", "m", 0), Cell("d", "m", seed)]
    with pytest.raises(RecipeError) as info:
        run_grid("toy", tmp_path, cells, identity=lambda c: {}, compute=_compute(calls),
                 progress_bar=False)
    message = str(info.value)
    assert message.startswith(f"d/m/seed{seed}: seed ") and "seeds are integers in [0, 2**32 - 1]" \
        in message and "\n" not in message
    assert calls == [] and not list(tmp_path.iterdir())  # nothing computed or written


def test_the_largest_seed_numpy_takes_is_accepted(tmp_path):
    import numpy as np

    np.random.default_rng(2**32 - 1)
    np.random.RandomState(2**32 - 1)
    grid = run_grid("toy", tmp_path, [Cell("d", "m", np.int64(2**32 - 1))], identity=lambda c: {},
                    compute=_compute([]), progress_bar=False)
    assert grid.complete
