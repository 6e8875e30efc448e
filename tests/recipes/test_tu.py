"""The ``tu`` recipe: data preparation, a tiny real run on MUTAG, resume, CLI."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

pytest.importorskip("torch_geometric")
pytest.importorskip("sklearn")

from adaptcl import cli  # noqa: E402
from adaptcl.recipes import tu, tu_data  # noqa: E402
from adaptcl.recipes.template.errors import NonResultError
from adaptcl.recipes.template.store import Cell

# ------------------------------------------------------------------------------------ data


@pytest.fixture
def mutag_root(shared_data, tmp_path):
    """A private copy of MUTAG's raw files as a data root (tests may change it)."""
    import shutil

    root = tmp_path / "data"
    shutil.copytree(shared_data / "tu" / "MUTAG", root / "tu" / "MUTAG")
    for path in (root / "tu" / "MUTAG" / "raw").iterdir():
        path.chmod(0o644)
    return root


def test_prepare_copies_raw_and_never_writes_to_source(shared_data, tmp_path):
    before = sorted(p.name for p in (shared_data / "tu" / "MUTAG").iterdir())
    name, raw = tu_data.find_raw(shared_data, "mutag")  # names match case-insensitively
    assert name == "MUTAG"
    root = tu_data.prepare_tu_root(raw, name, tmp_path / "work", "abc123")
    assert (root / "MUTAG" / "raw" / "MUTAG_A.txt").is_file() and root.name == "abc123"
    assert sorted(p.name for p in (shared_data / "tu" / "MUTAG").iterdir()) == before
    with pytest.raises(FileNotFoundError):
        tu_data.find_raw(shared_data, "NOT-A-DATASET")


def test_featureless_dataset_gets_constant_or_degree_features(shared_data, tmp_path):
    cfg = tu.TUConfig(datasets=["IMDB-BINARY"], data_root=str(shared_data),
                      output_dir=str(tmp_path / "out"), work_dir=str(tmp_path / "work"))
    _, raw = tu_data.find_raw(shared_data, "IMDB-BINARY")
    graphs, dim, info = tu_data.load_tu_graphs(cfg, "IMDB-BINARY", raw, "imdb")
    assert len(graphs) == 1000 and dim == 1 and info["num_classes"] == 2
    assert all(g.x.shape == (g.num_nodes, 1) for g in graphs[:50])
    cfg.node_features, cfg.max_degree = "degree", 20
    graphs, dim, _ = tu_data.load_tu_graphs(cfg, "IMDB-BINARY", raw, "imdb")
    assert dim == 21 and all(float(g.x.sum()) == g.num_nodes for g in graphs[:50])
    assert tu.resolve_aug(cfg, "IMDB-BINARY") == "random4"
    assert tu.resolve_aug(cfg, "MUTAG") == "random2"


def test_truncated_processed_dataset_is_named_and_rebuilt(mutag_root, tmp_path, capsys):
    cfg = tu.TUConfig(data_root=str(mutag_root), output_dir=str(tmp_path / "out"))
    _, raw = tu_data.find_raw(mutag_root, "MUTAG")
    graphs, _, _ = tu_data.load_tu_graphs(cfg, "MUTAG", raw, "fp")
    (processed,) = (tmp_path / "out" / "data").glob("fp/MUTAG/processed/data.pt")
    processed.write_bytes(processed.read_bytes()[:200])  # killed while torch-geometric wrote it
    again, _, _ = tu_data.load_tu_graphs(cfg, "MUTAG", raw, "fp")
    assert len(again) == len(graphs) == 188
    err = capsys.readouterr().err
    assert "processed MUTAG dataset" in err and "corrupt or truncated" in err
    assert str(processed.parent) in err


def test_config_settings_and_graphcl_exact():
    a, b = tu.TUConfig(), tu.TUConfig(progress=False, output_dir="elsewhere", threads=2)
    assert a.result_settings() == b.result_settings()  # bookkeeping does not change results
    assert a.result_settings() != tu.TUConfig(epochs=5).result_settings()
    exact = tu.TUConfig.graphcl_exact()
    assert exact.graphcl_quirks and exact.cv_seed is None and exact.aug_ratio == 0.1
    assert exact.subgraph_ratio == 0.2 and exact.first_view == "identity"
    assert tu.TUConfig(losses=["MACL"]).losses == ["macl"]
    for bad in ({"first_view": "both"}, {"classifier": "knn"}, {"batch_size": 1}):
        with pytest.raises(ValueError):
            tu.TUConfig(**bad)


@pytest.mark.parametrize(("bad", "named"), [
    ({"devices": 0}, "devices"),
    ({"devices": 2, "batch_size": 127}, "batch_size (127) must be a multiple of devices (2)"),
    ({"devices": 4, "batch_size": 4}, "at least 2 graphs per device"),
    ({"devices": 2, "strategy": "ddp_spawn"}, "strategy must be one of 'auto', 'ddp'")])
