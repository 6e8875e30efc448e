"""A recipe's command line and config file from its config's declarations (tyro): one option
per setting, several values where a setting may vary, presets, config files, one-line errors."""

from __future__ import annotations

import json

import pytest
import yaml

from adaptcl.recipes.engine.command_line import parse
from adaptcl.recipes.engine.errors import RecipeError
from tests.recipes.engine._toy import ToyRecipe

PROG = "adaptcl toy"


def _parse(*argv: str):
    return parse(ToyRecipe, list(argv), PROG)


def _one_line(capsys, *argv: str) -> str:
    with pytest.raises(RecipeError) as info:
        _parse(*argv)
    assert capsys.readouterr().err == "" and "\n" not in str(info.value)
    return f"{PROG}: error: {info.value}"


def test_every_setting_is_an_option_with_its_default():
    invocation = _parse()
    config = invocation.sweep.base
    assert config.seeds == [0, 1, 2, 3] and config.lr == 0.1 and config.threads == 1
    assert invocation.sweep.axes == {} and invocation.preset == "default"
    assert not invocation.jobs.parallel and invocation.print_config is False
    config = _parse("--seeds", "3", "4", "--lr", "0.2", "--no-progress", "--threads", "none").sweep.base
    assert config.seeds == [3, 4] and config.lr == 0.2 and config.progress is False
    assert config.threads is None


def test_several_values_of_a_setting_make_a_sweep():
    sweep = _parse("--lr", "0.1", "0.2", "--width", "4", "8", "--seeds", "0").sweep
    assert sweep.axes == {"lr": [0.1, 0.2], "width": [4, 8]} and len(sweep.points()) == 4


@pytest.mark.parametrize("argv, message", [
    (("--threads", "1", "2"), "adaptcl toy: error: --threads takes one value (it cannot vary "
                              "within one run), got 1 2"),
    (("--output-dir", "a", "b"), "adaptcl toy: error: --output-dir takes one value"),
    (("--threads", "1", "1"), "adaptcl toy: error: --threads takes one value (it cannot vary "
                              "within one run), got 1 1"),
    (("--jobs", "2", "3"), "adaptcl toy: error: --jobs takes one value (it cannot vary within "
                          "one run), got 2 3"),
    (("--lr",), "adaptcl toy: error: --lr needs a value"),
])
def test_what_cannot_vary_within_a_run_says_so(argv, message, capsys):
    with pytest.raises(RecipeError) as info:
        _parse(*argv)
    assert f"adaptcl toy: error: {info.value}".startswith(message)


@pytest.mark.parametrize("argv, message", [
    (("--lr", "x"), "adaptcl toy: error: argument --lr: invalid float value 'x'"),
    (("--lr=",), "adaptcl toy: error: argument --lr: invalid float value ''"),
    (("--nope", "1"), "adaptcl toy: error: unrecognized arguments: --nope 1"),
    (("--seeds", "a"), "adaptcl toy: error: argument --seeds: invalid int value 'a'"),
    (("--threads", "two"), "adaptcl toy: error: argument --threads: invalid int value 'two'"),
    (("--preset",), "adaptcl toy: error: argument --preset: expected one argument"),
    (("--no-progress", "x"), "adaptcl toy: error: unrecognized arguments: x"),
])
def test_a_bad_option_is_one_line_and_exit_2(argv, message, capsys):
    assert _one_line(capsys, *argv) == message


@pytest.mark.parametrize("argv, message", [
    (("--loss", "macl"), "unrecognized arguments: --loss macl (did you mean --losses?)"),
    (("--loss=macl",), "unrecognized arguments: --loss=macl (did you mean --losses?)"),
    (("--temp", "1"), "unrecognized arguments: --temp 1"),  # nothing alike: no guess
    (("--widt", "3"), "unrecognized arguments: --widt 3 (did you mean --width?)"),
    (("--no-progres",), "unrecognized arguments: --no-progres (did you mean --no-progress?)"),
    (("--seed", "1", "--losse", "a"), "unrecognized arguments: --seed 1 --losse a (--seed: did "
                                      "you mean --seeds?; --losse: did you mean --losses?)"),
])
def test_an_unknown_option_names_the_closest_one(argv, message, capsys):
    assert _one_line(capsys, *argv) == f"{PROG}: error: {message}"


