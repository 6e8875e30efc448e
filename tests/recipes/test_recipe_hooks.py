"""The Recipe template's hooks: setup() between prepare() and the grid, a process that owns no
result (a non-zero rank of a distributed run), the preset's help."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from adaptcl.recipes.template.recipe import Recipe


@dataclass
class ToyConfig:
    losses: list[str] = field(default_factory=lambda: ["a", "b"])
    seeds: list[int] = field(default_factory=lambda: [0])
    output_dir: str = "out"
    threads: int = 1
    progress: bool = False
    plot: bool = False

    @classmethod
    def small(cls, **overrides: Any) -> ToyConfig:
        return cls(**overrides)


class Toy(Recipe):
    name, config_class, metrics = "toy", ToyConfig, ("accuracy",)
    presets = {"small": "small"}
    helps = {"preset": "small: the only preset"}

    def prepare(self) -> None:
        self.calls = ["prepare"]

    def setup(self) -> None:
        self.calls.append("setup")

    def compute(self, cell):
        self.calls.append(cell.method)
        return {"metrics": {"accuracy": 0.5}, "optimisation_steps": 1, "train_seconds": 0.0}


class NotRankZero(Toy):
    def compute(self, cell):  # Lightning's non-zero ranks: trained, but rank 0 stores it
        return None


def test_setup_runs_once_after_prepare_and_before_the_grid(tmp_path):
    recipe = Toy(ToyConfig(output_dir=str(tmp_path)))
    result = recipe.run()
    assert recipe.calls == ["prepare", "setup", "a", "b"]
    assert (tmp_path / "results.json").is_file() and result["complete"]


def test_a_process_owning_no_result_writes_and_prints_nothing(tmp_path, capsys):
    assert NotRankZero(ToyConfig(output_dir=str(tmp_path))).run() == {}
    assert not list(tmp_path.glob("results.*"))
    args = argparse.Namespace(output_dir=str(tmp_path), progress=False, preset="small")
    assert NotRankZero.main(args) == 0
    assert capsys.readouterr().out == "" and not list(tmp_path.glob("results.*"))


def test_preset_help_comes_from_helps():
    parser = argparse.ArgumentParser()
    Toy.add_arguments(parser)
    assert "small: the only preset" in parser.format_help()
