"""``adaptcl compare``: a sweep's result files pooled into one table and plot, never mixed with
runs made under other settings or on other data."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from scipy.stats import t

from adaptcl import cli
from adaptcl.recipes.compare.recipe import compare_results
from adaptcl.recipes.engine import Cell, GridRun, RecipeError, ReportSpec, setting
from adaptcl.recipes.engine.report import Report
from adaptcl.recipes.engine.settings import identity_settings
from adaptcl.recipes.engine.store import RunStore


@dataclass
class _SweepConfig:  # the shape of a recipe config: settings plus bookkeeping fields
    batch_size: int = setting(128)
    lr: float = setting(1e-3)
    losses: list[str] = setting(factory=lambda: ["nt_xent", "macl"], axis="loss")
    seeds: list[int] = setting(factory=lambda: [0, 1, 2], axis="seed")
    output_dir: str = setting("out", identity=False, sweep=False)
    threads: int = setting(1, identity=False, sweep=False)


def _cell(row: str, loss: str, seed: int) -> Cell:
    return Cell((("dataset", row), ("loss", loss)), seed)


# kNN accuracy (fraction) per (batch size, loss, seed)
KNN = {
    32: {"nt_xent": [0.40, 0.42, 0.41], "macl": [0.43, 0.44, 0.45]},
    64: {"nt_xent": [0.41, 0.40, 0.42], "macl": [0.41, 0.41, 0.43]},
    128: {"nt_xent": [0.41, 0.41, 0.40], "macl": [0.40, 0.42, 0.40]},
}


def _write(tmp_path, batch_size, *, lr=1e-3, data="sha-a", drop=(), code="c0de",
           baseline="nt_xent"):
    """A result file and its run store written by the runner's own writers, as a recipe would."""
    cfg = _SweepConfig(batch_size=batch_size, lr=lr)
    cells = [_cell("cifar10", loss, s) for s in cfg.seeds for loss in cfg.losses]
    grid = GridRun(cells=cells)
    out = tmp_path / f"b{batch_size}-{lr}-{data}-{code}"
    identity = {"settings": identity_settings(cfg), "data": data,
                "code": {"adaptcl": "0.1.0", "sources": code}}
    for cell in cells:
        if cell not in drop:
            grid.records[cell] = {"metrics": {"knn_top1": KNN[batch_size][cell.loss][cell.seed]},
                                  "train_seconds": 10.0}
            RunStore(out).save(cell, identity, grid.records[cell])
            grid.identities[cell] = identity
    Report("images", out, ReportSpec(metrics=("knn_top1",), baseline=baseline),
           axes=("dataset", "loss"), methods=cfg.losses, config=cfg,
           environment={"data_fingerprint": {"sha256": data}}).write(grid)
    return out / "results.json"


def test_compare_pools_a_batch_size_sweep_with_paired_intervals(tmp_path):
    files = [_write(tmp_path, b) for b in (128, 32, 64)]  # any order: rows sort by value
    result = compare_results(files, ["batch_size"], output_dir=tmp_path / "sweep")

    summary = result["summary"]["knn_top1"]
    assert list(summary) == ["batch_size=32", "batch_size=64", "batch_size=128"]
    diffs = [100 * (m - n) for m, n in zip(KNN[32]["macl"], KNN[32]["nt_xent"], strict=True)]
    mean = sum(diffs) / 3
    sd = (sum((d - mean) ** 2 for d in diffs) / 2) ** 0.5
    half = t.ppf(0.975, 2) * sd / 3**0.5
    paired = summary["batch_size=32"]["paired"]["macl"]
    assert paired["mean"] == pytest.approx(3.0)
    assert paired["ci95"] == pytest.approx([mean - half, mean + half])
    assert summary["batch_size=128"]["methods"]["nt_xent"]["mean"] == pytest.approx(40.6667, abs=1e-3)

    table = (tmp_path / "sweep" / "results.md").read_text()
    assert "| batch_size | nt_xent | macl | macl − nt_xent [95% CI] |" in table
    assert table.index("batch_size=32") < table.index("batch_size=64") < table.index("batch_size=128")
    saved = json.loads((tmp_path / "sweep" / "results.json").read_text())
    assert [i["by"] for i in saved["inputs"]] == [{"batch_size": 32}, {"batch_size": 64},
                                                  {"batch_size": 128}]
    assert all(len(i["sha256"]) == 64 for i in saved["inputs"]) and not saved["partial"]
    assert (tmp_path / "sweep" / "compare.png").stat().st_size > 10_000


