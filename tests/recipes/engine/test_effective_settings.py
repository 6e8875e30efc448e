"""A cell's identity holds only what determines its numbers: a setting its loss does not read
(``setting(losses=...)``) and two values that resolve to the same run compute the cell once."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from adaptcl.recipes.engine import (
    Cell,
    Recipe,
    ReportSpec,
    Sweep,
    check_settings,
    options,
    positive,
    setting,
)
from adaptcl.recipes.engine.settings import identity_settings


@dataclass
class LossConfig:
    """Two losses: ``macl`` reads ``alpha``, ``sched`` reads ``period`` (whole steps)."""

    losses: list[str] = setting(factory=lambda: ["base", "macl"], axis="loss", help="losses")
    seeds: list[int] = options.seeds([0])
    output_dir: str = options.output_dir("toy")
    lr: float = setting(0.1, check=positive, help="every loss reads it")
    alpha: float = setting(0.5, losses=("macl",), help="MACL's")
    period: float = setting(2.0, check=positive, losses=("sched",), help="in steps, rounded")
    progress: bool = options.progress()

    def __post_init__(self) -> None:
        check_settings(self)


class LossRecipe(Recipe):
    name, config_class, description = "losses", LossConfig, "a loss-aware toy"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.computed: list[str] = []

    def rows(self) -> list[str]:
        return ["d"]

    def identity(self, cell: Cell, config: LossConfig) -> dict[str, Any]:
        out = super().identity(cell, config)
        if cell.loss == "sched":  # what the run uses: the period in whole steps
            out["settings"]["period"] = round(out["settings"]["period"])
        return out

    def compute(self, cell: Cell, config: LossConfig) -> dict[str, Any]:
        self.computed.append(cell.label())
        value = config.lr + (config.alpha if cell.loss == "macl" else 0.0) + (
            round(config.period) / 10 if cell.loss == "sched" else 0.0)
        return {"metrics": {"accuracy": value}, "optimisation_steps": 1, "train_seconds": 0.0}

    def report_spec(self) -> ReportSpec:
        return ReportSpec(metrics=("accuracy",), baseline="base", labels={"base": "Base"})


def _run(out, **values: Any) -> LossRecipe:
    recipe = LossRecipe(Sweep.from_values(LossConfig, {"output_dir": str(out),
                                                       "progress": False, **values}))
    recipe.run()
    return recipe


def test_a_loss_that_ignores_a_swept_setting_is_computed_once_and_shown_at_every_point(
        tmp_path, capsys):
    recipe = _run(tmp_path, alpha=[0.5, 1.0])
    assert recipe.computed == ["d/base/alpha=0.5/seed0", "d/macl/alpha=0.5/seed0",
                               "d/macl/alpha=1.0/seed0"]
    err = capsys.readouterr().err
    assert err.splitlines() == ["adaptcl: note: --alpha applies to macl only; Base runs once"]
    grid = recipe.grid
    first, copy = (Cell((("dataset", "d"), ("loss", "base")), 0, (("alpha", a),))
                   for a in (0.5, 1.0))
    assert grid.identities[first] == grid.identities[copy]
    assert grid.records[copy] == grid.records[first] | {"same_as": "d/base/alpha=0.5/seed0"}
    stored = json.loads((tmp_path / "runs/d/base/alpha=1.0/seed0.json").read_text())
    assert stored["record"]["same_as"] == "d/base/alpha=0.5/seed0"
    markdown = (tmp_path / "results.md").read_text()
    assert ("Base does not read alpha: its run is computed once and shown at every alpha "
            "(left out of the tables along alpha).") in markdown
    along = markdown.split("## accuracy along alpha")[1]
    assert "| macl |" in along and "Base" not in along
    again = _run(tmp_path, alpha=[0.5, 1.0])  # every record, the copy's too, is reused
    assert again.computed == [] and len(again.grid.reused) == 4
    more = _run(tmp_path, alpha=[0.5, 1.0, 2.0])  # Base at 2.0: the stored first's record
    assert more.computed == ["d/macl/alpha=2.0/seed0"]
    assert json.loads((tmp_path / "runs/d/base/alpha=2.0/seed0.json").read_text())[
        "record"]["same_as"] == "d/base/alpha=0.5/seed0"


def test_the_identity_of_a_cell_whose_loss_reads_every_setting_is_the_one_it_always_had(
        tmp_path):
    """The settings of an identity before ``setting(losses=...)`` existed: every setting at the
    cell's own value (:func:`identity_settings` without a loss). A run that sweeps no ignored
    setting keeps it for every cell, so its stored records keep their hash."""
    recipe = LossRecipe(Sweep.from_values(LossConfig, {"output_dir": str(tmp_path),
                                                       "alpha": 0.7, "period": 3.0}))
    config = recipe.sweep.base
    for loss in ("base", "macl"):
        cell = recipe.cell("d", loss, 0)
        assert recipe.identity_of(cell)["settings"] == identity_settings(config) == {
            "lr": 0.1, "alpha": 0.7, "period": 3.0}
    swept = LossRecipe(Sweep.from_values(LossConfig, {"output_dir": str(tmp_path),
                                                      "alpha": [0.7, 0.9]}))
    macl = [swept.identity_of(swept.cell("d", "macl", 0, p))["settings"]["alpha"]
            for p in swept.sweep.points()]
    base = [swept.identity_of(swept.cell("d", "base", 0, p))["settings"]["alpha"]
            for p in swept.sweep.points()]
    assert macl == [0.7, 0.9] and base == [0.7, 0.7]  # at the run's first point


def test_two_values_that_resolve_to_the_same_run_are_computed_once_with_a_note(
        tmp_path, capsys):
    recipe = _run(tmp_path, losses=["sched"], period=[1.6, 2.4, 3.0])
    assert recipe.computed == ["d/sched/period=1.6/seed0", "d/sched/period=3.0/seed0"]
    err = capsys.readouterr().err.splitlines()
    assert err == ["adaptcl: note: 1 run of this grid repeats another's run (their settings "
                   "resolve to the same: d/sched/period=2.4/seed0 is d/sched/period=1.6/seed0); "
                   "each is computed once, its record stored for every one"]
    values = [r["metrics"]["accuracy"] for r in recipe.grid.records.values()]
    assert values == pytest.approx([0.3, 0.3, 0.4])


def test_a_setting_declares_its_losses_as_names():
    with pytest.raises(TypeError, match="losses must be a sequence of loss names"):
        setting(0.5, losses="macl")
