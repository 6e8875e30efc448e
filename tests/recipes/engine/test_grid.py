"""Running a grid: a stored record of the same identity is reused, another is set aside and
recomputed, an unreadable one is named; a record that is no result is refused."""

from __future__ import annotations

import json
import math

import pytest

from adaptcl.recipes.engine.errors import NonResultError
from adaptcl.recipes.engine.grid import run_grid
from adaptcl.recipes.engine.store import RunStore
from tests.recipes.engine._toy import cell as Cell


def _record(acc: float, steps: int = 4) -> dict:
    return {"metrics": {"acc": acc}, "optimisation_steps": steps, "train_seconds": 1.5}


def _grid(out, cells, identity, compute):
    return run_grid("toy", out, cells, identity=lambda c: identity, compute=compute,
                    progress_bar=False)


def test_same_identity_reuses_stored_runs_and_says_so(tmp_path):
    cells = [Cell("d", "base", 0), Cell("d", "base", 1)]
    first = _grid(tmp_path, cells, {"lr": 0.1}, lambda c: _record(0.5 + c.seed))
    assert first.computed == cells and first.reused == []

    def boom(cell):
        raise AssertionError("a stored run with the same identity was recomputed")

    again = _grid(tmp_path, cells, {"lr": 0.1}, boom)
    assert again.reused == cells and again.computed == []
    assert again.records[cells[1]]["metrics"]["acc"] == 1.5
    assert again.bookkeeping()["reused"] == [c.as_dict() for c in cells]
    assert again.bookkeeping()["total_train_seconds"] == 3.0


def test_changed_identity_recomputes_and_keeps_the_old_record_aside(tmp_path):
    cell = Cell("d", "base", 0)
    _grid(tmp_path, [cell], {"data": "aaa"}, lambda c: _record(0.25))
    changed = _grid(tmp_path, [cell], {"data": "bbb"}, lambda c: _record(0.75))
    assert changed.computed == [cell] and changed.reused == []
    assert changed.records[cell]["metrics"]["acc"] == 0.75
    (aside,) = changed.superseded
    assert json.loads(open(aside).read())["record"]["metrics"]["acc"] == 0.25
    assert "superseded" in aside


@pytest.mark.parametrize("content", ['{"identity": {"lr"', '[1, 2]', '{"identity_hash": "x"}'],
                         ids=["truncated", "not-a-record", "no-record"])
def test_unreadable_record_is_named_set_aside_and_recomputed(tmp_path, capsys, content):
    cell = Cell("d", "base", 0)
    path = RunStore(tmp_path).path(cell)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    grid = _grid(tmp_path, [cell], {"lr": 1}, lambda c: _record(0.5))
    assert grid.computed == [cell]
    (aside,) = grid.superseded
    assert open(aside).read() == content
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"adaptcl: run record at {path} is corrupt or truncated (")
    assert err.endswith(f"); moved to {aside} and recomputed\n")


def test_a_record_of_other_settings_is_superseded_without_a_corruption_note(tmp_path, capsys):
    cell = Cell("d", "base", 0)
    _grid(tmp_path, [cell], {"lr": 1}, lambda c: _record(0.5))
    assert len(_grid(tmp_path, [cell], {"lr": 2}, lambda c: _record(0.5)).superseded) == 1
    assert "corrupt" not in capsys.readouterr().err


def test_run_without_optimisation_step_is_refused_and_not_stored(tmp_path):
    cell = Cell("d", "macl", 0)
    with pytest.raises(NonResultError, match="no optimisation step"):
        _grid(tmp_path, [cell], {}, lambda c: _record(0.86, steps=0))
    assert not RunStore(tmp_path).path(cell).exists()


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_metric_is_refused(tmp_path, bad):
    cell = Cell("d", "m", 0)
    grid = _grid(tmp_path, [cell], {}, lambda c: _record(bad))
    assert "non-finite metrics" in grid.diverged[cell]["message"] and not grid.records
    assert not RunStore(tmp_path).path(cell).exists()


def test_a_record_of_an_older_code_version_is_recomputed_with_one_note(tmp_path, capsys):
    cell = Cell("d", "base", 0)
    _grid(tmp_path, [cell], {"code": "v1"}, lambda c: _record(0.5))
    assert capsys.readouterr().err == ""
    again = _grid(tmp_path, [cell], {"code": "v2"}, lambda c: _record(0.5))
    assert again.computed == [cell]
    assert capsys.readouterr().err == (
        "adaptcl: note: 1 run stored with another identity (settings, data or code) will be "
        f"computed again; the old records are kept under {tmp_path / 'runs' / 'superseded'}\n")
