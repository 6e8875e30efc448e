"""A grid's cells and the one layout of every path under ``--output-dir``."""

from __future__ import annotations

import pytest

from adaptcl.recipes.engine.cells import Cell, RunLayout


def test_a_cell_reads_its_axes_and_swept_settings_by_name():
    cell = Cell((("dataset", "MUTAG"), ("loss", "macl")), 3, (("temperature", 0.1),))
    assert (cell.dataset, cell.loss, cell.temperature, cell.seed) == ("MUTAG", "macl", 0.1, 3)
    assert (cell.row, cell.column) == ("MUTAG", "macl")
    assert cell.label() == "MUTAG/macl/temperature=0.1/seed3"
    with pytest.raises(AttributeError, match="has no axis 'init'"):
        _ = cell.init


def test_a_cell_as_json():
    cell = Cell((("task", "STS12"), ("encoder", "bow")), 0, (("pooler", None),))
    values = cell.as_dict()
    assert values == {"task": "STS12", "encoder": "bow", "pooler": None, "seed": 0}
    assert cell.label() == "STS12/bow/pooler=none/seed0"


def test_cells_are_equal_hashable_and_distinct_by_point():
    a = Cell((("dataset", "d"), ("loss", "m")), 0)
    assert a == Cell((("dataset", "d"), ("loss", "m")), 0)
    assert len({a, Cell(a.axes, 0, (("lr", 0.1),)), Cell(a.axes, 0, (("lr", 0.2),))}) == 3


def test_every_path_under_the_output_folder_comes_from_the_layout(tmp_path):
    layout = RunLayout(tmp_path)
    cell = Cell((("dataset", "d"), ("loss", "m")), 1, (("lr", 0.5),))
    assert layout.record(cell) == tmp_path / "runs/d/m/lr=0.5/seed1.json"
    assert layout.lock(cell) == tmp_path / "runs/.locks/d/m/lr=0.5/seed1.lock"
    assert layout.cell_folder("logs", cell) == tmp_path / "logs/d/m/lr=0.5/seed1"
    assert layout.superseded("T") == tmp_path / "runs/superseded/T"
    assert (layout.results("json"), layout.config) == (tmp_path / "results.json",
                                                       tmp_path / "config.yaml")
    assert layout.jobs == tmp_path / "jobs/%j" and layout.folder("cache") == tmp_path / "cache"
