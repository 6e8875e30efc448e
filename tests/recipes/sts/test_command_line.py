"""``sts`` and ``transfer`` on the command line (their encoder half is one module,
:mod:`adaptcl.recipes.common.encoder_eval`): fast ``--help``, and every ordinary mistake one line
``adaptcl <recipe>: error: ...`` with exit status 2 before any result is written."""

from __future__ import annotations

import re

import pytest

from tests.recipes._cli import check_help, one_line_error, one_line_error_in_a_process


def test_help_is_fast_shows_defaults_and_an_example_and_imports_no_torch():
    check_help("sts")


def test_a_nan_encoder_is_one_line_exit_2_and_nothing_cached(tmp_path, shared_data):
    line = one_line_error_in_a_process(
        ["sts", "--model", "tests.evaluation._bow:nan_bow", "--model-id", "nan-bow", "--tasks",
         "STS13", "--data-root", str(shared_data), "--output-dir", str(tmp_path / "out"),
         "--cache-dir", str(tmp_path / "cache"), "--no-progress"],
        "adaptcl sts: error: encoder 'nan-bow'")
    assert "NaN" in line
    assert not list(tmp_path.rglob("*.npy")) and not (tmp_path / "out" / "results.json").exists()


def test_sts_takes_no_seeds(capsys):
    one_line_error(capsys, ["sts", "--model", "m:f", "--seeds", "5"],
                   "unrecognized arguments: --seeds 5")


@pytest.mark.parametrize("recipe", ["sts", "transfer"])
def test_a_cache_folder_that_cannot_be_one_is_refused_before_any_work(recipe, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    one_line_error(capsys, [recipe, "--model", "m:f", "--cache-dir", str(afile / "cache"),
                            "--output-dir", str(tmp_path / "out")],
                   f"--cache-dir '{afile / 'cache'}' is inside '{afile}', which is a file")
    assert not (tmp_path / "out").exists()


def test_an_encoder_setting_that_cannot_vary_takes_one_value(capsys):
    one_line_error(capsys, ["sts", "--model", "m:f", "n:g"],
                   "--model takes one value (it cannot vary within one run), got m:f n:g")


@pytest.fixture
def encoder_module(tmp_path, monkeypatch):
    """``myenc.py`` in the current folder, as a user would write it next to the command."""
    (tmp_path / "myenc.py").write_text(
        "import numpy as np\n"
        "def wrongshape(sentences):\n    return np.ones(len(sentences))\n"
        "NOT_CALLABLE = 3\n")
    monkeypatch.chdir(tmp_path)
    yield
    import sys

    sys.modules.pop("myenc", None)


@pytest.mark.parametrize("recipe", ["sts", "transfer"])
@pytest.mark.parametrize("spec, expected", [
    ("nosuchpkg.mod:fn", "model='nosuchpkg.mod:fn': cannot import 'nosuchpkg.mod'"),
    ("myenc:nosuchfn", "model='myenc:nosuchfn': 'myenc' has no attribute 'nosuchfn'"),
    ("myenc:NOT_CALLABLE", "model='myenc:NOT_CALLABLE' names int, which is not callable"),
    ("myenc:wrongshape", "returned shape (64,) for a batch of 64 sentences; expected (64, dim)"),
])
def test_model_specs_are_one_line(recipe, spec, expected, encoder_module, shared_data, tmp_path,
                                  capsys):
    task = "STS13" if recipe == "sts" else "TREC"
    one_line_error(capsys, [recipe, "--model", spec, "--tasks", task, "--data-root",
                            str(shared_data), "--output-dir", str(tmp_path / "out"),
                            "--no-cache", "--no-progress"], expected)
    assert not list((tmp_path / "out").rglob("*.json"))


@pytest.mark.slow
def test_a_hub_name_offline_is_one_line(shared_data, tmp_path):
    one_line_error_in_a_process(
        ["sts", "--model", "no-such-model-xyz", "--tasks", "STS13", "--data-root",
         str(shared_data), "--output-dir", str(tmp_path)],
        "adaptcl sts: error: model 'no-such-model-xyz' is neither a local model folder nor a "
        "hub model available here")


@pytest.mark.slow
def test_no_progress_prints_one_line_per_task_and_nothing_of_the_frameworks(shared_data,
                                                                             tiny_bert, tmp_path):
    """The encoder's loading (sentence-transformers' INFO line, transformers' bar) stays
    quiet: stderr holds adaptcl's one line per task scored."""
    from tests.recipes._cli import run_cli

    done = run_cli("sts", "--model", str(tiny_bert), "--pooler", "cls", "--tasks", "STS12",
                   "STSBenchmark", "--data-root", str(shared_data), "--no-progress",
                   "--output-dir", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    lines = [line for line in re.split(r"[\r\n]", done.stderr) if line.strip()]
    assert [re.sub(r".* adaptcl\.evaluation: (\w+): encoded .*", r"\1", line)
            for line in lines] == ["STS12", "STSBenchmark"], done.stderr
