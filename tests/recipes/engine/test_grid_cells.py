"""The grid's cells through the Python API: duplicates run once, seeds in numpy's range, grid
order whatever order jobs finish in."""

from __future__ import annotations

import pytest

from adaptcl.recipes.engine.errors import RecipeError
from adaptcl.recipes.engine.grid import run_grid
from tests.recipes.engine._toy import cell as Cell


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
    assert capsys.readouterr().err == ("adaptcl: note: 1 run listed more than once "
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


class _LastFirstJobs:
    """A stand-in for the submitit runner (one cell per job here) whose jobs finish in reverse
    order (the last cell first), as jobs on a busy machine may: only the order of completion
    is scripted here; the real engine is exercised in ``test_jobs.py``."""

    max_jobs = 8

    def __init__(self, store_root):
        from types import SimpleNamespace

        from adaptcl.recipes.engine.store import RunStore

        self.store, self.running, self.finished = RunStore(store_root), [], []
        self.folder = store_root / "jobs" / "%j"
        self.options = SimpleNamespace(where="scripted")

    def describe(self, todo: int) -> str:
        return f"scripted ({todo})"

    def chunks(self, todo):
        return [[cell] for cell in todo]

    def submit(self, chunk, identities):
        runner, (cell,) = self, chunk
        runner.running.append(cell)

        class Job:
            job_id = f"job-{cell.seed}"

            def done(self) -> bool:  # only the last cell still running is done
                return cell == runner.running[-1]

            def result(self) -> dict:
                runner.running.remove(cell)
                runner.finished.append(cell)
                runner.store.save(cell, identities[cell], {"metrics": {"acc": 0.5},
                                                           "optimisation_steps": 1,
                                                           "train_seconds": 0.0})
                return {"cells": {cell.label(): {"status": "computed", "diverged": None}},
                        "superseded": [], "ready_at": 0.0, "compute_seconds": 0.0}

        return Job()


def test_the_grid_lists_its_cells_in_grid_order_whatever_order_jobs_finish_in(tmp_path):
    cells = [Cell("MUTAG", "dcl", s) for s in range(3)]
    jobs = _LastFirstJobs(tmp_path)
    grid = run_grid("toy", tmp_path, cells, identity=lambda c: {}, compute=None, jobs=jobs,
                    progress_bar=False)
    assert jobs.finished == cells[::-1]  # seed 2 finished first
    assert grid.computed == cells and list(grid.records) == cells
    assert grid.bookkeeping()["computed"] == [c.as_dict() for c in cells]  # results.json's list
