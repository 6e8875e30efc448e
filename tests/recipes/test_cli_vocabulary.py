"""The one CLI vocabulary: common options, deprecated spellings, one-line errors, --version."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adaptcl import cli
from adaptcl.recipes.template.options import ListAction, add_common_arguments, choice_type

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _parser() -> argparse.ArgumentParser:
    parser = cli.OneLineParser(prog="adaptcl toy")
    add_common_arguments(parser, output_dir="results/toy", seeds=[0, 1], devices=True)
    parser.add_argument("--datasets", action=ListAction,
                        item_type=choice_type(["MUTAG", "IMDB-BINARY"], "dataset"),
                        default=["MUTAG"])
    return parser


def test_common_options_have_one_spelling_and_defaults():
    args = _parser().parse_args([])
    assert args.output_dir == "results/toy" and args.seeds == [0, 1] and args.threads == 1
    assert args.device == "auto" and args.precision == "32" and args.logger == "none"
    assert args.devices == 1 and args.strategy == "auto" and args.progress is True
    args = _parser().parse_args(["--seeds", "3", "4", "--datasets", "mutag", "imdb-binary"])
    assert args.seeds == [3, 4] and args.datasets == ["MUTAG", "IMDB-BINARY"]


def test_old_spellings_still_work_with_a_deprecation_note(capsys):
    args = _parser().parse_args(["--seeds", "0,1,2", "--out-dir", "x", "--num-threads", "2"])
    assert args.seeds == [0, 1, 2] and args.output_dir == "x" and args.threads == 2
    err = capsys.readouterr().err
    assert "comma-separated --seeds is deprecated" in err
    assert "--out-dir is deprecated; use --output-dir" in err
    assert "--num-threads is deprecated; use --threads" in err
    assert _parser().parse_args(["--seed", "5"]).seeds == [5]


def test_repeated_values_run_once_with_one_note_per_option(capsys):
    args = _parser().parse_args(["--datasets", "MUTAG", "mutag", "IMDB-BINARY", "imdb-binary",
                                 "--seeds", "0", "0", "1"])
    assert args.datasets == ["MUTAG", "IMDB-BINARY"] and args.seeds == [0, 1]
    assert capsys.readouterr().err.splitlines() == [
        "adaptcl: note: --datasets: 'mutag' repeats 'MUTAG', 'imdb-binary' repeats 'IMDB-BINARY'; "
        "running each once",
        "adaptcl: note: --seeds: '0' is given more than once; running each once"]
    assert _parser().parse_args(["--seed", "3,3"]).seeds == [3]
    assert "--seed: '3' is given more than once" in capsys.readouterr().err
    assert _parser().parse_args(["--seeds", "2", "1"]).seeds == [2, 1]  # order kept, no note
    assert capsys.readouterr().err == ""


def test_a_loss_and_its_alias_are_one_loss():
    parser = cli.build_parser("tu")
    args = parser.parse_args(["tu", "--losses", "graphcl", "macl", "dcl", "GraphCL"])
    assert args.losses == ["dcl", "macl"]


@pytest.mark.parametrize("seed", ["-1", "4294967296", "1.5", "x"])
def test_seed_outside_numpys_range_is_a_one_line_error_naming_seeds(capsys, seed):
    for argv in (["--seeds", "0", seed], ["--seed", f"0,{seed}"]):
        with pytest.raises(SystemExit) as info:
            _parser().parse_args(argv)
        assert info.value.code == 2
        (line,) = [x for x in capsys.readouterr().err.splitlines() if "note:" not in x]
        assert line.startswith(f"adaptcl toy: error: argument {argv[0]}: ")
        assert "seeds are integers in [0, 2**32 - 1]" in line
    assert _parser().parse_args(["--seeds", "0", "4294967295"]).seeds == [0, 2**32 - 1]


@pytest.mark.parametrize("recipe", [r for r in cli.RECIPES if r not in ("compare", "sts")])
def test_every_recipe_refuses_a_negative_seed(capsys, recipe):  # sts takes no seeds at all
    with pytest.raises(SystemExit) as info:
        cli.build_parser(recipe).parse_args([recipe, "--seeds", "-1"])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"adaptcl {recipe}: error: argument --seeds: seed -1 is out of range; seeds are "
        "integers in [0, 2**32 - 1]")


def test_user_error_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        _parser().parse_args(["--datasets", "NOPE"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("adaptcl toy: error: argument --datasets: unknown dataset 'NOPE'")


def test_recipe_error_from_main_is_one_line_and_exit_2(capsys, tmp_path):
    code = cli.main(["tu", "--data-root", str(tmp_path / "nowhere"), "--output-dir",
                     str(tmp_path / "out"), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("adaptcl tu: error: data root")
    assert not (tmp_path / "out").exists()  # validated before any file is written


def test_crash_keeps_its_traceback_and_exits_1(tmp_path):
    code = ("import adaptcl.recipes.tu as tu\n"
            "def crash(*a, **k):\n    raise ZeroDivisionError('boom')\n"
            "tu.TURecipe.run = crash\n"
            "from adaptcl import cli\nimport sys\n"
            "sys.exit(cli.main(['tu', '--no-progress', '--output-dir', sys.argv[1]]))\n")
    env = dict(os.environ, PYTHONPATH=SRC, ADAPTCL_DATA=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "o")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "ZeroDivisionError: boom" in proc.stderr


def test_version_comes_from_package_metadata(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"adaptcl {version('adaptcl')}"


@pytest.mark.parametrize("recipe", ["tu", "moleculenet", "images", "demo"])
def test_help_is_fast_shows_defaults_and_an_example(recipe):
    env = dict(os.environ, PYTHONPATH=SRC)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "adaptcl.cli", recipe, "--help"], env=env,
                          capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    assert elapsed < 3.0, f"adaptcl {recipe} --help took {elapsed:.1f} s"
    assert "(default: " in proc.stdout and "example:" in proc.stdout
    for option in ("--output-dir", "--seeds", "--threads", "--device", "--precision", "--logger"):
        assert option in proc.stdout


def test_help_imports_no_heavy_module():
    code = ("import sys\nfrom adaptcl import cli\n"
            "for r in ('tu', 'moleculenet', 'images', 'demo'):\n"
            "    cli.build_parser(r)\n"
            "heavy = sorted(m for m in ('torch', 'torch_geometric', 'lightly', 'sklearn', "
            "'transformers', 'matplotlib') if m in sys.modules)\n"
            "print(heavy)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=SRC),
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stderr


@pytest.mark.parametrize("recipe", cli.RECIPES)
def test_help_of_every_recipe_returns_in_under_3_s(recipe):
    env = dict(os.environ, PYTHONPATH=SRC)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "adaptcl.cli", recipe, "--help"], env=env,
                          capture_output=True, text=True, timeout=10)  # a slow one fails fast
    assert proc.returncode == 0, proc.stderr
    assert time.perf_counter() - start < 3.0


def test_missing_extra_is_a_one_line_error(monkeypatch, capsys, tmp_path):
    import adaptcl.recipes.tu as tu

    def missing(*args, **kwargs):
        raise ImportError("'torch_geometric' is required here; install it with "
                          "`pip install 'adaptcl[graph]'`")

    monkeypatch.setattr(tu.TURecipe, "run", missing)
    assert cli.main(["tu", "--output-dir", str(tmp_path), "--no-progress"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("adaptcl tu: error: 'torch_geometric' is required")
