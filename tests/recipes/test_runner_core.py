"""The shared recipe runner: run identity, refusing non-results, summaries, result files."""

from __future__ import annotations

import json
import math

import pytest

from adaptcl.recipes.template.errors import NonResultError, RecipeError, check_embeddings
from adaptcl.recipes.template.files import load_or_rebuild, torch_load_checked, write_json_atomic
from adaptcl.recipes.template.loggers import metric_logger
from adaptcl.recipes.template.plots import explain_empty, save_plot
from adaptcl.recipes.template.provenance import environment, fingerprint_files
from adaptcl.recipes.template.report import (
    Report,
    paired_difference,
    summarize,
    summary_table,
    write_results,
)
from adaptcl.recipes.template.store import Cell, GridRun, RunStore, run_grid
from adaptcl.recipes.template.torch_env import autocast, grad_scaler, resolve_device


def _record(acc: float, steps: int = 4) -> dict:
    return {"metrics": {"acc": acc}, "optimisation_steps": steps, "train_seconds": 1.5}


def _grid(out, cells, identity, compute):
    return run_grid("toy", out, cells, identity=lambda c: identity, compute=compute,
                           progress_bar=False)


def test_same_identity_reuses_stored_runs_and_says_so(tmp_path):
    cells = [Cell("d", "base", 0), Cell("d", "base", 1)]
    first = _grid(tmp_path, cells, {"lr": 0.1}, lambda c: _record(0.5 + c.seed))
    assert first.computed == cells and first.reused == []

    def boom(cell):
        raise AssertionError("a stored run with the same identity was recomputed")

    again = _grid(tmp_path, cells, {"lr": 0.1}, boom)
    assert again.reused == cells and again.computed == []
    assert again.records[cells[1]]["metrics"]["acc"] == 1.5
    assert again.bookkeeping()["reused"] == [["d", "base", 0], ["d", "base", 1]]
    assert again.bookkeeping()["total_train_seconds"] == 3.0


def test_changed_identity_recomputes_and_keeps_the_old_record_aside(tmp_path):
    cell = Cell("d", "base", 0)
    _grid(tmp_path, [cell], {"data": "aaa"}, lambda c: _record(0.25))
    changed = _grid(tmp_path, [cell], {"data": "bbb"}, lambda c: _record(0.75))
    assert changed.computed == [cell] and changed.reused == []
    assert changed.records[cell]["metrics"]["acc"] == 0.75
    (aside,) = changed.superseded
    assert json.loads(open(aside).read())["record"]["metrics"]["acc"] == 0.25
    assert "superseded" in aside


@pytest.mark.parametrize("content", ['{"identity": {"lr"', '[1, 2]', '{"identity_hash": "x"}'],
                         ids=["truncated", "not-a-record", "no-record"])
def test_unreadable_record_is_named_set_aside_and_recomputed(tmp_path, capsys, content):
    cell = Cell("d", "base", 0)
    path = RunStore(tmp_path).path(cell)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    grid = _grid(tmp_path, [cell], {"lr": 1}, lambda c: _record(0.5))
    assert grid.computed == [cell]
    (aside,) = grid.superseded
    assert open(aside).read() == content
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"adaptcl: run record at {path} is corrupt or truncated (")
    assert err.endswith(f"); moved to {aside} and recomputed\n")


def test_a_record_of_other_settings_is_superseded_without_a_corruption_note(tmp_path, capsys):
    cell = Cell("d", "base", 0)
    _grid(tmp_path, [cell], {"lr": 1}, lambda c: _record(0.5))
    assert len(_grid(tmp_path, [cell], {"lr": 2}, lambda c: _record(0.5)).superseded) == 1
    assert "corrupt" not in capsys.readouterr().err


def test_run_without_optimisation_step_is_refused_and_not_stored(tmp_path):
    cell = Cell("d", "macl", 0)
    with pytest.raises(NonResultError, match="no optimisation step"):
        _grid(tmp_path, [cell], {}, lambda c: _record(0.86, steps=0))
    assert not RunStore(tmp_path).path(cell).exists()


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_metric_is_refused(tmp_path, bad):
    cell = Cell("d", "m", 0)
    grid = _grid(tmp_path, [cell], {}, lambda c: _record(bad))
    assert "non-finite metrics" in grid.diverged[cell]["message"] and not grid.records
    assert not RunStore(tmp_path).path(cell).exists()


def test_non_finite_or_constant_embeddings_are_refused():
    import numpy as np

    good = np.random.default_rng(0).normal(size=(5, 3))
    check_embeddings(good, "ok")
    nan = good.copy()
    nan[2, 1] = np.nan
    with pytest.raises(NonResultError, match="1 embeddings contain NaN"):
        check_embeddings(nan, "encoder x")
    with pytest.raises(NonResultError, match="same vector"):
        check_embeddings(np.ones((5, 3)), "encoder x")


