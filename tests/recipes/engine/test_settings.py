"""A config's fields declared once: checks, canonical spellings, identity, sweeps, config files."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import yaml

from adaptcl.recipes.engine.config_file import config_text
from adaptcl.recipes.engine.settings import (
    as_record,
    at_least,
    axis_fields,
    check_settings,
    fraction,
    identity_settings,
    positive,
    setting,
    sweepable,
)
from adaptcl.recipes.engine.sweep import Sweep
from adaptcl.registry import canonical_loss_name


@dataclass
class Config:
    datasets: list[str] = setting(factory=lambda: ["A"], axis="dataset", help="sets")
    losses: list[str] = setting(factory=lambda: ["infonce"], axis="loss",
                                convert=lambda n: canonical_loss_name(n, aliases={"graphcl": "dcl"}))
    seeds: list[int] = setting(factory=lambda: [0], axis="seed")
    lr: float = setting(0.1, check=positive)
    folds: int = setting(10, check=at_least(2))
    ratio: float | None = setting(None, check=fraction)
    aug: str = setting("auto", choices=("auto", "random2"))
    method: str = setting("simclr", choices=("simclr", "moco"), identity="train")
    temperature: float | None = setting(None, help="derived from the method when none")
    grid: list[float] = setting(factory=lambda: [1.0, 10.0], check=positive)
    device: str = setting("cuda:1", identity=lambda d: d.split(":")[0], sweep=False)
    output_dir: str = setting("out", identity=False, sweep=False)
    standardize: bool = setting(False)

    def __post_init__(self) -> None:
        check_settings(self)
        if self.temperature is None:  # a default derived from another setting, per point
            self.temperature = 0.2 if self.method == "moco" else 0.1


@pytest.mark.parametrize("changes, message", [
    ({"lr": 0.0}, "lr must be a positive number, got 0.0"),
    ({"lr": float("nan")}, "lr must be a finite number, got nan"),
    ({"folds": 1}, "folds must be a number >= 2, got 1"),
    ({"ratio": 1.0}, "ratio must be a number in [0, 1), got 1.0"),
    ({"grid": [1.0, -1.0]}, "each value of grid must be a positive number, got [1.0, -1.0]"),
    ({"grid": [1.0, float("inf")]}, "grid must be a finite number, got inf"),
    ({"aug": "random5"}, "unknown aug 'random5'; choose from auto, random2"),
    ({"losses": ["nope"]}, "unknown loss 'nope'"),
    ({"datasets": []}, "datasets must not be empty"),
    ({"seeds": [-1]}, "seed -1 is out of range"),
    ({"seeds": [1.5]}, "seed 1.5 is not an integer"),
])
def test_each_field_is_checked_by_its_declaration(changes, message):
    with pytest.raises(ValueError) as err:
        Config(**changes)
    assert message in str(err.value)


def test_values_get_their_canonical_spelling_and_axes_lose_repeats_with_one_note(capsys):
    config = Config(aug="RANDOM2", losses=["GraphCL", "dcl", "macl"], datasets=["A", "A"])
    assert config.aug == "random2" and config.losses == ["dcl", "macl"]
    assert config.datasets == ["A"]
    notes = capsys.readouterr().err.splitlines()
    assert notes == ["adaptcl: note: --datasets: 'A' is given more than once; running each once",
                     "adaptcl: note: --losses: 'dcl' repeats 'GraphCL'; running each once"]
    sweep = Sweep.from_values(Config, {"losses": ["dcl", "DCL"], "lr": [0.1, 0.2, 0.3]})
    assert capsys.readouterr().err.count("note") == 1 and sweep.raw["losses"] == ["dcl"]


def test_none_passes_the_checks_of_an_optional_number():
    assert Config(ratio=None).ratio is None


def test_identity_holds_what_changes_a_result_and_nothing_else():
    settings = identity_settings(Config())
    assert "output_dir" not in settings and "datasets" not in settings  # bookkeeping, an axis
    assert settings["device"] == "cuda"  # what of the device counts: its type
    assert settings["method"] == "simclr" and settings["temperature"] == 0.1
    assert "method" in identity_settings(Config(), part="train")
    assert "method" not in identity_settings(Config(), part="scoring")  # another part's field
    assert settings == identity_settings(Config(output_dir="elsewhere"))


def test_what_may_vary_in_one_run():
    assert sweepable(Config) == ["lr", "folds", "ratio", "aug", "method", "temperature"]
    assert axis_fields(Config) == {"dataset": "datasets", "loss": "losses", "seed": "seeds"}


def test_a_sweep_is_every_combination_and_each_point_derives_its_own_defaults():
    sweep = Sweep.from_values(Config, {"lr": [0.1, 0.2], "method": ["simclr", "moco"]})
    assert sweep.axes == {"lr": [0.1, 0.2], "method": ["simclr", "moco"]}
    assert sweep.points() == [(("lr", 0.1), ("method", "simclr")), (("lr", 0.1), ("method", "moco")),
                              (("lr", 0.2), ("method", "simclr")), (("lr", 0.2), ("method", "moco"))]
    temperatures = [sweep.config_at(p).temperature for p in sweep.points()]
    assert temperatures == [0.1, 0.2, 0.1, 0.2]  # not the first point's 0.1 for every point
    assert sweep.base == sweep.config_at(sweep.points()[0])
    assert Sweep.from_values(Config, {}).points() == [()]


def test_a_sweep_refuses_what_cannot_vary_a_bad_point_and_an_unknown_setting(capsys):
    with pytest.raises(ValueError, match=r"--output-dir takes one value \(it cannot vary within "
                                         r"one run\), got a b"):
        Sweep.from_values(Config, {"output_dir": ["a", "b"]})
    with pytest.raises(ValueError, match="--output-dir takes one value .*, got a a"):
        Sweep.from_values(Config, {"output_dir": ["a", "a"]})  # a repeat too: as the CLI says
    with pytest.raises(ValueError, match=r"lr=-1: lr must be a positive number, got -1"):
        Sweep.from_values(Config, {"lr": [0.1, -1]})
    with pytest.raises(ValueError, match="unknown setting epochs for this recipe"):
        Sweep.from_values(Config, {"epochs": 3})
    with pytest.raises(ValueError, match="--lr needs a value"):
        Sweep.from_values(Config, {"lr": []})
    assert Sweep.from_values(Config, {"lr": [0.1, 0.1]}).axes == {}  # a repeat is no sweep
    assert "running each once" in capsys.readouterr().err


def test_the_config_file_of_a_sweep_reads_back_to_the_same_run():
    sweep = Sweep.from_values(Config, {"lr": [0.1, 0.2], "aug": "Random2"})
    text = config_text("toy", "default", sweep)
    loaded = yaml.safe_load(text)
    assert text.startswith("# adaptcl toy: `adaptcl toy --config <this file>`")
    assert loaded["recipe"] == "toy" and loaded["preset"] == "default"
    assert loaded["lr"] == [0.1, 0.2] and loaded["temperature"] is None  # as given: derived again
    again = Sweep.from_values(Config, {k: v for k, v in loaded.items()
                                       if k not in ("recipe", "preset")})
    assert again.axes == sweep.axes
    assert [dataclasses.asdict(again.config_at(p)) for p in again.points()] == \
        [dataclasses.asdict(sweep.config_at(p)) for p in sweep.points()]


def test_a_record_holds_plain_values():
    record = as_record({"model": print, "path": __import__("pathlib").Path("/x"), "t": (1, 2)})
    assert record == {"model": repr(print), "path": "/x", "t": [1, 2]}
