"""Forced recomputation (``reuse=False``, what ``--no-cache`` asks for)."""

from __future__ import annotations

import json

from adaptcl.recipes.engine.errors import DivergedError
from adaptcl.recipes.engine.grid import run_grid
from adaptcl.recipes.engine.store import RunStore
from tests.recipes.engine._toy import cell as _cell

CELLS = [_cell("d", "m", 0), _cell("d", "m", 1)]


def _grid(out, acc, *, reuse=True, diverge=()):
    calls = []

    def compute(cell):
        calls.append(cell)
        if cell in diverge:
            raise DivergedError("boom", step=1, loss=float("nan"))
        return {"metrics": {"acc": acc}, "optimisation_steps": 1, "train_seconds": 0.0}

    grid = run_grid("toy", out, CELLS, identity=lambda c: {"lr": 0.1}, compute=compute,
                    progress_bar=False, reuse=reuse)
    return grid, calls


def test_reuse_false_recomputes_stored_cells_and_keeps_the_old_records_aside(tmp_path):
    _grid(tmp_path, 0.25)
    again, calls = _grid(tmp_path, 0.5)
    assert calls == [] and again.reused == CELLS  # by default: reused
    forced, calls = _grid(tmp_path, 0.75, reuse=False)
    assert calls == CELLS and forced.computed == CELLS and forced.reused == []
    assert [r["metrics"]["acc"] for r in forced.records.values()] == [0.75, 0.75]
    store = RunStore(tmp_path)
    assert json.loads(store.path(CELLS[0]).read_text())["record"]["metrics"]["acc"] == 0.75
    assert len(forced.superseded) == 2
    assert all(json.loads(open(p).read())["record"]["metrics"]["acc"] == 0.25
               for p in forced.superseded)


def test_a_forced_cell_that_diverges_keeps_its_stored_record(tmp_path):
    _grid(tmp_path, 0.25)
    forced, calls = _grid(tmp_path, 0.75, reuse=False, diverge=[CELLS[1]])
    assert calls == CELLS and list(forced.diverged) == [CELLS[1]]
    assert CELLS[1] not in forced.records and len(forced.superseded) == 1
    stored = json.loads(RunStore(tmp_path).path(CELLS[1]).read_text())
    assert stored["record"]["metrics"]["acc"] == 0.25
