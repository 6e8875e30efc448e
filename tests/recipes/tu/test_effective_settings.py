"""``adaptcl tu``: a cell's identity holds what determines its numbers, the same for the cells
this change leaves alone; a temperature schedule that cannot move is refused."""

from __future__ import annotations

import pytest

from adaptcl import cli
from adaptcl.recipes.engine.provenance import stable_hash
from adaptcl.recipes.engine.sweep import Sweep
from adaptcl.recipes.tu.config import TUConfig
from adaptcl.recipes.tu.recipe import TURecipe

#: the identity hash of MUTAG/macl/seed0 of ``tu --losses macl --alpha 0.5`` (code version and
#: fingerprint fixed below), computed with main's code at a5ec071, before settings declared
#: the losses that read them: records stored then are reused
MAIN_MACL_HASH = "8c8ef4e631922a8e"


def _recipe(**values) -> TURecipe:
    recipe = TURecipe(Sweep.from_values(TUConfig, {"seeds": [0], **values}))
    recipe.fingerprints = {"MUTAG": {"sha256": "f" * 64}}  # what prepare reads from the data
    return recipe


def test_an_unaffected_cell_keeps_the_identity_hash_it_had_on_main():
    recipe = _recipe(losses=["macl"], alpha=0.5)
    assert stable_hash(recipe.identity_of(recipe.cell("MUTAG", "macl", 0))) == MAIN_MACL_HASH
    swept = _recipe(losses=["graphcl", "macl"], alpha=[0.5, 1.0])
    hashes = {(loss, point): stable_hash(swept.identity_of(swept.cell("MUTAG", loss, 0, point)))
              for loss in ("dcl", "macl") for point in swept.sweep.points()}
    first, second = swept.sweep.points()
    # GraphCL does not read alpha: one identity, main's at the first value; MACL's as on main
    assert hashes["dcl", first] == hashes["dcl", second] == hashes["macl", first] \
        == MAIN_MACL_HASH
    assert hashes["macl", second] != MAIN_MACL_HASH


def test_schedule_periods_that_round_to_the_same_steps_are_one_identity(shared_data):
    recipe = _recipe(losses=["temperature_schedule", "macl"], epochs=10,
                     schedule_period=[None, 2.2, 3.0], data_root=str(shared_data),
                     datasets=["MUTAG"])
    recipe.prepare(recipe.point_configs())  # MUTAG: 188 graphs, 2 steps per epoch
    none, close, other = (recipe.identity_of(recipe.cell("MUTAG", "temperature_schedule", 0, p))
                          for p in recipe.sweep.points())
    assert none["settings"]["schedule_period_steps"] == 4 and "schedule_period" not in none[
        "settings"]
    assert none == close and other["settings"]["schedule_period_steps"] == 6
    macl = {stable_hash(recipe.identity_of(recipe.cell("MUTAG", "macl", 0, p)))
            for p in recipe.sweep.points()}
    assert len(macl) == 1  # MACL does not read the schedule's period


@pytest.mark.parametrize("period, shown", [([], "0.4"), (["--schedule-period", "none", "0.5"],
                                                          "0.4"), (["--schedule-period", "0.3"],
                                                                   "0.3")])
def test_a_schedule_period_of_one_step_is_refused_before_any_work(period, shown, shared_data,
                                                                 tmp_path, capsys):
    out = tmp_path / "out"
    code = cli.main(["tu", "--data-root", str(shared_data), "--datasets", "MUTAG", "--losses",
                     "temperature_schedule", "--epochs", "2", *period, "--output-dir", str(out),
                     "--seeds", "0"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err == (f"adaptcl tu: error: --schedule-period {shown} (epochs; none: a fifth of "
                   "--epochs 2) is 1 optimisation step on MUTAG (2 per epoch): "
                   "temperature_schedule's temperature would stay at --max-temperature; give "
                   "at least 1 epoch (2 steps)\n")
    assert not out.exists()


@pytest.mark.slow  # four MUTAG cells of one epoch, one reused
def test_a_single_valued_run_is_the_cell_of_its_value_when_the_setting_becomes_an_axis(
        shared_data, tmp_path, capsys):
    """``--temperature 0.2 --tile-size 64`` stores ``MUTAG/macl/seed0``; with both swept the cell
    ``temperature=0.2/tile_size=64`` is that run (same identity): reused, not trained again."""
    import json

    out = tmp_path / "out"
    argv = ["tu", "--data-root", str(shared_data), "--datasets", "MUTAG", "--losses", "macl",
            "--seeds", "0", "--epochs", "1", "--folds", "2", "--inner-folds", "2",
            "--no-progress", "--no-plot", "--output-dir", str(out)]
    assert cli.main([*argv, "--temperature", "0.2", "--tile-size", "64"]) == 0
    assert cli.main([*argv, "--temperature", "0.2", "0.3", "--tile-size", "64", "128"]) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["reused"] == [{"dataset": "MUTAG", "loss": "macl", "temperature": 0.2,
                                 "tile_size": "64", "seed": 0}]  # as given
    assert len(result["computed"]) == 3
    assert result["runs"][0]["same_as"] == "MUTAG/macl/seed0"
