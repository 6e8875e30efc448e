"""A diverged cell in a grid: recorded with its step and loss, nothing stored, the grid goes on."""

from __future__ import annotations

import json
import math

import pytest

from adaptcl.plugins.validation import NonFiniteError
from adaptcl.recipes.engine.errors import DivergedError, NonResultError
from adaptcl.recipes.engine.files import write_json_atomic
from adaptcl.recipes.engine.grid import run_grid
from adaptcl.recipes.engine.store import RunStore
from tests.recipes.engine._toy import cell as _cell


def _record(acc: float, steps: int = 3, losses=None) -> dict:
    record = {"metrics": {"acc": acc}, "optimisation_steps": steps, "train_seconds": 1.0}
    if losses is not None:
        record["losses"] = losses
    return record


CELLS = [_cell("d", "m", s) for s in range(4)]


def _compute(cell) -> dict:
    if cell.seed == 1:  # a template check (or a recipe) saw it
        raise DivergedError("d/m/seed1: loss became NaN", step=7, loss=math.nan)
    if cell.seed == 2:  # the core loss's own check, raised inside a training loop
        raise NonFiniteError("z0 contains NaN or inf", step=3, loss=math.inf)
    if cell.seed == 3:  # a record check_record refuses: a non-finite loss at step 2
        return _record(0.5, losses=[1.0, math.nan, 2.0])
    return _record(0.5)


def test_diverged_cells_are_recorded_not_stored_and_the_grid_goes_on(tmp_path):
    calls = []
    grid = run_grid("toy", tmp_path, CELLS, identity=lambda c: {"lr": 1e30},
                    compute=lambda c: calls.append(c) or _compute(c),
                    on_record=lambda g: calls.append("on_record"), progress_bar=False)
    assert calls == [CELLS[0], "on_record", CELLS[1], "on_record", CELLS[2], "on_record",
                     CELLS[3], "on_record"]
    assert grid.computed == [CELLS[0]] and list(grid.records) == [CELLS[0]]
    assert not grid.complete
    assert list(grid.diverged) == CELLS[1:]
    assert grid.diverged[CELLS[1]]["step"] == 7 and math.isnan(grid.diverged[CELLS[1]]["loss"])
    assert grid.diverged[CELLS[2]] == {"step": 3, "loss": math.inf,
                                       "message": "z0 contains NaN or inf"}
    assert grid.diverged[CELLS[3]]["step"] == 2 and math.isnan(grid.diverged[CELLS[3]]["loss"])
    assert "d/m/seed3: non-finite training loss at step 2" in grid.diverged[CELLS[3]]["message"]
    store = RunStore(tmp_path)
    assert store.path(CELLS[0]).is_file()
    assert not any(store.path(c).exists() for c in CELLS[1:])

    book = grid.bookkeeping()
    assert book["complete"] is False and book["partial"] is True and book["missing"] == []
    assert book["diverged"] == [
        {"cell": {"dataset": "d", "loss": "m", "seed": 1}, "step": 7, "loss": "nan", "message": "d/m/seed1: loss became NaN"},
        {"cell": {"dataset": "d", "loss": "m", "seed": 2}, "step": 3, "loss": "inf", "message": "z0 contains NaN or inf"},
        {"cell": {"dataset": "d", "loss": "m", "seed": 3}, "step": 2, "loss": "nan",
         "message": grid.diverged[CELLS[3]]["message"]}]
    write_json_atomic(tmp_path / "r.json", book)  # strict JSON: no bare NaN
    assert json.loads((tmp_path / "r.json").read_text())["diverged"][0]["loss"] == "nan"

    err = grid.diverged_error()
    assert isinstance(err, DivergedError) and err.step == 7 and math.isnan(err.loss)
    assert str(err) == ("3 of 4 runs diverged (NaN or inf; nothing stored for them): d/m/seed1 at "
                        "step 7 (loss nan), d/m/seed2 at step 3 (loss inf), d/m/seed3 at step 2 "
                        "(loss nan)")
    assert "\n" not in str(err)

    # the next invocation reuses what was stored and tries the diverged cells again
    again = run_grid("toy", tmp_path, CELLS, identity=lambda c: {"lr": 1e30},
                     compute=_compute, progress_bar=False)
    assert again.reused == [CELLS[0]] and list(again.diverged) == CELLS[1:]


def test_unknown_step_and_loss_are_none_and_a_finite_loss_stays_a_number(tmp_path):
    def compute(cell):
        if cell.seed == 0:
            raise NonFiniteError("z1 contains NaN or inf")  # a plain check: no step known
        raise DivergedError("exploded", step=2, loss=3.5e38)

    grid = run_grid("toy", tmp_path, CELLS[:2], identity=lambda c: {}, compute=compute,
                    progress_bar=False)
    assert [d["step"] for d in grid.bookkeeping()["diverged"]] == [None, 2]
    assert [d["loss"] for d in grid.bookkeeping()["diverged"]] == [None, 3.5e38]
    assert str(grid.diverged_error()).endswith(": d/m/seed0, d/m/seed1 at step 2 (loss 3.5e+38)")
    assert run_grid("toy", tmp_path, CELLS[2:3], identity=lambda c: {},
                    compute=lambda c: _record(0.1), progress_bar=False).diverged_error() is None


def test_other_non_results_still_stop_the_whole_run(tmp_path):
    seen = []

    def compute(cell):
        seen.append(cell)
        return _record(0.5, steps=0)  # no optimisation step: a mistake, not a divergence

    with pytest.raises(NonResultError, match="no optimisation step"):
        run_grid("toy", tmp_path, CELLS, identity=lambda c: {}, compute=compute,
                 progress_bar=False)
    assert seen == CELLS[:1]


def test_progress_bar_counts_diverged_cells(tmp_path, monkeypatch):
    from adaptcl.recipes.engine import grid as grid_module

    notes = []

    class Bar:
        def __init__(self, **kwargs):
            self.n = 0

        def set_postfix_str(self, text):
            notes.append(text)

        def update(self, n=1):
            self.n += n

        def close(self):
            notes.append(f"closed at {self.n}")

    monkeypatch.setattr(grid_module, "progress", lambda **kw: Bar(**kw))
    run_grid("toy", tmp_path, CELLS, identity=lambda c: {}, compute=_compute)
    assert notes == ["d/m/seed0", "d/m/seed1", "d/m/seed2, 1 diverged", "d/m/seed3, 2 diverged",
                     "3 diverged", "closed at 4"]
