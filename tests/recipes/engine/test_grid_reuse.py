"""Forced recomputation (``reuse=False``, what ``--no-cache`` asks for), and a stored run reused
wherever the grid holds the same run: a setting given one value then swept, or the reverse."""

from __future__ import annotations

import json

from adaptcl.recipes.engine.errors import DivergedError
from adaptcl.recipes.engine.grid import run_grid
from adaptcl.recipes.engine.store import RunStore
from tests.recipes.engine._toy import ToyRecipe
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


def _toy(out, *argv):
    """``adaptcl toy`` into ``out`` (seed 0): its result JSON."""
    assert ToyRecipe.main(["--output-dir", str(out), "--seeds", "0", "--no-progress", *argv],
                          "adaptcl toy") == 0
    return json.loads((out / "results.json").read_text())


def test_a_single_valued_run_is_reused_when_its_setting_becomes_an_axis(tmp_path, capsys):
    """``--lr 0.2`` stores ``d/base/seed0``; ``--lr 0.2 0.3`` holds the same run as its cell
    ``lr=0.2``: reused and stored there too (``same_as``), its record as it was; only ``lr=0.3``
    is computed. Another identity (``--lr 0.4``) is not taken for it."""
    _toy(tmp_path, "--lr", "0.2")
    swept = _toy(tmp_path, "--lr", "0.2", "0.3")
    assert swept["reused"] == [{"dataset": "d", "loss": "base", "lr": 0.2, "seed": 0}]
    assert swept["computed"] == [{"dataset": "d", "loss": "base", "lr": 0.3, "seed": 0}]
    stored = json.loads((tmp_path / "runs/d/base/lr=0.2/seed0.json").read_text())
    first = json.loads((tmp_path / "runs/d/base/seed0.json").read_text())
    assert stored["identity_hash"] == first["identity_hash"]
    assert stored["record"] == first["record"] | {"same_as": "d/base/seed0"}
    assert _toy(tmp_path, "--lr", "0.2", "0.3")["reused"] == swept["reused"] + swept["computed"]
    assert _toy(tmp_path, "--lr", "0.4")["computed"] == [{"dataset": "d", "loss": "base",
                                                         "seed": 0}]


def test_a_swept_run_is_reused_when_its_settings_are_given_one_value(tmp_path, capsys):
    """The reverse, through two swept settings: ``--lr 0.2 0.3 --width 4 8`` stores
    ``d/base/lr=0.2/width=8/seed0``, which ``--lr 0.2 --width 8`` and ``--lr 0.2 0.3 --width 8``
    reuse."""
    _toy(tmp_path, "--lr", "0.2", "0.3", "--width", "4", "8")
    single = _toy(tmp_path, "--lr", "0.2", "--width", "8")
    assert single["reused"] == [{"dataset": "d", "loss": "base", "seed": 0}]
    assert single["runs"][0]["same_as"] == "d/base/lr=0.2/width=8/seed0"
    one_axis = _toy(tmp_path, "--lr", "0.2", "0.3", "--width", "8")
    assert len(one_axis["reused"]) == 2 and not one_axis["computed"]