def test_a_multi_device_setting_that_cannot_run_is_refused_by_name(bad, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        tu.TUConfig(**bad)


def test_several_devices_are_another_run_and_one_device_keeps_its_identity(mutag_root, tmp_path):
    one = tu.TURecipe(_cfg(mutag_root, tmp_path))
    two = tu.TURecipe(_cfg(mutag_root, tmp_path, devices=2, strategy="ddp"))
    for recipe in (one, two):
        recipe.ready(None)
    cell = Cell("MUTAG", "macl", 0)
    assert "distributed" not in one.identity(cell)  # the single-process loop's stored runs
    assert two.identity(cell)["distributed"]["devices"] == 2
    assert {k: v for k, v in two.identity(cell).items() if k != "distributed"} == (
        one.identity(cell))


# ------------------------------------------------------------------ run identity and resume


def _fake_run_one(calls):
    def run_one(cfg, cell, graphs, dim, logger=None):
        calls.append(tuple(cell))
        labels = [int(g.y) for g in graphs]
        return {"metrics": {"accuracy": sum(labels) / len(labels)}, "optimisation_steps": 2,
                "losses": [1.0], "step_stats": {}, "train_seconds": 1.0, "eval_seconds": 0.0}
    return run_one


def _cfg(root, out, **kw):
    return tu.TUConfig(**{"datasets": ["mutag"], "losses": ["graphcl", "macl"], "seeds": [0],
                          "data_root": str(root), "output_dir": str(out), "progress": False,
                          "plot": False} | kw)


def test_changed_data_is_recomputed_not_reused(mutag_root, tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(tu, "run_one", _fake_run_one(calls))
    first = tu.TURecipe(_cfg(mutag_root, tmp_path / "out")).run()
    assert len(calls) == 2 and first["reused"] == []
    labels = mutag_root / "tu" / "MUTAG" / "raw" / "MUTAG_graph_labels.txt"
    values = labels.read_text().split()
    labels.write_text("\n".join(values[::-1]) + "\n")  # same counts, other graphs
    again = tu.TURecipe(_cfg(mutag_root, tmp_path / "out")).run()
    assert len(calls) == 4 and again["reused"] == []
    assert len(again["superseded"]) == 2
    assert again["environment"]["data_fingerprint"]["MUTAG"] != first["environment"][
        "data_fingerprint"]["MUTAG"]
    unchanged = tu.TURecipe(_cfg(mutag_root, tmp_path / "out")).run()
    assert len(calls) == 4 and unchanged["reused"] == [["MUTAG", "dcl", 0],
                                                       ["MUTAG", "macl", 0]]


def test_changed_setting_is_recomputed_and_more_seeds_compute_only_the_new(mutag_root, tmp_path,
                                                                           monkeypatch):
    calls: list = []
    monkeypatch.setattr(tu, "run_one", _fake_run_one(calls))
    tu.TURecipe(_cfg(mutag_root, tmp_path / "out")).run()
    tu.TURecipe(_cfg(mutag_root, tmp_path / "out", epochs=3)).run()
    assert len(calls) == 4
    more = tu.TURecipe(_cfg(mutag_root, tmp_path / "out", epochs=3, seeds=[0, 1])).run()
    assert calls[4:] == [("MUTAG", "dcl", 1), ("MUTAG", "macl", 1)]
    assert more["summary"]["accuracy"]["MUTAG"]["methods"]["macl"]["n"] == 2
    assert more["summary"]["accuracy"]["MUTAG"]["paired"]["macl"]["mean"] == 0.0
    assert more["complete"] and not more["partial"] and more["total_train_seconds"] == 4.0


def test_zero_step_run_is_an_error_not_a_result(mutag_root, tmp_path):
    cfg = _cfg(mutag_root, tmp_path / "out", epochs=1, batch_size=2)
    _, raw = tu_data.find_raw(mutag_root, "MUTAG")
    graphs, dim, _ = tu_data.load_tu_graphs(cfg, "MUTAG", raw, "fp")
    with pytest.raises(NonResultError, match="no optimisation step"):
        tu.run_one(cfg, Cell("MUTAG", "macl", 0), graphs[:1], dim)


def test_cli_batch_size_one_is_a_one_line_error(mutag_root, tmp_path, capsys):
    code = cli.main(["tu", "--data-root", str(mutag_root), "--batch-size", "1",
                     "--output-dir", str(tmp_path / "out"), "--no-progress"])
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("adaptcl tu: error: batch_size must be >= 2")
    assert not (tmp_path / "out").exists()


def test_cli_unknown_dataset_fails_before_any_work(mutag_root, tmp_path, capsys):
    code = cli.main(["tu", "--data-root", str(mutag_root), "--datasets", "MUTAG", "NOPE",
                     "--output-dir", str(tmp_path / "out"), "--no-progress"])
    assert code == 2
    assert "no TU raw folder for 'NOPE'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------- tiny real run + resume


def test_tiny_mutag_run_writes_results_logs_and_resumes(mutag_root, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "out"
    cfg = _cfg(mutag_root, out, epochs=2, inner_folds=3, c_grid=[0.1, 1.0, 10.0], plot=True,
               logger="tensorboard")
    result = tu.TURecipe(cfg).run()
    assert result["computed"] == [["MUTAG", "dcl", 0], ["MUTAG", "macl", 0]]
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["recipe"] == "tu" and on_disk["config"]["epochs"] == 2
    assert on_disk["environment"]["torch_threads"] == 1
    assert on_disk["environment"]["data_root"] == str(mutag_root.resolve())
    for run in on_disk["runs"]:
        ev = run["evaluation"]
        assert ev["folds"] == 10 and len(ev["fold_accuracies"]) == 10
        assert run["embedding_dim"] == 96 and run["optimisation_steps"] == 4
        assert len(run["losses"]) == 2 and all(np.isfinite(run["losses"]))
    facts = on_disk["datasets"]["MUTAG"]
    assert facts["info"]["num_graphs"] == 188 and facts["paper_table4"]["macl"] == [89.04, 0.98]
    assert 0.0 <= on_disk["summary"]["accuracy"]["MUTAG"]["methods"]["macl"]["mean"] <= 100.0
    table = (out / "results.md").read_text()
    assert "| MUTAG |" in table and "86.80 ± 1.34" in table and "89.04 ± 0.98" in table
    assert (out / "macl_temperature_alignment.png").stat().st_size > 0
    events = EventAccumulator(str(out / "logs" / "MUTAG" / "macl" / "seed0"))
    events.Reload()
    temps = [e.value for e in events.Scalars("train/temperature")]
    assert len(temps) == 4 and all(t > 0 for t in temps)  # 2 epochs x 2 batches of 128
    assert len(events.Scalars("eval/svm_accuracy")) == 1
    assert {"train/loss", "train/alignment"} <= set(events.Tags()["scalars"])

    def boom(*args, **kwargs):
        raise AssertionError("a finished run was recomputed")

    monkeypatch.setattr(tu, "run_one", boom)
    again = tu.TURecipe(cfg).run()
    assert again["computed"] == [] and len(again["reused"]) == 2
    assert again["summary"] == result["summary"]


def test_cli_builds_config_with_common_vocabulary(tmp_path):
    parser = cli.build_parser("tu")
    args = parser.parse_args(["tu", "--datasets", "MUTAG", "NCI1", "--losses", "GraphCL",
                              "macl", "--seeds", "0", "1", "--output-dir", str(tmp_path),
                              "--cv-seed", "none", "--classifier", "linear"])
    cfg = tu.TURecipe.config_from_args(args)
    assert cfg.datasets == ["MUTAG", "NCI1"] and cfg.seeds == [0, 1]
    assert cfg.losses == ["dcl", "macl"] and cfg.epochs == 20
    assert cfg.cv_seed is None and cfg.classifier == "linear" and not cfg.graphcl_quirks
    exact = tu.TURecipe.config_from_args(parser.parse_args(["tu", "--graphcl-exact"]))
    assert exact.graphcl_quirks and exact.cv_seed is None and exact.aug_ratio == 0.1
    kept = tu.TURecipe.config_from_args(parser.parse_args(["tu", "--graphcl-exact", "--aug-ratio", "0.3"]))
    assert kept.aug_ratio == 0.3


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_graphcl_trains_under_autocast_with_finite_losses(mutag_root, tmp_path, precision):
    cfg = _cfg(mutag_root, tmp_path / "out", epochs=1, batch_size=64, folds=2, inner_folds=2,
               c_grid=[1.0], precision=precision, device="cpu")
    _, raw = tu_data.find_raw(mutag_root, "MUTAG")
    graphs, dim, _ = tu_data.load_tu_graphs(cfg, "MUTAG", raw, "fp")
    record = tu.run_one(cfg, Cell("MUTAG", "macl", 0), graphs, dim)
    assert record["optimisation_steps"] == 3  # 188 graphs in batches of 64
    assert all(np.isfinite(record["step_stats"]["loss"]))
    assert all(t > 0 for t in record["step_stats"]["temperature"])
    assert 0.0 <= record["metrics"]["accuracy"] <= 1.0


def test_non_finite_pretraining_loss_is_a_non_result_naming_the_cell(mutag_root, tmp_path):
    import torch
    from torch_geometric.loader import DataLoader

    from adaptcl.adapters.graphcl import GraphCL, Identity, TUGINEncoder, TwoViewDataset
    from adaptcl.recipes.graph_common import train_epochs

    class NaNLoss(torch.nn.Module):
        def forward(self, z0, z1):
            return (z0 * z1).sum() * float("nan")

    cfg = _cfg(mutag_root, tmp_path / "out")
    _, raw = tu_data.find_raw(mutag_root, "MUTAG")
    graphs, dim, _ = tu_data.load_tu_graphs(cfg, "MUTAG", raw, "fp")
    model = GraphCL(TUGINEncoder(dim, 8, 2), loss_fn=NaNLoss())
    loader = DataLoader(TwoViewDataset(graphs[:8], Identity(), Identity()), batch_size=4)
    stats: dict[str, list] = {}
    with pytest.raises(NonResultError, match="non-finite loss on MUTAG/macl/seed0"):
        train_epochs(model, loader, torch.optim.Adam(model.parameters()), epochs=range(2),
                     desc="MUTAG/macl/seed0", stats=stats)
    assert stats == {}  # nothing of the failed epoch reaches the history


@pytest.mark.slow
def test_two_gloo_processes_pretrain_each_cell_and_rank_0_alone_scores_and_stores(mutag_root,
                                                                                 tmp_path):
    """``--devices 2 --strategy ddp`` on CPU: Lightning runs the command again for rank 1 at
    the first pre-training; both ranks pre-train every cell (one process group for all of them)
    with the loss gathering across ranks; rank 0 alone evaluates, stores, logs and prints."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "out"
    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
               PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    for name in ("LOCAL_RANK", "RANK", "NODE_RANK", "WORLD_SIZE"):
        env.pop(name, None)
    command = [sys.executable, "-m", "adaptcl", "tu", "--devices", "2", "--strategy", "ddp",
               "--device", "cpu", "--datasets", "MUTAG", "--losses", "graphcl", "macl",
               "--seeds", "0", "--epochs", "2", "--folds", "3", "--inner-folds", "2",
               "--no-progress", "--no-plot", "--logger", "tensorboard", "--output-dir", str(out),
               "--data-root", str(mutag_root)]
    proc = subprocess.run(command, env=env, cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stderr.count("All distributed processes registered. Starting with 2 "
                             "processes") == 1  # one launch serves both cells
    # rank 1 runs as a child of rank 0: its failure would not change the exit code
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for loss in ("dcl", "macl"):
        stored = json.loads((out / "runs" / "MUTAG" / loss / "seed0.json").read_text())
        record = stored["record"]
        assert stored["identity"]["distributed"]["devices"] == 2
        assert "gather_distributed=True" in record["loss_module"]
        # MUTAG's 188 graphs: 94 a rank in batches of 128 / 2 = 64 and 30: 2 steps an epoch
        assert record["optimisation_steps"] == 4 and len(record["step_stats"]["loss"]) == 4
        assert len(record["losses"]) == 2 and 0.5 < record["metrics"]["accuracy"] <= 1.0
        # the logs: one event file (rank 1 opens no writer), the 4 steps written once
        (events,) = (out / "logs" / "MUTAG" / loss / "seed0").glob("events.out.tfevents.*")
        logged = EventAccumulator(str(events)).Reload().Scalars("train/loss")
        assert [e.step for e in logged] == [1, 2, 3, 4]
    assert "| MUTAG |" in proc.stdout and proc.stdout.count("results: ") == 1  # rank 0 only
    again = subprocess.run(command, env=env, cwd=str(tmp_path), capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Starting with 2 processes" not in again.stderr  # every cell reused: nothing to train
    assert json.loads((out / "results.json").read_text())["reused"] == [["MUTAG", "dcl", 0],
                                                                         ["MUTAG", "macl", 0]]


@pytest.mark.slow
def test_one_device_trains_without_importing_lightning(mutag_root, tmp_path):
    """The single-device loop is plain PyTorch: a cell imports no pytorch_lightning (it costs
    seconds per process, in every ``--jobs`` job too)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys\nfrom adaptcl.recipes import tu\nfrom adaptcl.recipes.template.store "
            "import Cell\n"
            f"cfg = tu.TUConfig(datasets=['MUTAG'], losses=['macl'], seeds=[0], epochs=1, "
            f"folds=2, inner_folds=2, data_root={str(mutag_root)!r}, "
            f"output_dir={str(tmp_path / 'out')!r}, progress=False, plot=False)\n"
            "recipe = tu.TURecipe(cfg)\nrecipe.ready(1)\n"
            "record = recipe.compute(Cell('MUTAG', 'macl', 0))\n"
            "print(record['optimisation_steps'], 'pytorch_lightning' in sys.modules)\n")
    src = Path(__file__).resolve().parents[2] / "src"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=str(src)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["2", "False"]  # 188 graphs in batches of 128: 2 steps