def test_the_default_baseline_is_the_one_the_files_were_paired_against(tmp_path):
    files = [_write(tmp_path, b, baseline="macl") for b in (32, 64)]
    result = compare_results(files, ["batch_size"], output_dir=tmp_path / "sweep")
    assert result["baseline"] == "macl"
    assert set(result["summary"]["knn_top1"]["batch_size=32"]["paired"]) == {"nt_xent"}


def test_compare_refuses_files_that_differ_in_another_setting(tmp_path):
    files = [_write(tmp_path, 32), _write(tmp_path, 64, lr=2e-3)]
    with pytest.raises(RecipeError, match=r"differs .* in lr \(0\.002 vs 0\.001\)"):
        compare_results(files, ["batch_size"], output_dir=tmp_path / "sweep")
    assert not (tmp_path / "sweep").exists()  # nothing written


def test_compare_refuses_results_computed_on_other_data(tmp_path):
    files = [_write(tmp_path, 32), _write(tmp_path, 64, data="sha-b")]
    with pytest.raises(RecipeError, match="other data"):
        compare_results(files, ["batch_size"], output_dir=tmp_path / "sweep")


def test_compare_refuses_runs_computed_with_other_code(tmp_path):
    files = [_write(tmp_path, 32), _write(tmp_path, 64, code="beef")]
    with pytest.raises(RecipeError, match="other code"):
        compare_results(files, ["batch_size"], output_dir=tmp_path / "sweep")
    result = compare_results(files[:1], ["batch_size"], output_dir=tmp_path / "one")
    assert result["code"] == [{"adaptcl": "0.1.0", "sources": "c0de"}]


def test_compare_refuses_two_files_with_the_same_value(tmp_path):
    one = _write(tmp_path, 32)
    other = tmp_path / "copy.json"
    other.write_text(one.read_text())
    with pytest.raises(RecipeError, match="both have batch_size=32"):
        compare_results([one, other], ["batch_size"], output_dir=tmp_path / "sweep")


def test_a_partial_input_makes_a_partial_table(tmp_path):
    files = [_write(tmp_path, 32), _write(tmp_path, 64, drop=[_cell("cifar10", "macl", 2)])]
    result = compare_results(files, ["batch_size"], output_dir=tmp_path / "sweep")
    assert result["partial"] and result["missing"] == [_cell("cifar10", "macl", 2).as_dict()]
    assert result["summary"]["knn_top1"]["batch_size=64"]["paired"]["macl"]["n"] == 2
    assert (tmp_path / "sweep" / "results.md").read_text().startswith("> **PARTIAL**")


