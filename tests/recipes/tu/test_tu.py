"""The ``tu`` recipe: data preparation, identity, a tiny real run on MUTAG, resume, presets,
several devices."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

pytest.importorskip("torch_geometric")
pytest.importorskip("sklearn")

from adaptcl import cli  # noqa: E402
from adaptcl.recipes.engine import Cell, NonResultError  # noqa: E402
from adaptcl.recipes.engine.command_line import parse  # noqa: E402
from adaptcl.recipes.engine.settings import identity_settings  # noqa: E402
from adaptcl.recipes.tu import data as tu_data  # noqa: E402
from adaptcl.recipes.tu import train as tu_train  # noqa: E402
from adaptcl.recipes.tu.config import TUConfig  # noqa: E402
from adaptcl.recipes.tu.recipe import TURecipe  # noqa: E402


def _cell(loss: str, seed: int = 0) -> Cell:
    return Cell((("dataset", "MUTAG"), ("loss", loss)), seed)

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


def test_one_dataset_named_twice_runs_once_and_says_so(shared_data, tmp_path, capsys):
    recipe = TURecipe(TUConfig(datasets=["MUTAG", "mutag", "PROTEINS"], data_root=str(shared_data),
                               output_dir=str(tmp_path / "out")))
    recipe.prepare(recipe.point_configs())
    assert recipe.rows() == ["MUTAG", "PROTEINS"]
    assert capsys.readouterr().err == ("adaptcl: note: --datasets: 'mutag' repeats 'MUTAG'; "
                                       "running each once\n")


def test_featureless_dataset_gets_constant_or_degree_features(shared_data, tmp_path):
    cfg = TUConfig(datasets=["IMDB-BINARY"], data_root=str(shared_data),
                   output_dir=str(tmp_path / "out"), work_dir=str(tmp_path / "work"))
    _, raw = tu_data.find_raw(shared_data, "IMDB-BINARY")
    graphs, dim, info = tu_data.load_tu_graphs(cfg, "IMDB-BINARY", raw, "imdb")
    assert len(graphs) == 1000 and dim == 1 and info["num_classes"] == 2
    assert all(g.x.shape == (g.num_nodes, 1) for g in graphs[:50])
    degree = TUConfig(datasets=["IMDB-BINARY"], data_root=str(shared_data), node_features="degree",
                      max_degree=20, output_dir=str(tmp_path / "out"),
                      work_dir=str(tmp_path / "work"))
    graphs, dim, _ = tu_data.load_tu_graphs(degree, "IMDB-BINARY", raw, "imdb")
    assert dim == 21 and all(float(g.x.sum()) == g.num_nodes for g in graphs[:50])
    assert cfg.augmentation("IMDB-BINARY") == "random4"
    assert cfg.augmentation("MUTAG") == "random2"


@pytest.mark.parametrize("progress", [True, False])
def test_processing_the_raw_files_is_said_only_with_progress(mutag_root, tmp_path, capsys,
                                                             monkeypatch, progress):
    """torch-geometric prints "Processing... Done!" outside pytest (it checks
    ``PYTEST_CURRENT_TEST``): with ``--no-progress`` a log file gets none of it."""
    monkeypatch.delenv("PYTEST_CURRENT_TEST")  # as in a real run; restored after the test
    cfg = TUConfig(data_root=str(mutag_root), output_dir=str(tmp_path / "out"), progress=progress)
    _, raw = tu_data.find_raw(mutag_root, "MUTAG")
    graphs, _, _ = tu_data.load_tu_graphs(cfg, "MUTAG", raw, "fp")
    assert len(graphs) == 188
    assert ("Processing..." in capsys.readouterr().err) is progress


def test_truncated_processed_dataset_is_named_and_rebuilt(mutag_root, tmp_path, capsys):
    cfg = TUConfig(data_root=str(mutag_root), output_dir=str(tmp_path / "out"))
    _, raw = tu_data.find_raw(mutag_root, "MUTAG")
    graphs, _, _ = tu_data.load_tu_graphs(cfg, "MUTAG", raw, "fp")
    (processed,) = (tmp_path / "out" / "data").glob("fp/MUTAG/processed/data.pt")
    processed.write_bytes(processed.read_bytes()[:200])  # killed while torch-geometric wrote it
    again, _, _ = tu_data.load_tu_graphs(cfg, "MUTAG", raw, "fp")
    assert len(again) == len(graphs) == 188
    err = capsys.readouterr().err
    assert "processed MUTAG dataset" in err and "corrupt or truncated" in err
    assert str(processed.parent) in err


def test_identity_settings_and_the_graphcl_exact_preset():
    a, b = TUConfig(), TUConfig(progress=False, output_dir="elsewhere", threads=2)
    assert identity_settings(a) == identity_settings(b)  # bookkeeping does not change results
    assert identity_settings(a) != identity_settings(TUConfig(epochs=5))
    exact = parse(TURecipe, ["--preset", "graphcl-exact"], "adaptcl tu").sweep.base
    assert exact.graphcl_quirks and exact.cv_seed is None and exact.aug_ratio == 0.1
    assert exact.subgraph_ratio == 0.2 and exact.first_view == "identity"
    kept = parse(TURecipe, ["--preset", "graphcl-exact", "--aug-ratio", "0.3"], "adaptcl tu")
    assert kept.sweep.base.aug_ratio == 0.3 and kept.preset == "graphcl-exact"
    assert TUConfig(losses=["MACL"]).losses == ["macl"]
    for bad in ({"first_view": "both"}, {"classifier": "knn"}, {"batch_size": 1}):
        with pytest.raises(ValueError):
            TUConfig(**bad)


def test_the_temperature_schedule_runs_its_period_in_epochs_of_the_dataset():
    cfg = TUConfig(temperature=0.1, max_temperature=0.8, schedule_period=2.5)
    loss = tu_train.build_loss(cfg, "temperature_schedule", steps_per_epoch=4)
    assert (loss.min_temperature, loss.max_temperature, loss.period) == (0.1, 0.8, 10)
    assert tu_train.build_loss(TUConfig(), "temperature_schedule", 2).period == 8  # 5 per run
    with pytest.raises(ValueError, match=r"max_temperature \(0.1\) must be >= temperature"):
        TUConfig(losses=["temperature_schedule"], temperature=0.2, max_temperature=0.1)
    assert TUConfig(temperature=0.2, max_temperature=0.1).losses == ["dcl", "macl"]  # no schedule


@pytest.mark.parametrize(("bad", "named"), [
    ({"devices": 0}, "devices"),
    ({"devices": 2, "batch_size": 127}, "batch_size (127) must be a multiple of devices (2)"),
    ({"devices": 4, "batch_size": 4}, "at least 2 graphs per device"),
    ({"devices": 2, "strategy": "ddp_spawn"}, "strategy must be one of 'auto', 'ddp'")])
def test_a_multi_device_setting_that_cannot_run_is_refused_by_name(bad, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        TUConfig(**bad)


def test_several_devices_are_another_run_and_one_device_keeps_its_identity(mutag_root, tmp_path):
    one = TURecipe(_cfg(mutag_root, tmp_path))
    two = TURecipe(_cfg(mutag_root, tmp_path, devices=2, strategy="ddp"))
    for recipe in (one, two):
        recipe.ready(None)
    cell = _cell("macl")
    assert "distributed" not in one.identity_of(cell)  # the single-process loop's stored runs
    assert two.identity_of(cell)["distributed"]["devices"] == 2
    assert {k: v for k, v in two.identity_of(cell).items() if k != "distributed"} == (
        one.identity_of(cell))


# ------------------------------------------------------------------ run identity and resume


def _fake_run_one(calls):
    def run_one(cfg, cell, graphs, dim, log_dir):
        calls.append((cell.dataset, cell.loss, cell.seed))
        labels = [int(g.y) for g in graphs]
        return {"metrics": {"accuracy": sum(labels) / len(labels)}, "optimisation_steps": 2,
                "losses": [1.0], "step_stats": {}, "train_seconds": 1.0, "eval_seconds": 0.0}
    return run_one


def _cfg(root, out, **kw):
    return TUConfig(**{"datasets": ["mutag"], "losses": ["graphcl", "macl"], "seeds": [0],
                          "data_root": str(root), "output_dir": str(out), "progress": False,
                          "plot": False} | kw)


def test_changed_data_is_recomputed_not_reused(mutag_root, tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(tu_train, "train_and_score", _fake_run_one(calls))
    first = TURecipe(_cfg(mutag_root, tmp_path / "out")).run()
    assert len(calls) == 2 and first["reused"] == []
    labels = mutag_root / "tu" / "MUTAG" / "raw" / "MUTAG_graph_labels.txt"
    values = labels.read_text().split()
    labels.write_text("\n".join(values[::-1]) + "\n")  # same counts, other graphs
    again = TURecipe(_cfg(mutag_root, tmp_path / "out")).run()
    assert len(calls) == 4 and again["reused"] == []
    assert len(again["superseded"]) == 2
    assert again["environment"]["data_fingerprint"]["MUTAG"] != first["environment"][
        "data_fingerprint"]["MUTAG"]
    unchanged = TURecipe(_cfg(mutag_root, tmp_path / "out")).run()
    assert len(calls) == 4 and unchanged["reused"] == [_cell("dcl").as_dict(),
                                                       _cell("macl").as_dict()]


def test_changed_setting_is_recomputed_and_more_seeds_compute_only_the_new(mutag_root, tmp_path,
                                                                           monkeypatch):
    calls: list = []
    monkeypatch.setattr(tu_train, "train_and_score", _fake_run_one(calls))
    TURecipe(_cfg(mutag_root, tmp_path / "out")).run()
    TURecipe(_cfg(mutag_root, tmp_path / "out", epochs=3)).run()
    assert len(calls) == 4
    more = TURecipe(_cfg(mutag_root, tmp_path / "out", epochs=3, seeds=[0, 1])).run()
    assert calls[4:] == [("MUTAG", "dcl", 1), ("MUTAG", "macl", 1)]
    assert more["summary"]["accuracy"]["MUTAG"]["methods"]["macl"]["n"] == 2
    assert more["summary"]["accuracy"]["MUTAG"]["paired"]["macl"]["mean"] == 0.0
    assert more["complete"] and not more["partial"] and more["total_train_seconds"] == 4.0


def test_zero_step_run_is_an_error_not_a_result(mutag_root, tmp_path):
    cfg = _cfg(mutag_root, tmp_path / "out", epochs=1, batch_size=2)
    _, raw = tu_data.find_raw(mutag_root, "MUTAG")
    graphs, dim, _ = tu_data.load_tu_graphs(cfg, "MUTAG", raw, "fp")
    with pytest.raises(NonResultError, match="no optimisation step"):
        tu_train.train_and_score(cfg, _cell("macl"), graphs[:1], dim, tmp_path / "logs")


def test_cli_batch_size_one_is_a_one_line_error(mutag_root, tmp_path, capsys):
    code = cli.main(["tu", "--data-root", str(mutag_root), "--batch-size", "1",
                     "--output-dir", str(tmp_path / "out"), "--no-progress"])
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("adaptcl tu: error: batch_size must be a number >= 2, got 1")
    assert not (tmp_path / "out").exists()


def test_fp16_on_the_cpu_is_refused_not_trained_in_bf16_under_its_name(mutag_root, tmp_path,
                                                                       capsys):
    code = cli.main(["tu", "--data-root", str(mutag_root), "--precision", "32", "16-mixed",
                     "--device", "cpu", "--output-dir", str(tmp_path / "out"), "--no-progress"])
    assert code == 2 and not (tmp_path / "out").exists()
    assert capsys.readouterr().err.strip() == (
        "adaptcl tu: error: --precision 16-mixed needs CUDA (on the CPU Lightning trains in "
        "bfloat16 instead); use --precision bf16-mixed or 32")


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
    result = TURecipe(cfg).run()
    assert result["computed"] == [_cell("dcl").as_dict(), _cell("macl").as_dict()]
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
    temps = [e.value for e in events.Scalars("train_temperature")]
    assert len(temps) == 4 and all(t > 0 for t in temps)  # 2 epochs x 2 batches of 128
    assert {"train_loss", "train_alignment"} <= set(events.Tags()["scalars"])
    assert (out / "config.yaml").is_file()

    def boom(*args, **kwargs):
        raise AssertionError("a finished run was recomputed")

    monkeypatch.setattr(tu_train, "train_and_score", boom)
    again = TURecipe(cfg).run()
    assert again["computed"] == [] and len(again["reused"]) == 2
    assert again["summary"] == result["summary"]


def test_the_command_line_builds_the_config_of_every_point(tmp_path):
    invocation = parse(TURecipe, ["--datasets", "MUTAG", "NCI1", "--losses", "GraphCL", "macl",
                                  "--seeds", "0", "1", "--output-dir", str(tmp_path),
                                  "--cv-seed", "none", "--classifier", "linear",
                                  "--temperature", "0.1", "0.2"], "adaptcl tu")
    cfg = invocation.sweep.base
    assert cfg.datasets == ["MUTAG", "NCI1"] and cfg.seeds == [0, 1]
    assert cfg.losses == ["dcl", "macl"] and cfg.epochs == 20
    assert cfg.cv_seed is None and cfg.classifier == "linear" and not cfg.graphcl_quirks
    assert invocation.sweep.axes == {"temperature": [0.1, 0.2]}


def test_graphcl_trains_in_bf16_with_finite_losses(mutag_root, tmp_path):
    cfg = _cfg(mutag_root, tmp_path / "out", epochs=1, batch_size=64, folds=2, inner_folds=2,
               c_grid=[1.0], precision="bf16-mixed", device="cpu")
    _, raw = tu_data.find_raw(mutag_root, "MUTAG")
    graphs, dim, _ = tu_data.load_tu_graphs(cfg, "MUTAG", raw, "fp")
    record = tu_train.train_and_score(cfg, _cell("macl"), graphs, dim, tmp_path / "logs")
    assert record["optimisation_steps"] == 3  # 188 graphs in batches of 64
    assert all(np.isfinite(record["step_stats"]["loss"]))
    assert all(t > 0 for t in record["step_stats"]["temperature"])
    assert 0.0 <= record["metrics"]["accuracy"] <= 1.0


def test_non_finite_pretraining_loss_is_a_divergence_naming_the_cell(mutag_root, tmp_path):
    import torch

    from adaptcl.adapters.graphcl import GraphCL, Identity, TUGINEncoder, TwoViewDataset
    from adaptcl.recipes.common.graph_training import fit_graphs
    from adaptcl.recipes.engine import DivergedError

    class NaNLoss(torch.nn.Module):
        def forward(self, z0, z1):
            return (z0 * z1).sum() * float("nan")

    cfg = _cfg(mutag_root, tmp_path / "out")
    _, raw = tu_data.find_raw(mutag_root, "MUTAG")
    graphs, dim, _ = tu_data.load_tu_graphs(cfg, "MUTAG", raw, "fp")
    model = GraphCL(TUGINEncoder(dim, 8, 2), loss_fn=NaNLoss())
    with pytest.raises(DivergedError, match="non-finite loss on MUTAG/macl/seed0 at step 1") as err:
        fit_graphs(model, lambda rank: TwoViewDataset(graphs[:8], Identity(), Identity()),
                   epochs=2, batch_size=4, lr=1e-3, device="cpu", precision="32",
                   shuffle_seed=0, where="MUTAG/macl/seed0")
    assert err.value.step == 1


@pytest.mark.slow
@pytest.mark.parametrize("graphs_used", [188, 128], ids=["a-partial-last-batch", "whole-batches"])
def test_one_cell_trains_as_the_plain_loop_of_the_adapter_does(mutag_root, tmp_path,
                                                                graphs_used):
    """The recipe's Lightning path on one device equals a plain ``train_epoch`` loop on the
    same data, seeds and order, bit for bit: the numbers published before the recipes moved
    to Lightning stay what they were. With data an exact multiple of the batch a plain loop
    draws one more permutation per epoch, and so must the recipe's loader."""
    import torch
    from torch_geometric.loader import DataLoader

    from adaptcl.adapters.graphcl import GraphCL, TUGINEncoder, TwoViewDataset, train_epoch
    from adaptcl.recipes.engine.torch_env import seed_everything

    cfg = _cfg(mutag_root, tmp_path / "out", epochs=3, batch_size=64, folds=2, inner_folds=2)
    _, raw = tu_data.find_raw(mutag_root, "MUTAG")
    graphs, dim, _ = tu_data.load_tu_graphs(cfg, "MUTAG", raw, "fp")
    graphs = graphs[:graphs_used]
    record = tu_train.train_and_score(cfg, _cell("macl", 3), graphs, dim, tmp_path / "logs")

    seed_everything(3)
    model = GraphCL(TUGINEncoder(dim, cfg.hidden, cfg.layers),
                    loss_fn=tu_train.build_loss(cfg, "macl"))
    views = tu_train.views(cfg, "MUTAG", torch.Generator().manual_seed(10_000 + 3))
    loader = DataLoader(TwoViewDataset(graphs, *views), batch_size=cfg.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(20_000 + 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    stats: dict[str, list] = {}
    losses = [train_epoch(model, loader, optimizer, stats) for _ in range(cfg.epochs)]
    assert record["losses"] == losses
    assert record["step_stats"] == stats


@pytest.mark.slow
def test_two_gloo_processes_pretrain_each_cell_and_rank_0_alone_scores_and_stores(mutag_root,
                                                                                 tmp_path):
    """``--devices 2 --strategy ddp`` on CPU: Lightning runs the command again for rank 1 at
    the first pre-training; both ranks pre-train every cell (one process group for all of them)
    with the loss gathering across ranks; rank 0 alone evaluates, stores, logs and prints."""
    import subprocess
    import sys

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.recipes._process import env_with_src

    out = tmp_path / "out"
    env = env_with_src(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1")
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
    assert proc.stderr.count("Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2") == 1  # one
    # launch serves both cells
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
        logged = EventAccumulator(str(events)).Reload().Scalars("train_loss")
        assert [e.step for e in logged] == [0, 1, 2, 3]
    assert "| MUTAG |" in proc.stdout and proc.stdout.count("results: ") == 1  # rank 0 only
    again = subprocess.run(command, env=env, cwd=str(tmp_path), capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Initializing distributed" not in again.stderr  # every cell reused: nothing to train
    assert json.loads((out / "results.json").read_text())["reused"] == [
        _cell("dcl").as_dict(), _cell("macl").as_dict()]
