"""A cell's settings come with the cell: ``compute(cell, config)`` and ``identity(cell, config)``
get the cell's own config, and ``Recipe.config`` (the sweep's first point) cannot be read while
a cell's identity or record is made, so a swept setting read the wrong way stops the run instead
of training the first point's value under another point's identity."""

from __future__ import annotations

import json

import pytest

from adaptcl.recipes.engine import CellConfigError, Sweep
from tests.recipes.engine._toy import ToyConfig, ToyRecipe


def _sweep(tmp_path) -> Sweep:
    return Sweep.from_values(ToyConfig, {"output_dir": str(tmp_path), "seeds": [1],
                                         "lr": [0.1, 0.2], "progress": False})


class ReadsTheFirstPoint(ToyRecipe):
    """The bug this guards against: the swept ``lr`` read from ``self.config``."""

    def compute(self, cell, config):
        return super().compute(cell, self.config)


class IdentityReadsTheFirstPoint(ToyRecipe):
    def identity(self, cell, config):
        return super().identity(cell, self.config)


class PrepareSeesEveryPoint(ToyRecipe):
    def prepare(self, configs) -> None:
        self.prepared = {point: config.lr for point, config in configs.items()}


def test_each_cell_computes_with_its_own_swept_value(tmp_path):
    result = ToyRecipe(_sweep(tmp_path)).run()
    assert len(result["runs"]) == 2  # the toy scores 0.5 + lr * seed + width / 100
    for lr in (0.1, 0.2):
        stored = json.loads((tmp_path / f"runs/d/base/lr={lr}/seed1.json").read_text())
        assert stored["record"]["metrics"]["accuracy"] == pytest.approx(0.5 + lr + 0.04)
        assert stored["identity"]["settings"]["lr"] == lr


@pytest.mark.parametrize("recipe_class", [ReadsTheFirstPoint, IdentityReadsTheFirstPoint])
def test_reading_the_sweeps_first_point_for_a_cell_stops_the_run(tmp_path, recipe_class):
    recipe = recipe_class(_sweep(tmp_path))
    with pytest.raises(CellConfigError, match=r"config read for cell d/base/lr=0\.1/seed1: it "
                                              r"is the sweep's first point"):
        recipe.run()
    assert not list((tmp_path / "runs").rglob("seed*.json"))  # nothing stored under its name
    assert recipe.config.lr == 0.1  # outside a cell the run's config reads again


def test_prepare_is_given_the_config_of_every_point(tmp_path):
    recipe = PrepareSeesEveryPoint(_sweep(tmp_path))
    recipe.ready(threads=1)
    assert recipe.prepared == {(("lr", 0.1),): 0.1, (("lr", 0.2),): 0.2}