def test_cli_user_error_is_one_line_with_exit_2(tmp_path, capsys):
    files = [str(_write(tmp_path, 32))]
    assert cli.main(["compare", *files, "--by", "batch-size", "--output-dir",
                     str(tmp_path / "ok")]) == 0
    assert cli.main(["compare", *files, "--by", "width"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("adaptcl compare: error: --by width: not a setting of images (")
    assert cli.main(["compare", str(tmp_path / "nope.json"), "--by", "batch_size"]) == 2
    assert "no result file" in capsys.readouterr().err


def test_losses_select_and_order_the_columns(tmp_path):
    files = [_write(tmp_path, 32), _write(tmp_path, 64)]
    result = compare_results(files, ["batch_size"], losses=["macl"], baseline="macl",
                             output_dir=tmp_path / "sweep")
    assert list(result["summary"]["knn_top1"]["batch_size=32"]["methods"]) == ["macl"]
    with pytest.raises(RecipeError, match="--losses amcl: not in these results"):
        compare_results(files, ["batch_size"], losses=["amcl"], output_dir=tmp_path / "x")


@dataclass
class _TUConfig:  # tu's shape: a list-valued ``datasets`` setting, one fingerprint per dataset
    datasets: list[str] = setting(factory=lambda: ["MUTAG"], axis="dataset")
    epochs: int = setting(20)
    losses: list[str] = setting(factory=lambda: ["graphcl", "macl"], axis="loss")
    seeds: list[int] = setting(factory=lambda: [0, 1, 2], axis="seed")
    output_dir: str = setting("out", identity=False, sweep=False)


ACCURACY = {"MUTAG": {"graphcl": [0.86, 0.88, 0.87], "macl": [0.87, 0.90, 0.88]},
            "DD": {"graphcl": [0.78, 0.79, 0.79], "macl": [0.78, 0.80, 0.78]},
            "NCI1": {"graphcl": [0.80, 0.79, 0.80], "macl": [0.79, 0.79, 0.80]}}


def _write_tu(tmp_path, datasets, *, prints=None, epochs=20):
    cfg = _TUConfig(datasets=list(datasets), epochs=epochs)
    prints = prints or {}
    fingerprint = {d: {"sha256": prints.get(d, f"sha-{d}"), "files": 5} for d in datasets}
    cells = [_cell(d, loss, s) for d in datasets for s in cfg.seeds for loss in cfg.losses]
    grid = GridRun(cells=cells)
    out = tmp_path / "-".join([*datasets, str(epochs), *prints.values()])
    identity = {"settings": identity_settings(cfg), "data": fingerprint,
                "code": {"adaptcl": "0.1.0", "sources": "c0de"}}
    for cell in cells:
        grid.records[cell] = {"metrics": {"accuracy": ACCURACY[cell.dataset][cell.loss][cell.seed]}}
        grid.identities[cell] = identity
        RunStore(out).save(cell, identity, grid.records[cell])
    Report("tu", out, ReportSpec(metrics=("accuracy",), baseline="graphcl"),
           axes=("dataset", "loss"), methods=cfg.losses, config=cfg,
           environment={"data_fingerprint": fingerprint}).write(grid)
    return out / "results.json"


def test_compare_by_datasets_pools_one_file_per_dataset_in_command_line_order(tmp_path):
    files = [_write_tu(tmp_path, [d]) for d in ("NCI1", "MUTAG", "DD")]
    result = compare_results(files, ["datasets"], output_dir=tmp_path / "tu")

    summary = result["summary"]["accuracy"]
    assert list(summary) == ["datasets=NCI1", "datasets=MUTAG", "datasets=DD"]
    assert summary["datasets=MUTAG"]["paired"]["macl"]["mean"] == pytest.approx(4.0 / 3)
    assert summary["datasets=DD"]["methods"]["graphcl"]["n"] == 3
    assert "| datasets | graphcl | macl | macl − graphcl [95% CI] |" in result["table_markdown"]
    assert [i["by"] for i in result["inputs"]] == [{"datasets": ("NCI1",)}, {"datasets": ("MUTAG",)},
                                                   {"datasets": ("DD",)}]
    assert (tmp_path / "tu" / "compare.png").stat().st_size > 10_000


def test_compare_by_datasets_checks_each_dataset_against_every_file_that_holds_it(tmp_path):
    files = [_write_tu(tmp_path, ["MUTAG", "DD"]), _write_tu(tmp_path, ["DD"], prints={"DD": "x"})]
    with pytest.raises(RecipeError, match="other data"):
        compare_results(files, ["datasets"], output_dir=tmp_path / "tu")
    files[1] = _write_tu(tmp_path, ["DD"])  # the same DD: a file per dataset set is fine
    result = compare_results(files, ["datasets"], output_dir=tmp_path / "tu")
    assert list(result["summary"]["accuracy"]) == ["MUTAG, datasets=MUTAG DD",
                                                   "DD, datasets=MUTAG DD", "DD, datasets=DD"]
    with pytest.raises(RecipeError, match=r"differs .* in epochs \(40 vs 20\)"):
        compare_results([files[0], _write_tu(tmp_path, ["NCI1"], epochs=40)], ["datasets"],
                        output_dir=tmp_path / "x")


def test_compare_refuses_an_output_dir_that_is_a_file(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    files = [str(_write(tmp_path, 32))]
    assert cli.main(["compare", *files, "--by", "batch-size", "--output-dir", str(afile)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"adaptcl compare: error: --output-dir '{afile}' is a file, not a folder")
