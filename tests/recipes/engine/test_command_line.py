"""A recipe's command line and config file from its config's declarations (tyro): one option
per setting, several values where a setting may vary, presets, config files, one-line errors."""

from __future__ import annotations

import json
import time

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
        "progress: true", "progress: false").replace(f"output_dir: {out}", "output_dir: .")
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


def _bomb(levels: int) -> str:
    """A sweep of ``lr`` as nested YAML aliases: ``levels`` levels of 9 (9**levels values)."""
    lines = ["recipe: toy", "lr:", "- &a [" + ", ".join(["0.1"] * 9) + "]"]
    names = "abcdefghijklmnop"
    for i in range(1, levels):
        lines.append(f"- &{names[i]} [" + ", ".join([f"*{names[i - 1]}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(9))  # 9**9 values once expanded; under 1 KB written
    assert len(path.read_bytes()) < 1024
    start = time.perf_counter()
    with pytest.raises(RecipeError) as info:
        _parse("--config", str(path))
    assert time.perf_counter() - start < 1.0
    assert str(info.value) == (f"--config {path}: line 4: YAML aliases (*a) are not read (nested "
                               "ones expand to gigabytes); write the values out")
    path.write_text("recipe: toy\nlr: &x 0.2\n")  # an anchor alone is harmless
    assert _parse("--config", str(path)).sweep.base.lr == 0.2


@pytest.mark.parametrize("text, lines", [
    ("recipe: toy\nlr: 0.2\nseeds: [0]\nlr: 0.3\n", (2, 4)),
    ("{recipe: toy, lr: 0.2, lr: 0.3}\n", (1, 1)),  # a flow mapping: both on one line
])
def test_a_setting_given_twice_in_a_config_file_is_refused_naming_both_lines(tmp_path, text,
                                                                            lines):
    """PyYAML keeps the last of two equal keys silently; a run must not take one a user did not
    mean, so the file is refused in one line naming the key and its two lines."""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as info:
        _parse("--config", str(path))
    assert str(info.value) == (f"--config {path}: lr is given twice (lines {lines[0]} and "
                               f"{lines[1]}); keep one")
    path.write_text("recipe: toy\nlr: 0.2\nwidth: 3\n")  # the same key in no mapping twice
    assert _parse("--config", str(path)).sweep.base.lr == 0.2


def test_a_huge_sweep_is_counted_and_refused_before_it_is_built(capsys):
    values = [str(0.001 * (i + 1)) for i in range(1000)]
    widths = [str(i + 1) for i in range(1000)]
    start = time.perf_counter()
    message = _one_line(capsys, "--lr", *values, "--width", *widths, "--seeds", "0")
    assert time.perf_counter() - start < 2.0
    assert message == ("adaptcl toy: error: the grid has 1,000,000 cells (losses 1 x seeds 1 x "
                       "lr 1,000 x width 1,000), more than --max-cells 10,000: give fewer values, "
                       "or --max-cells 1000000 to run them all")
    allowed = _parse("--lr", *values[:200], "--width", *widths[:60], "--seeds", "0",
                     "--max-cells", "12000")
    assert len(allowed.sweep.points()) == 12000 and allowed.jobs.max_cells == 12000


def test_the_python_api_counts_the_cells_of_its_grid_too(tmp_path):
    from adaptcl.recipes.engine import Sweep
    from adaptcl.recipes.engine.job_options import JobOptions
    from tests.recipes.engine._toy import ToyConfig

    sweep = Sweep.from_values(ToyConfig, {"lr": [0.1, 0.2, 0.3], "seeds": [0, 1],
                                          "output_dir": str(tmp_path)})
    with pytest.raises(RecipeError, match=r"^the grid has 6 cells, more than --max-cells 5:"):
        ToyRecipe(sweep, jobs=JobOptions(max_cells=5)).run()
    assert not tmp_path.joinpath("config.yaml").exists()  # refused before any write


def test_a_bad_value_in_a_config_file_names_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("recipe: toy\nlr: [0.1, 0.2]\nwidth: two\n")
    with pytest.raises(RecipeError) as info:
        _parse("--config", str(path))
    assert str(info.value) == f"--config {path}: width must be int, got 'two'"
    path.write_text("recipe: toy\nlr: [0.1, -1]\n")
    with pytest.raises(RecipeError, match=rf"^--config {path}: each value of lr must be a "
                                          r"positive number, got \[0.1, -1\]$"):
        _parse("--config", str(path))


def test_a_moved_run_folder_runs_where_it_now_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert ToyRecipe.main(["--output-dir", "runs/a", "--seeds", "0", "--no-progress"], PROG) == 0
    assert "output_dir: .\n" in (tmp_path / "runs/a/config.yaml").read_text()
    (tmp_path / "runs/a").rename(tmp_path / "moved")
    assert ToyRecipe.main(["--config", "moved/config.yaml"], PROG) == 0
    again = json.loads((tmp_path / "moved/results.json").read_text())
    assert not (tmp_path / "runs/a").exists() and len(again["reused"]) == 1
    assert _parse("--config", "moved/config.yaml").sweep.base.output_dir == "moved"
    old = tmp_path / "old"  # a config.yaml written before: output_dir from the current folder
    old.mkdir()
    (old / "config.yaml").write_text("recipe: toy\noutput_dir: old\n")
    assert _parse("--config", "old/config.yaml").sweep.base.output_dir == "old"


def test_a_rerun_with_other_settings_keeps_the_folders_config_and_results(tmp_path, capsys):
    out = tmp_path / "out"
    assert ToyRecipe.main(["--output-dir", str(out), "--lr", "0.1", "0.2", "--seeds", "0",
                           "--no-progress"], PROG) == 0
    assert ToyRecipe.main(["--config", str(out / "config.yaml"), "--threads", "2"], PROG) == 0
    assert not (out / "history").exists()  # the same cells (threads: no result): nothing kept
    config, results = (out / "config.yaml").read_text(), (out / "results.json").read_text()
    capsys.readouterr()
    assert ToyRecipe.main(["--config", str(out / "config.yaml"), "--width", "8"], PROG) == 0
    assert capsys.readouterr().err.count(f"moved to {out / 'history' / '1'}") == 1
    kept = out / "history" / "1"
    assert (kept / "config.yaml").read_text() == config
    assert json.loads((kept / "results.json").read_text()) == json.loads(results)
    assert (kept / "results.md").exists() and "width: 8" in (out / "config.yaml").read_text()
    assert ToyRecipe.main(["--config", str(kept / "config.yaml"), "--output-dir", str(out)],
                          PROG) == 0
    assert "width: 8" in (out / "history" / "2" / "config.yaml").read_text()  # kept in turn
    assert (out / "config.yaml").read_text() == config


def test_an_earlier_runs_config_from_history_runs_in_its_run_folder(tmp_path, capsys):
    """``--config <out>/history/<n>/config.yaml`` is ``<out>``'s earlier run: it runs in
    ``<out>`` again, reusing the runs stored there, not in ``history/<n>`` from nothing."""
    out = tmp_path / "out"
    assert ToyRecipe.main(["--output-dir", str(out), "--seeds", "0", "1", "--no-progress"],
                          PROG) == 0
    assert ToyRecipe.main(["--config", str(out / "config.yaml"), "--seeds", "2"], PROG) == 0
    kept = out / "history" / "1" / "config.yaml"  # seeds 0 1, whose runs are stored in out
    assert "output_dir: .\n" in kept.read_text()
    assert _parse("--config", str(kept)).sweep.base.output_dir == str(out)
    capsys.readouterr()
    assert ToyRecipe.main(["--config", str(kept)], PROG) == 0
    assert f"is an earlier run of {out}" in capsys.readouterr().err
    again = json.loads((out / "results.json").read_text())
    assert len(again["reused"]) == 2 and again["computed"] == []
    assert sorted(p.name for p in kept.parent.iterdir()) == ["config.yaml", "results.json",
                                                             "results.md"]

