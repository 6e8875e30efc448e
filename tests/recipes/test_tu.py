"""The ``tu`` recipe: SVM protocol, data preparation, a tiny real run on MUTAG, resume, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch_geometric")
pytest.importorskip("sklearn")

from adaptcl import cli  # noqa: E402
from adaptcl.recipes import tu  # noqa: E402
from adaptcl.recipes.graph_eval import svm_cv_accuracy  # noqa: E402

# ---------------------------------------------------------------------------- SVM protocol


def blobs(n: int = 120, d: int = 6, shift: float = 3.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 2
    x = rng.normal(size=(n, d)) + shift * y[:, None]
    return x, np.where(y == 1, "a", "b")  # string labels are encoded


def test_svm_cv_protocol_on_separable_data():
    x, y = blobs()
    res = svm_cv_accuracy(x, y)
    assert res["folds"] == 10 and len(res["fold_accuracies"]) == 10 and len(res["best_C"]) == 10
    assert res["accuracy"] > 0.95
    assert set(res["best_C"]) <= set(res["c_grid"])
    again = svm_cv_accuracy(x, y)
    assert again["fold_accuracies"] == res["fold_accuracies"]  # fixed CV seed: reproducible
    lin = svm_cv_accuracy(x, y, classifier="linear", standardize=True, folds=5, inner_folds=3)
    assert lin["accuracy"] > 0.95 and len(lin["fold_accuracies"]) == 5
    unseeded = svm_cv_accuracy(x, y, cv_seed=None, search=False)
    assert unseeded["best_C"] == [10.0] * 10


def test_svm_cv_on_noise_is_near_chance_and_validates():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(100, 4)), np.arange(100) % 2
    res = svm_cv_accuracy(x, y, folds=5, inner_folds=3)
    assert 0.2 < res["accuracy"] < 0.8
    with pytest.raises(ValueError):
        svm_cv_accuracy(x, y[:50])
    with pytest.raises(ValueError):
        svm_cv_accuracy(np.full((100, 4), np.nan), y)
    with pytest.raises(ValueError):
        svm_cv_accuracy(x, y, classifier="rbf-typo")


# ------------------------------------------------------------------------------------ data


def test_prepare_copies_raw_and_never_writes_to_source(shared_data, tmp_path):
    before = sorted(p.name for p in (shared_data / "tu" / "MUTAG").iterdir())
    root = tu.prepare_tu_root(shared_data, "MUTAG", tmp_path / "work")
    assert (root / "MUTAG" / "raw" / "MUTAG_A.txt").is_file()
    assert sorted(p.name for p in (shared_data / "tu" / "MUTAG").iterdir()) == before
    with pytest.raises(FileNotFoundError):
        tu.prepare_tu_root(shared_data, "NOT-A-DATASET", tmp_path / "work")


def test_featureless_dataset_gets_constant_or_degree_features(shared_data, tmp_path):
    cfg = tu.TUConfig(datasets=["IMDB-BINARY"], data_root=str(shared_data),
                      out_dir=str(tmp_path / "out"), work_dir=str(tmp_path / "work"))
    graphs, dim, info = tu.load_tu_graphs(cfg, "IMDB-BINARY")
    assert len(graphs) == 1000 and dim == 1 and info["num_classes"] == 2
    assert all(g.x.shape == (g.num_nodes, 1) for g in graphs[:50])
    cfg.node_features, cfg.max_degree = "degree", 20
    graphs, dim, _ = tu.load_tu_graphs(cfg, "IMDB-BINARY")
    assert dim == 21 and all(float(g.x.sum()) == g.num_nodes for g in graphs[:50])
    assert tu.resolve_aug(cfg, "IMDB-BINARY") == "random4"
    assert tu.resolve_aug(cfg, "MUTAG") == "random2"


def test_config_hash_and_graphcl_exact():
    a, b = tu.TUConfig(), tu.TUConfig(progress=False, out_dir="elsewhere")
    assert a.result_key() == b.result_key()  # bookkeeping does not change results
    assert a.result_key() != tu.TUConfig(epochs=5).result_key()
    exact = tu.TUConfig.graphcl_exact()
    assert exact.graphcl_quirks and exact.cv_seed is None and exact.aug_ratio == 0.1
    assert exact.subgraph_ratio == 0.2 and exact.first_view == "identity"
    with pytest.raises(ValueError):
        tu.TUConfig(first_view="both")
    with pytest.raises(ValueError):
        tu.TUConfig(classifier="knn")


# ------------------------------------------------------------------- tiny real run + resume


@pytest.mark.slow
def test_tiny_mutag_run_writes_results_and_resumes(shared_data, tmp_path, monkeypatch):
    out = tmp_path / "out"
    cfg = tu.TUConfig(datasets=["MUTAG"], losses=["graphcl", "macl"], seeds=[0], epochs=2,
                      data_root=str(shared_data), out_dir=str(out), inner_folds=3,
                      c_grid=[0.1, 1.0, 10.0], progress=False)
    result = tu.run_tu(cfg)
    assert result["computed"] == [["MUTAG", "graphcl", 0], ["MUTAG", "macl", 0]]
    assert result["skipped"] == []

    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["recipe"] == "tu" and on_disk["config"]["epochs"] == 2
    for run in on_disk["runs"]:
        ev = run["evaluation"]
        assert ev["folds"] == 10 and len(ev["fold_accuracies"]) == 10
        assert all(0.0 <= a <= 1.0 for a in ev["fold_accuracies"])
        assert 0.0 <= run["accuracy"] <= 1.0 and run["embedding_dim"] == 96
        assert len(run["epoch_loss"]) == 2 and all(np.isfinite(run["epoch_loss"]))
    summary = on_disk["summary"]["MUTAG"]
    assert summary["info"]["num_graphs"] == 188
    assert summary["paper_table4"]["macl"] == [89.04, 0.98]
    assert 0.0 <= summary["losses"]["macl"]["mean"] <= 100.0
    table = (out / "results.md").read_text()
    assert "| MUTAG |" in table and "86.80 ± 1.34" in table and "89.04 ± 0.98" in table
    assert (out / "macl_temperature_alignment.png").stat().st_size > 0
    macl_run = json.loads(tu.run_path(cfg, "MUTAG", "macl", 0).read_text())
    temps = macl_run["step_stats"]["temperature"]
    assert len(temps) == 2 * 2 and all(t > 0 for t in temps)  # 2 epochs x 2 batches of 128
    assert (tmp_path / "out" / "data" / "MUTAG" / "processed").is_dir()

    # rerun: nothing is recomputed (run_one would fail if it were called)
    def boom(*args, **kwargs):
        raise AssertionError("a finished run was recomputed")

    monkeypatch.setattr(tu, "run_one", boom)
    again = tu.run_tu(cfg)
    assert again["computed"] == [] and len(again["skipped"]) == 2
    assert again["summary"]["MUTAG"]["losses"] == result["summary"]["MUTAG"]["losses"]
    assert again["summary"]["MUTAG"]["info"]["num_graphs"] == 188

    # an interrupted multi-seed run: only the missing seed is computed
    calls = []

    def fake_run_one(cfg_, name, loss_name, seed, graphs, dim, position=1):
        calls.append((name, loss_name, seed))
        return {"dataset": name, "loss": loss_name, "seed": seed, "accuracy": 0.5,
                "evaluation": {"fold_accuracies": [0.5] * 10}, "epoch_loss": [1.0],
                "step_stats": {}, "train_seconds": 0.0, "eval_seconds": 0.0}

    monkeypatch.setattr(tu, "run_one", fake_run_one)
    more = tu.run_tu(tu.TUConfig(**{**cfg.__dict__, "seeds": [0, 1], "losses": ["macl"]}))
    assert calls == [("MUTAG", "macl", 1)]
    assert more["summary"]["MUTAG"]["losses"]["macl"]["n_seeds"] == 2


def test_cli_registers_tu_and_builds_config(tmp_path):
    parser = cli.build_parser("tu")
    args = parser.parse_args(["tu", "--datasets", "MUTAG", "NCI1", "--losses", "graphcl",
                              "macl", "--seeds", "0", "1", "--out-dir", str(tmp_path),
                              "--cv-seed", "none", "--classifier", "linear"])
    cfg = tu.config_from_args(args)
    assert cfg.datasets == ["MUTAG", "NCI1"] and cfg.seeds == [0, 1]
    assert cfg.cv_seed is None and cfg.classifier == "linear" and not cfg.graphcl_quirks
    exact = tu.config_from_args(parser.parse_args(["tu", "--graphcl-exact"]))
    assert exact.graphcl_quirks and exact.cv_seed is None and exact.aug_ratio == 0.1
    with pytest.raises(SystemExit) as info:
        cli.main(["tu", "--help"])
    assert info.value.code == 0
    assert Path(tu.__file__).name == "tu.py"