def test_json_results_refuse_nan(tmp_path):
    with pytest.raises(ValueError, match="refusing to write"):
        write_json_atomic(tmp_path / "r.json", {"acc": float("nan")})
    assert not (tmp_path / "r.json").exists()


def test_paired_difference_matches_scipy_paired_t_interval():
    from scipy.stats import ttest_rel

    adaptive = {0: 88.0, 1: 86.5, 2: 87.9, 3: 89.1}
    base = {0: 86.0, 1: 86.0, 2: 86.8, 3: 87.0, 4: 85.0}  # seed 4 has no pair
    diff = paired_difference(adaptive, base)
    ci = ttest_rel([adaptive[s] for s in range(4)], [base[s] for s in range(4)]
                   ).confidence_interval(0.95)
    assert diff["n"] == 4 and diff["seeds"] == [0, 1, 2, 3]
    assert diff["mean"] == pytest.approx(1.425)
    assert diff["ci95"] == pytest.approx([ci.low, ci.high])
    one = paired_difference({0: 1.0}, {0: 0.5})
    assert one["mean"] == 0.5 and one["ci95"] is None


def test_summary_table_has_mean_std_and_paired_difference():
    records = {Cell("MUTAG", m, s): _record(a) for m, accs in
               {"graphcl": [0.80, 0.82], "macl": [0.84, 0.85]}.items()
               for s, a in enumerate(accs)}
    summary = summarize(records, "acc", datasets=["MUTAG"],
                               methods=["graphcl", "macl"], baseline="graphcl", scale=100)
    assert summary["MUTAG"]["methods"]["macl"]["mean"] == pytest.approx(84.5)
    assert summary["MUTAG"]["methods"]["graphcl"]["std"] == pytest.approx(1.0)  # population
    assert summary["MUTAG"]["paired"]["macl"]["mean"] == pytest.approx(3.5)
    table = summary_table(summary, methods=["graphcl", "macl"], baseline="graphcl",
                                 labels={"graphcl": "GraphCL", "macl": "MACL"})
    assert "81.00 ± 1.00 (n=2)" in table and "MACL − GraphCL [95% CI]" in table
    assert "+3.50 [" in table


def test_methods_table_scales_and_rounds_each_metric_and_records_the_baseline(tmp_path):
    """``scale`` / ``digits`` per metric (a percentage next to a cosine), ``metric_labels`` as
    the column heads; a metric a method lacks shows ``-``; the result names its baseline."""
    values = {"base": (0.80, 0.5021), "new": (0.85, 0.4987)}
    grid = GridRun(cells=[Cell("d", m, 0) for m in values])
    for cell in grid.cells:
        acc, align = values[cell.method]
        grid.records[cell] = {"metrics": {"acc": acc, "align": align}
                              | ({"tau": 0.13} if cell.method == "new" else {})}
    result = Report("toy", tmp_path, {}, metrics=["acc", "align", "tau"], datasets=["d"],
                    methods=list(values), baseline="base", table_rows="methods",
                    scale={"acc": 100.0}, digits={"acc": 1, "align": 3},
                    metric_labels={"acc": "accuracy (%)"}).write(grid)
    rows = {line.split(" | ")[0]: line for line in result["table_markdown"].splitlines()}
    assert rows["| new"] == ("| new | 85.0 ± 0.0 (n=1) | 0.499 ± 0.000 (n=1) | 0.13 ± 0.00 (n=1) "
                             "| +5.0 (n=1) |")
    assert rows["| base"] == "| base | 80.0 ± 0.0 (n=1) | 0.502 ± 0.000 (n=1) | - | - |"
    assert "| method | accuracy (%) | align | tau | accuracy (%) − base [95% CI] |" in rows[
        "| method"]
    assert result["summary"]["align"]["d"]["methods"]["new"]["mean"] == 0.4987  # unscaled
    assert json.loads((tmp_path / "results.json").read_text())["baseline"] == "base"


def test_fingerprint_follows_content_not_location(tmp_path):
    for where in ("a", "b"):
        (tmp_path / where).mkdir()
        (tmp_path / where / "x.txt").write_text("1 2 3\n")
    fa = fingerprint_files([tmp_path / "a"], root=tmp_path / "a")
    fb = fingerprint_files([tmp_path / "b"], root=tmp_path / "b")
    assert fa == fb and fa["files"] == 1 and fa["bytes"] == 6
    (tmp_path / "b" / "x.txt").write_text("1 2 4\n")
    assert fingerprint_files([tmp_path / "b"], root=tmp_path / "b") != fa
    with pytest.raises(FileNotFoundError):
        fingerprint_files([tmp_path / "missing"])