def test_the_command_line_uses_no_private_tyro_module():
    import adaptcl.recipes.engine.command_line as module

    source = open(module.__file__, encoding="utf-8").read()
    assert "tyro._" not in source and "from tyro import _" not in source


def test_a_bad_setting_is_one_line_naming_it():
    with pytest.raises(RecipeError, match=r"lr=-1.0: lr must be a positive number, got -1.0"):
        _parse("--lr", "0.1", "-1")
    with pytest.raises(RecipeError, match=r"seed -1 is out of range; seeds are integers in"):
        _parse("--seeds", "-1")


def test_a_preset_sets_defaults_that_options_override(capsys):
    assert _parse("--preset", "fast").sweep.base.lr == 0.5
    assert _parse("--preset", "fast", "--lr", "0.3").sweep.base.lr == 0.3
    with pytest.raises(RecipeError, match=r"--preset 'slow' is not one of this recipe's "
                                          r"presets \(default, fast\)"):
        _parse("--preset", "slow")


def test_print_config_then_config_runs_the_same_settings(tmp_path, capsys):
    out = tmp_path / "out"
    assert ToyRecipe.main(["--lr", "0.1", "0.2", "--seeds", "0", "1", "--print-config",
                           "--output-dir", str(out)], PROG) == 0
    printed = capsys.readouterr().out
    assert not out.exists()  # printed, nothing run
    loaded = yaml.safe_load(printed)
    assert loaded["recipe"] == "toy" and loaded["lr"] == [0.1, 0.2] and loaded["seeds"] == [0, 1]
    (tmp_path / "c.yaml").write_text(printed)
    assert ToyRecipe.main(["--config", str(tmp_path / "c.yaml"), "--no-progress"], PROG) == 0
    first = json.loads((out / "results.json").read_text())
    assert len(first["computed"]) == 4 and (out / "config.yaml").read_text() == printed.replace(
        "progress: true", "progress: false")
    assert ToyRecipe.main(["--config", str(out / "config.yaml")], PROG) == 0
    again = json.loads((out / "results.json").read_text())
    assert len(again["reused"]) == 4 and again["computed"] == []  # every identity equal
    assert again["summary_along"]["lr"]["accuracy"][0]["paired"]["0.2"]["n"] == 2


@pytest.mark.parametrize("content, message", [
    ("recipe: tu\nlr: 0.1\n", "is a config of adaptcl tu, not of adaptcl toy"),
    ("recipe: toy\nepochs: 3\n", "unknown setting epochs for adaptcl toy"),
    ("- 1\n- 2\n", "expected settings by name, got list"),
    ("lr: [0.1\n", "is not a readable YAML file"),
])
def test_a_bad_config_file_is_one_line(tmp_path, content, message):
    path = tmp_path / "c.yaml"
    path.write_text(content)
    with pytest.raises(RecipeError, match=message):
        _parse("--config", str(path))
    with pytest.raises(RecipeError, match="no such file"):
        _parse("--config", str(tmp_path / "missing.yaml"))


def test_help_lists_every_option_presets_and_the_example(capsys):
    with pytest.raises(SystemExit) as info:
        _parse("--help")
    assert info.value.code == 0
    out = capsys.readouterr().out
    for text in ("--lr FLOAT [FLOAT ...]", "--threads INT|none", "--preset NAME", "default, fast",
                 "--config FILE", "--print-config", "--jobs", "--cluster", "adaptcl toy --lr "
                 "0.1 0.2", "several values"):
        assert text in out, text
