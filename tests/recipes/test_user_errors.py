"""Every ordinary mistake is one line ``adaptcl <recipe>: error: ...``, exit 2, before any work or
file write; a storage failure or Ctrl-C is one line too; crashes keep their traceback."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from adaptcl import cli
from adaptcl.recipes.template.store import Cell

# moleculenet's: tests/recipes/moleculenet/test_user_errors.py
RECIPES = ("demo", "images", "simcse", "sts", "transfer", "tu")


def _one_line_error(capsys, argv: list[str], expected: str) -> str:
    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code
    err = capsys.readouterr().err
    # third-party progress bars (the model-loading of transformers) may precede our one line
    lines = [line for line in err.splitlines() if line.startswith("adaptcl ")
             or "error" in line.lower()]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"adaptcl {argv[0]}: error: "), err
    assert expected in lines[0], err
    return lines[0]


@pytest.mark.parametrize("recipe", RECIPES)
def test_output_dir_that_is_a_file_is_refused_before_any_work(recipe, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    extra = ["--model", "m:f"] if recipe in ("sts", "transfer") else []
    _one_line_error(capsys, [recipe, "--output-dir", str(afile), *extra], "is a file, not a folder")
    _one_line_error(capsys, [recipe, "--output-dir", str(afile / "sub"), *extra],
                    f"is inside '{afile}', which is a file")
    assert afile.read_text() == "not a folder"


def test_unwritable_output_dir_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    # the tests run as root, for whom permissions do not apply: ask the check's own question
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: (Path(path) != locked
                                                           and real_access(path, mode)))
    _one_line_error(capsys, ["demo", "--output-dir", str(locked)], "is not writable")
    _one_line_error(capsys, ["demo", "--output-dir", str(locked / "new")],
                    f"its parent '{locked}' is not writable")
    assert list(locked.iterdir()) == []


def test_full_disk_while_writing_is_one_line_and_keeps_nothing_half_written(tmp_path, capsys,
                                                                           monkeypatch):
    from adaptcl.recipes.template import files

    real = files.atomic_write

    def full(path, write, **kwargs):  # the disk fills up when the first run record is written
        if str(path).endswith("seed0.json"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, write, **kwargs)

    monkeypatch.setattr(files, "atomic_write", full)
    line = _one_line_error(capsys, ["demo", "--epochs", "1", "--seeds", "0", "--no-progress",
                                    "--output-dir", str(tmp_path / "out")], "the disk is full")
    assert "seed0.json" in line and "rerun the same command" in line
    assert not list((tmp_path / "out").rglob("*.json"))


@pytest.mark.parametrize("err, expected", [
    (OSError(errno.EROFS, "Read-only file system", "/x/y.json"),
     "the file system is read-only writing /x/y.json"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "the disk quota is exceeded"),
    (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0"),
     "writing a checkpoint failed (is the disk full?)"),
    (RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"),
     "writing a checkpoint failed"),
])
def test_storage_errors_are_named(err, expected):
    assert expected in cli.storage_error(err)


@pytest.mark.parametrize("err", [OSError(errno.ENOENT, "No such file"), RuntimeError("boom"),
                                 ValueError("x")])
def test_other_errors_stay_crashes(err):
    assert cli.storage_error(err) is None


@pytest.mark.parametrize("argv, expected", [
    (["tu", "--lr", "nan"], "lr must be a finite number, got nan"),
    (["tu", "--temperature", "0"], "temperature must be a positive number, got 0.0"),
    (["tu", "--alpha", "-3"], "alpha must be a finite number >= 0, got -3.0"),
    (["tu", "--folds", "1"], "folds must be a number >= 2, got 1"),
    (["tu", "--folds", "500"], "folds=500 is more than MUTAG can stratify"),
    (["tu", "--inner-folds", "120"], "inner_folds=120 is more than MUTAG's outer training"),
    (["tu", "--c-grid", "1", "-1"], "each value of c_grid must be a positive number"),
    (["tu", "--aug-ratio", "1.5"], "aug_ratio must be a number in [0, 1), got 1.5"),
    (["images", "--backbone", "resnet-7"], "unknown backbone 'resnet-7'"),
])
def test_bad_numbers_are_refused_before_the_data_is_touched(argv, expected, shared_data,
                                                            tmp_path, capsys):
    out = tmp_path / "out"
    _one_line_error(capsys, [*argv, "--data-root", str(shared_data), "--output-dir", str(out),
                             "--datasets" if argv[0] != "images" else "--seeds",
                             *(["MUTAG"] if argv[0] == "tu" else ["0"])], expected)
    assert not out.exists()  # no processed data, no run store


def test_unknown_option_names_the_recipe(capsys):
    _one_line_error(capsys, ["sts", "--logger", "csv"], "unrecognized arguments: --logger csv")
    _one_line_error(capsys, ["demo", "--data-root", "x"], "unrecognized arguments: --data-root x")


def test_ctrl_c_is_one_line_with_how_to_resume(tmp_path, capsys, monkeypatch):
    from adaptcl.recipes.demo import DemoRecipe

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(DemoRecipe, "run", interrupted)
    code = cli.main(["demo", "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 130
    assert err == (f"adaptcl demo: interrupted; finished runs are kept under {tmp_path}/runs: "
                   "rerun the same command to resume")


def test_sigterm_is_one_line_too_and_the_callers_handler_comes_back(tmp_path, capsys,
                                                                     monkeypatch):
    """SIGTERM during a run stops it as Ctrl-C does (exit 143); a caller of ``cli.main`` gets
    its own SIGTERM handling back afterwards."""
    import os
    import signal

    from adaptcl.recipes.demo import DemoRecipe

    def terminated(self):
        os.kill(os.getpid(), signal.SIGTERM)  # as `kill` or a scheduler would
        raise AssertionError("SIGTERM did not stop the run")

    monkeypatch.setattr(DemoRecipe, "run", terminated)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    code = cli.main(["demo", "--output-dir", str(tmp_path)])
    assert code == 143 and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert capsys.readouterr().err.strip() == (
        f"adaptcl demo: terminated (SIGTERM); finished runs are kept under {tmp_path}/runs: "
        "rerun the same command to resume")


def test_an_interrupted_distributed_run_says_so_on_rank_0_only(tmp_path, capsys, monkeypatch):
    from adaptcl.recipes.demo import DemoRecipe

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(DemoRecipe, "run", interrupted)
    monkeypatch.setenv("LOCAL_RANK", "1")  # as Lightning's launcher starts rank 1
    assert cli.main(["demo", "--output-dir", str(tmp_path)]) == 130
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert cli.main(["demo", "--output-dir", str(tmp_path)]) == 130
    assert "adaptcl demo: interrupted" in capsys.readouterr().err


def test_a_crash_keeps_its_traceback(tmp_path, monkeypatch):
    from adaptcl.recipes.demo import DemoRecipe

    def crash(self):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(DemoRecipe, "run", crash)
    with pytest.raises(RuntimeError, match="a bug of ours"):
        cli.main(["demo", "--output-dir", str(tmp_path)])


def test_empty_panel_reason_stays_inside_its_panel(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from adaptcl.recipes.template.plots import explain_empty, save_plot

    drawn = []
    reason = ("nothing logged: the runs took 3 optimisation steps and the loss is logged every "
              "10 (--logging-steps)")

    def draw(axes):
        explain_empty(axes[0], reason)
        axes[1].plot([0, 1])
        drawn.extend(axes)

    save_plot(tmp_path / "p.png", draw, ncols=2, figsize=(9, 3.6))
    figure = drawn[0].figure
    FigureCanvasAgg(figure)
    renderer = figure.canvas.get_renderer()
    text = drawn[0].texts[0].get_window_extent(renderer)
    panel = drawn[0].get_window_extent(renderer)
    assert panel.x0 <= text.x0 and text.x1 <= panel.x1
    assert drawn[0].texts[0].get_text().replace("\n", " ") == reason


def test_diverged_cells_are_recorded_the_grid_goes_on_and_the_exit_names_them(tmp_path, capsys):
    from adaptcl.recipes.template.errors import DivergedError, RecipeError
    from adaptcl.recipes.template.recipe import Recipe
    from tests.recipes.test_recipe_hooks import ToyConfig

    class Toy(Recipe):
        name, config_class, metrics = "toy", ToyConfig, ("accuracy",)

        def compute(self, cell: Cell):
            if cell == Cell("toy", "macl", 1):
                raise DivergedError("z0 contains NaN or inf", step=3, loss=float("nan"))
            return {"metrics": {"accuracy": 0.5 + 0.1 * (cell.method == "macl")},
                    "optimisation_steps": 2, "train_seconds": 0.0}

    config = ToyConfig(output_dir=str(tmp_path), losses=["infonce", "macl"], seeds=[0, 1, 2])
    result = Toy(config).run()
    assert [d["cell"] for d in result["diverged"]] == [["toy", "macl", 1]]
    assert result["diverged"][0]["step"] == 3
    macl = result["summary"]["accuracy"]["toy"]["methods"]["macl"]
    assert macl["n"] == 2 and macl["diverged"] == [1]
    assert "(n=2, 1 diverged)" in result["table_markdown"]
    markdown = (tmp_path / "results.md").read_text()
    line = ("1 of 6 runs diverged (NaN or inf; nothing stored for them): toy/macl/seed1 at step 3 "
            "(loss nan)")
    assert f"**DIVERGED**: {line}; left out of every mean" in markdown
    with pytest.raises(RecipeError, match=re.escape(line)):
        Toy.main(Toy.config_from_args(_namespace(config)))
    capsys.readouterr()


def _namespace(config):
    import argparse
    import dataclasses

    return argparse.Namespace(**dataclasses.asdict(config))


@pytest.mark.slow
def test_training_that_diverges_is_one_line_naming_the_step(shared_data, tmp_path, capsys):
    _one_line_error(capsys, ["tu", "--data-root", str(shared_data), "--datasets", "MUTAG",
                                    "--losses", "dcl", "--seeds", "0", "--epochs", "2",
                                    "--lr", "1e30", "--no-progress", "--no-plot",
                                    "--output-dir", str(tmp_path)],
                           "1 of 1 runs diverged (NaN or inf; nothing stored for them): "
                           "MUTAG/dcl/seed0 at step ")
    assert not list((tmp_path / "runs").rglob("seed0.json"))


def test_two_ranks_need_a_batch_each_before_any_process_starts(shared_data, tmp_path, capsys):
    _one_line_error(capsys, ["images", "--data-root", str(shared_data), "--train-limit", "200",
                             "--batch-size", "128", "--devices", "2", "--strategy", "ddp",
                             "--seeds", "0", "--output-dir", str(tmp_path / "out")],
                    "(200 images, 100 per device over 2) is smaller than one batch (128)")
    assert not (tmp_path / "out").exists()


def test_only_rank_zero_speaks(tmp_path, capsys, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert cli.main(["demo", "--output-dir", str(afile)]) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert cli.main(["demo", "--output-dir", str(afile)]) == 2
    assert "is a file" in capsys.readouterr().err


@pytest.mark.slow
def test_images_that_diverge_are_one_line_naming_each_run(shared_data, tmp_path, capsys):
    _one_line_error(capsys, ["images", "--data-root", str(shared_data), "--train-limit", "64",
                             "--test-limit", "32", "--batch-size", "32", "--epochs", "2",
                             "--width", "0.0625", "--linear-epochs", "0", "--knn-every", "0",
                             "--seeds", "0", "--losses", "infonce", "macl", "--lr", "1e30",
                             "--no-progress", "--output-dir", str(tmp_path)],
                    "2 of 2 runs diverged (NaN or inf; nothing stored for them): "
                    "simclr/infonce/seed0 at step ")
    assert not list((tmp_path / "runs").rglob("seed0.json"))


def test_compare_refuses_an_output_dir_that_is_a_file(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    result = tmp_path / "results.json"
    result.write_text("{}")
    _one_line_error(capsys, ["compare", str(result), "--by", "batch-size", "--output-dir",
                             str(afile)], "is a file, not a folder")