def test_result_files_record_environment_and_mark_partial(tmp_path):
    cells = [Cell("d", "m", 0), Cell("d", "m", 1)]
    grid = _grid(tmp_path, cells[:1], {}, lambda c: _record(0.5))
    grid.cells = cells  # one planned cell never ran
    env = environment(frameworks=["numpy"], device="cpu", data_root=tmp_path,
                             data_fingerprint={"sha256": "ab" * 32})
    result = {"recipe": "toy", "environment": env, **grid.bookkeeping()}
    paths = write_results(tmp_path, "toy_results", result, "| a |\n")
    on_disk = json.loads(open(paths["json"]).read())
    assert on_disk["partial"] is True and on_disk["missing"] == [["d", "m", 1]]
    for key in ("adaptcl", "torch", "python", "cpu", "torch_threads", "timestamp", "git_commit"):
        assert key in on_disk["environment"]
    assert on_disk["environment"]["data_root"] == str(tmp_path.resolve())
    assert on_disk["environment"]["frameworks"]["numpy"]
    markdown = open(paths["markdown"]).read()
    assert markdown.startswith("> **PARTIAL**") and "sha256 abababababab" in markdown


def test_corrupt_derived_file_is_named_and_rebuilt(tmp_path, capsys):
    import torch

    path = tmp_path / "data.pt"
    torch.save({"x": torch.arange(10)}, path)
    path.write_bytes(path.read_bytes()[:40])  # killed mid-write

    def rebuild():
        torch.save({"x": torch.arange(3)}, path)
        return torch.load(path)

    value = load_or_rebuild(path, lambda: torch.load(path), rebuild, what="cache")
    assert value["x"].tolist() == [0, 1, 2]
    assert f"cache at {path} is corrupt or truncated" in capsys.readouterr().err


def test_empty_plot_panel_says_why(tmp_path):
    panels = []

    def draw(axes):
        panels.extend(axes)
        axes[0].plot([0, 1], [1, 0], label="loss")
        explain_empty(axes[1], "kNN monitor off: --epochs 2 < --knn-every 5")

    path = save_plot(tmp_path / "p.png", draw, ncols=2)
    assert (tmp_path / "p.png").stat().st_size > 0 and path.endswith("p.png")
    assert [t.get_text() for t in panels[1].texts] == ["kNN monitor off: --epochs 2 < --knn-every 5"]
    assert len(panels[0].texts) == 0


def test_tensorboard_logger_writes_events_tensorboard_reads(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with metric_logger("tensorboard", tmp_path / "tb") as log:
        for step in range(3):
            log.log({"train/loss": 1.0 / (step + 1), "train/temperature": 0.2, "note": "x"}, step)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["train/loss", "train/temperature"]
    assert [round(e.value, 4) for e in events.Scalars("train/loss")] == [1.0, 0.5, 0.3333]


def test_csv_logger_and_unknown_logger(tmp_path):
    with metric_logger("csv", tmp_path) as log:
        log.log({"loss": 2.0}, 7)
    assert (tmp_path / "metrics.csv").read_text().splitlines() == ["step,name,value", "7,loss,2.0"]
    with pytest.raises(RecipeError, match="--logger"):
        metric_logger("wandb", tmp_path)


def test_device_and_precision_are_validated_and_autocast_runs():
    import torch

    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(RecipeError, match="--device"):
        resolve_device("tpu")
    with pytest.raises(RecipeError, match="--precision"):
        autocast("cpu", "fp8")
    with autocast("cpu", "bf16-mixed"):
        y = torch.nn.Linear(4, 4)(torch.randn(2, 4))
    assert y.dtype == torch.bfloat16
    assert not grad_scaler("cpu", "32").is_enabled()


def test_corrupt_checkpoint_is_named_kept_aside_and_not_loaded(tmp_path, capsys):
    import torch

    path = tmp_path / "last.ckpt"
    assert torch_load_checked(path, what="checkpoint") is None  # missing: start afresh
    torch.save({"epoch": 3}, path)
    assert torch_load_checked(path, what="checkpoint", weights_only=True) == {"epoch": 3}
    path.write_bytes(path.read_bytes()[:30])
    assert torch_load_checked(path, what="checkpoint", weights_only=True) is None
    assert f"checkpoint at {path} is corrupt" in capsys.readouterr().err
    assert not path.exists() and (tmp_path / "last.ckpt.corrupt").is_file()
