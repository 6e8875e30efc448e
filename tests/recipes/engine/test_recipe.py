"""The Recipe base: the order of its hooks, the grid of a sweep, divergences in the table and
the exit, a run where every cell diverges, a process that owns no result."""

from __future__ import annotations

import json
import re

import pytest

from adaptcl.recipes.engine import DivergedError, RecipeError, Sweep
from tests.recipes.engine._toy import ToyConfig, ToyRecipe, cell

PROG = "adaptcl toy"


class Ordered(ToyRecipe):
    def prepare(self, configs) -> None:
        self.calls = ["prepare"]

    def setup(self) -> None:
        self.calls.append("setup")

    def compute(self, cell, config):
        self.calls.append(cell.label())
        return super().compute(cell, config)


class NotRankZero(ToyRecipe):
    def compute(self, cell, config):  # Lightning's non-zero ranks: trained, but rank 0 stores it
        return None


class DivergesAt(ToyRecipe):
    bad: set = set()

    def compute(self, cell, config):
        if cell.label() in self.bad:
            raise DivergedError("z0 contains NaN or inf", step=3, loss=float("nan"))
        return super().compute(cell, config)


def test_setup_runs_once_after_prepare_and_before_the_grid(tmp_path):
    recipe = Ordered(ToyConfig(output_dir=str(tmp_path), seeds=[0, 1], progress=False))
    result = recipe.run()
    assert recipe.calls == ["prepare", "setup", "d/base/seed0", "d/base/seed1"]
    assert (tmp_path / "results.json").is_file() and result["complete"]
    assert (tmp_path / "config.yaml").is_file()


def test_a_sweep_is_a_grid_axis_stored_reused_and_summarised_along(tmp_path):
    values = {"output_dir": str(tmp_path), "losses": ["base", "new"], "seeds": [0, 1, 2],
              "lr": [0.1, 0.3], "progress": False}
    first = ToyRecipe(Sweep.from_values(ToyConfig, values)).run()
    assert len(first["computed"]) == 12 and first["computed"][0] == {
        "dataset": "d", "loss": "base", "lr": 0.1, "seed": 0}
    assert (tmp_path / "runs/d/new/lr=0.3/seed2.json").is_file()
    assert list(first["summary"]["accuracy"]) == ["d, lr=0.1", "d, lr=0.3"]
    (base, new) = first["summary_along"]["lr"]["accuracy"]
    assert (base["method"], new["method"]) == ("base", "new")
    assert base["paired"]["0.3"]["mean"] == pytest.approx(100 * 0.2 * 1.0)  # 0.2 x mean seed
    assert "## accuracy along lr" in (tmp_path / "results.md").read_text()
    again = ToyRecipe(Sweep.from_values(ToyConfig, values)).run()
    assert len(again["reused"]) == 12 and again["computed"] == []


def test_diverged_cells_are_in_the_table_and_the_exit_names_them(tmp_path, capsys):
    DivergesAt.bad = {"d/new/seed1"}
    config = ToyConfig(output_dir=str(tmp_path), losses=["base", "new"], seeds=[0, 1, 2],
                       progress=False)
    result = DivergesAt(config).run()
    assert [d["cell"] for d in result["diverged"]] == [cell("d", "new", 1).as_dict()]
    stats = result["summary"]["accuracy"]["d"]["methods"]["new"]
    assert stats["n"] == 2 and stats["diverged"] == [1]
    assert "(n=2, 1 diverged)" in result["table_markdown"]
    line = ("1 of 6 runs diverged (NaN or inf; nothing stored for them): d/new/seed1 at step 3 "
            "(loss nan)")
    assert f"**DIVERGED**: {line}; left out of every mean" in (tmp_path / "results.md").read_text()
    with pytest.raises(RecipeError, match=re.escape(line)):
        DivergesAt.main(["--losses", "base", "new", "--seeds", "0", "1", "2", "--output-dir",
                         str(tmp_path), "--no-progress"], PROG)
    capsys.readouterr()


def test_a_run_where_every_cell_diverges_says_so_in_its_files(tmp_path):
    config = ToyConfig(output_dir=str(tmp_path), seeds=[0], progress=False)
    ToyRecipe(config).run()
    stale = json.loads((tmp_path / "results.json").read_text())
    assert stale["computed"]
    DivergesAt.bad = {"d/base/seed0"}
    with pytest.raises(DivergedError, match="1 of 1 run diverged"):
        DivergesAt(ToyConfig(output_dir=str(tmp_path), seeds=[0], lr=0.2, progress=False)).run()
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["diverged"][0]["cell"] == cell("d", "base", 0).as_dict()
    assert written["runs"] == [] and written["computed"] == []  # not the old file
    assert "**DIVERGED**" in (tmp_path / "results.md").read_text()


def test_a_process_owning_no_result_writes_and_prints_nothing(tmp_path, capsys):
    assert NotRankZero(ToyConfig(output_dir=str(tmp_path), progress=False)).run() == {}
    assert not list(tmp_path.glob("results.*"))
    assert NotRankZero.main(["--output-dir", str(tmp_path), "--no-progress"], PROG) == 0
    assert capsys.readouterr().out == "" and not list(tmp_path.glob("results.*"))


def test_the_table_says_when_the_folder_holds_other_commands_runs(tmp_path):
    ToyRecipe(ToyConfig(output_dir=str(tmp_path), seeds=[0, 1], progress=False)).run()
    result = ToyRecipe(ToyConfig(output_dir=str(tmp_path), seeds=[2, 3], progress=False)).run()
    assert result["other_stored_runs"] == 2  # seeds 0 and 1, stored by the first command
    assert f"{tmp_path / 'runs'} also holds 2 runs of other commands" in (
        tmp_path / "results.md").read_text()
    again = ToyRecipe(ToyConfig(output_dir=str(tmp_path), seeds=[0, 1, 2, 3],
                                progress=False)).run()
    assert again["other_stored_runs"] == 0 and len(again["reused"]) == 4
