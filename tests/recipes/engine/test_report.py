"""The result files: tables, environment, banners (partial, diverged, recomputed), a recipe of
one row as a table of methods."""

from __future__ import annotations

import json
from dataclasses import dataclass

from adaptcl.recipes.engine.grid import run_grid
from adaptcl.recipes.engine.provenance import environment
from adaptcl.recipes.engine.report import Report, ReportSpec, write_results
from adaptcl.recipes.engine.settings import setting
from adaptcl.recipes.engine.store import GridRun
from tests.recipes.engine._toy import cell as Cell


@dataclass
class _Config:
    lr: float = setting(0.1)
    output_dir: str = setting("x", identity=False, sweep=False)


def _record(acc: float) -> dict:
    return {"metrics": {"acc": acc}, "optimisation_steps": 1, "train_seconds": 1.5}


def test_result_files_record_environment_and_mark_partial(tmp_path, monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # a kernel override is named beside the path
    cells = [Cell("d", "m", 0), Cell("d", "m", 1)]
    grid = run_grid("toy", tmp_path, cells[:1], identity=lambda c: {},
                    compute=lambda c: _record(0.5), progress_bar=False)
    grid.cells = cells  # one planned cell never ran
    env = environment(frameworks=["numpy"], device="cpu", data_root=tmp_path,
                      data_fingerprint={"sha256": "ab" * 32})
    result = {"recipe": "toy", "environment": env, **grid.bookkeeping()}
    paths = write_results(tmp_path, result, "| a |\n")
    on_disk = json.loads(open(paths["json"]).read())
    assert on_disk["partial"] is True and on_disk["missing"] == [cells[1].as_dict()]
    for key in ("adaptcl", "torch", "python", "cpu", "cpu_capability", "torch_threads",
                "timestamp", "git_commit"):
        assert key in on_disk["environment"]
    assert on_disk["environment"]["data_root"] == str(tmp_path.resolve())
    assert on_disk["environment"]["frameworks"]["numpy"]
    markdown = open(paths["markdown"]).read()
    assert markdown.startswith("> **PARTIAL**") and "sha256 abababababab" in markdown
    overrides = "".join(f", {k}={v}" for k, v in on_disk["environment"]["kernel_overrides"].items())
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in overrides
    assert f"(kernels: {on_disk['environment']['cpu_capability']}{overrides})" in markdown


def test_recomputed_runs_are_said_in_the_table(tmp_path):
    cell = Cell("d", "m", 0)
    for lr in (0.1, 0.2):
        grid = run_grid("toy", tmp_path, [cell], identity=lambda c, lr=lr: {"lr": lr},
                        compute=lambda c: _record(0.5), progress_bar=False)
    result = {"recipe": "toy", **grid.bookkeeping()}
    markdown = open(write_results(tmp_path, result, "| a |\n")["markdown"]).read()
    assert markdown.startswith("> **RECOMPUTED**: 1 run stored with another identity")


def test_a_table_of_methods_scales_and_rounds_each_metric_and_records_the_baseline(tmp_path):
    """``scale`` / ``digits`` per metric (a percentage next to a cosine), ``metric_labels`` as
    the column heads; a metric a method lacks shows ``-``; one seed shows values alone."""
    values = {"base": (0.80, 0.5021), "new": (0.85, 0.4987)}
    grid = GridRun(cells=[Cell("d", m, 0) for m in values])
    for cell in grid.cells:
        acc, align = values[cell.loss]
        grid.records[cell] = {"metrics": {"acc": acc, "align": align}
                              | ({"tau": 0.13} if cell.loss == "new" else {})}
    spec = ReportSpec(metrics=("acc", "align", "tau"), baseline="base", by_method=True,
                      scale={"acc": 100.0}, digits={"acc": 1, "align": 3},
                      metric_labels={"acc": "accuracy (%)"})
    result = Report("toy", tmp_path, spec, axes=("dataset", "loss"), methods=list(values),
                    config=_Config()).write(grid)
    rows = {line.split(" | ")[0]: line for line in result["table_markdown"].splitlines()}
    assert rows["| new"] == "| new | 85.0 | 0.499 | 0.13 | +5.0 |"
    assert rows["| base"] == "| base | 80.0 | 0.502 | - | - |"
    assert rows["| method"] == "| method | accuracy (%) | align | tau | accuracy (%) − base |"
    assert result["summary"]["align"]["d"]["methods"]["new"]["mean"] == 0.4987  # unscaled
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["baseline"] == "base" and on_disk["axes"] == ["dataset", "loss"]
    assert on_disk["settings"] == {"lr": 0.1} and on_disk["config"]["output_dir"] == "x"


def test_every_setting_of_the_runs_identities_is_in_the_header(tmp_path):
    """A setting that enters an identity beside the config's (gradient caching's chunk, the
    devices), one whose runs differ, one that only some runs hold: each with its value(s) in
    ``results.md`` above the tables, after the recipe's own header; no row, data or code."""
    cells = [Cell("d", "m", 0, lr=0.1), Cell("d", "m", 0, lr=0.2)]
    identities = {c: {"settings": {"lr": c.lr, "width": 4, "tile": None, "flag": True,
                                   "grid": [1, 10]} | ({"mini_batch_size": 16} if c.lr == 0.2
                                                        else {}),
                      "distributed": {"devices": 2, "strategy": "ddp"}, "processes": 2,
                      "row": "d", "data": {"sha256": "ab" * 32}, "code": {"version": "x"}}
                  for c in cells}
    grid = GridRun(cells=cells, identities=identities)
    for cell in cells:
        grid.records[cell] = {"metrics": {"acc": 0.5}}
    spec = ReportSpec(metrics=("acc",), header="# toy: the recipe's own words\n")
    Report("toy", tmp_path, spec, axes=("dataset", "loss"), methods=["m"], config=_Config(),
           sweep={"lr": [0.1, 0.2]}).write(grid)
    head = (tmp_path / "results.md").read_text().split("\n## ")[0]
    assert head.startswith("# toy: the recipe's own words\n\nSettings of the runs (what their "
                           "identities hold): ")
    assert head.endswith(": lr=0.1 or 0.2, width=4, tile=none, flag=true, grid=[1, 10], "
                         "distributed.devices=2, distributed.strategy=ddp, processes=2, "
                         "mini_batch_size=16.\n"), head  # in the order the runs show them
