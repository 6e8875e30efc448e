"""The ``moleculenet`` recipe: config, a tiny real run with resume, CLI (the loss and ROC-AUC:
tests/evaluation/test_graphs.py)."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("torch_geometric")
pytest.importorskip("ogb")
pytest.importorskip("sklearn")

from adaptcl import cli  # noqa: E402
from adaptcl.recipes import moleculenet as mn  # noqa: E402
from adaptcl.recipes import moleculenet_train as mt  # noqa: E402

NAN = math.nan

# ---------------------------------------------------------------------------- config


def test_presets_and_validation(tmp_path):
    cpu = mn.MoleculeNetConfig(data_root=str(tmp_path))  # the default preset is the CPU one
    assert cpu.datasets == ["bbbp", "bace", "clintox", "sider", "tox21"] and cpu.seeds == [0, 1, 2]
    assert (cpu.pretrain_molecules, cpu.emb_dim, cpu.finetune_epochs) == (6000, 128, 5)
    assert cpu.resolved_pretrain_smiles() == tmp_path / "zinc" / "moses" / "test.csv.gz"
    paper = mn.MoleculeNetConfig.paper(data_root=str(tmp_path))
    assert (paper.emb_dim, paper.num_layers, paper.finetune_epochs, paper.pretrain_epochs) == (
        300, 5, 100, 100)
    assert paper.seeds == list(range(10)) and len(paper.datasets) == 8
    assert (paper.temperature, paper.alpha, paper.a0, paper.batch_size, paper.lr,
            paper.dropout, paper.pretrain_batch_size) == (0.1, 0.5, 0.0, 32, 1e-3, 0.5, 256)
    assert mn.MoleculeNetConfig(datasets=["BBBP"], inits=["MACL"]).datasets == ["bbbp"]
    for bad in ({"datasets": ["esol"]}, {"inits": ["simclr"]}, {"aug": "random4"},
                {"dropout": 1.0}, {"pretrain_batch_size": 1}, {"frac_train": 0.95},
                {"seeds": []}, {"precision": "fp8"}, {"devices": 0},
                {"devices": 2, "pretrain_batch_size": 15}, {"devices": 4, "pretrain_batch_size": 4},
                {"devices": 2, "strategy": "ddp_spawn"}):
        with pytest.raises(ValueError):
            mn.MoleculeNetConfig(**bad)


def test_cli_preset_with_overrides():
    assert cli.RECIPES["moleculenet"][0] == "adaptcl.recipes.moleculenet"
    parser = cli.build_parser("moleculenet")
    args = parser.parse_args(["moleculenet", "--datasets", "BBBP", "--finetune-epochs", "2",
                              "--output-dir", "x"])
    config_from_args = mn.MoleculeNetRecipe.config_from_args
    cfg = config_from_args(args)
    assert cfg.datasets == ["bbbp"] and cfg.finetune_epochs == 2 and cfg.emb_dim == 128
    assert cfg.seeds == [0, 1, 2] and cfg.output_dir == "x"
    paper = config_from_args(parser.parse_args(["moleculenet", "--preset", "paper",
                                                "--pretrain-molecules", "none"]))
    assert paper.emb_dim == 300 and paper.finetune_epochs == 100 and paper.pretrain_molecules is None
    assert paper.seeds == list(range(10))


# --------------------------------------------------------------- tiny end-to-end run


def _tiny(shared_data, out, **overrides):
    params = {"datasets": ["bbbp"], "seeds": [0], "data_root": str(shared_data),
              "output_dir": str(out), "pretrain_molecules": 200, "pretrain_epochs": 1,
              "pretrain_batch_size": 64, "finetune_epochs": 1, "max_molecules": 400,
              "emb_dim": 32, "num_layers": 3, "progress": False, "plot": True}
    params.update(overrides)
    return mn.MoleculeNetConfig(**params)


@pytest.mark.slow
def test_tiny_run_structure_and_resume(shared_data, tmp_path):
    cfg = _tiny(shared_data, tmp_path / "out")
    recipe = mn.MoleculeNetRecipe(cfg)
    res = recipe.run()
    assert res["complete"] and sorted(map(tuple, res["computed"])) == [
        ("bbbp", "graphcl", 0), ("bbbp", "macl", 0), ("bbbp", "none", 0)]
    assert res["reused"] == []
    prints = recipe.fingerprints  # of the data, checked before any work
    for loss_name in ("graphcl", "macl"):
        path = mn.pretrain_path(cfg, loss_name, prints["pretrain"])
        assert path.is_file() and not path.with_suffix(".partial.pt").exists()
        info = res["pretraining"][loss_name]
        assert info["num_molecules"] == 200 and info["num_invalid"] == 0 and info["steps"] == 4
        assert len(info["epoch_loss"]) == 1 and math.isfinite(info["epoch_loss"][0])
    assert res["pretraining"]["macl"]["final_temperature"] != pytest.approx(0.1)  # adaptive
    assert "MACL" in res["pretraining"]["macl"]["loss_module"]
    info = res["infos"]["bbbp"]
    assert info["num_molecules"] + info["num_invalid"] == 400
    last = res["summary"]["test_roc_last"]["bbbp"]
    assert set(res["tables"]) == {"test_roc_last", "test_roc_best_valid"}
    for init in ("none", "graphcl", "macl"):
        assert last["methods"][init]["n"] == 1 and 0.0 <= last["methods"][init]["mean"] <= 100
    assert last["paired"]["macl"]["n"] == 1 and last["paired"]["macl"]["ci95"] is None
    runs = {tuple(r["cell"]): r for r in res["runs"]}
    rec = runs[("bbbp", "macl", 0)]
    assert sum(rec["split_sizes"]) == info["num_molecules"]
    assert len(rec["history"]["test_roc"]) == 1 and rec["best_epoch"] == 1
    assert rec["metrics"]["test_roc_last"] == rec["metrics"]["test_roc_best_valid"]
    g_state = torch.load(mn.pretrain_path(cfg, "graphcl", prints["pretrain"]),
                         weights_only=True)["encoder"]
    m_state = torch.load(mn.pretrain_path(cfg, "macl", prints["pretrain"]),
                         weights_only=True)["encoder"]
    assert not torch.allclose(g_state["convs.0.nn.0.weight"], m_state["convs.0.nn.0.weight"])
    out = tmp_path / "out"
    md = (out / "results.md").read_text()
    assert "| BBBP |" in md and "## test_roc_last" in md and "## test_roc_best_valid" in md
    assert "69.68 ± 0.67" in md and "(n=1)" in md and "GraphCL+MACL − GraphCL" in md
    assert (out / "pretraining_alignment_temperature.png").stat().st_size > 0

    # rerun: nothing recomputed, checkpoints reused untouched
    ckpt = mn.pretrain_path(cfg, "macl", prints["pretrain"])
    mtime = ckpt.stat().st_mtime_ns
    again = mn.MoleculeNetRecipe(cfg).run()
    assert again["computed"] == [] and len(again["reused"]) == 3
    assert ckpt.stat().st_mtime_ns == mtime
    assert again["table_markdown"] == res["table_markdown"]
    # a changed fine-tuning setting recomputes every cell, and keeps the pre-training
    changed = mn.MoleculeNetRecipe(_tiny(shared_data, tmp_path / "out", lr=5e-4)).run()
    assert len(changed["computed"]) == 3 and len(changed["superseded"]) == 3
    assert ckpt.stat().st_mtime_ns == mtime


def test_changed_pretraining_corpus_is_pretrained_again(shared_data, tmp_path):
    import gzip

    corpus = tmp_path / "corpus.csv.gz"
    with gzip.open(shared_data / "zinc" / "moses" / "test.csv.gz", "rt") as src:
        lines = [next(src) for _ in range(130)]
    corpus.write_bytes(gzip.compress("".join(lines).encode()))
    cfg = _tiny(shared_data, tmp_path / "out", pretrain_smiles=str(corpus), inits=["graphcl"],
                pretrain_molecules=120, plot=False)
    first = mn.pretrain_path(cfg, "graphcl")
    mn.MoleculeNetRecipe(cfg).run()
    corpus.write_bytes(gzip.compress("".join(lines[:1] + lines[:0:-1]).encode()))  # reordered
    assert mn.pretrain_path(cfg, "graphcl") != first
    again = mn.MoleculeNetRecipe(cfg).run()
    assert again["computed"] == [["bbbp", "graphcl", 0]] and again["reused"] == []


def test_malformed_label_is_a_one_line_error_naming_the_file(shared_data, tmp_path, capsys):
    import shutil

    root = tmp_path / "data"
    shutil.copytree(shared_data / "moleculenet" / "bbbp", root / "moleculenet" / "bbbp")
    csv = root / "moleculenet" / "bbbp" / "raw" / "BBBP.csv"
    csv.chmod(0o644)
    lines = csv.read_text().splitlines()
    head = lines[0].split(",")
    row = lines[1].split(",")
    row[head.index("p_np")] = "yes"
    csv.write_text("\n".join([lines[0], ",".join(row), *lines[2:50]]) + "\n")
    code = cli.main(["moleculenet", "--data-root", str(root), "--datasets", "bbbp",
                     "--inits", "none", "--seeds", "0", "--finetune-epochs", "1",
                     "--output-dir", str(tmp_path / "out"), "--no-progress", "--no-plot"])
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("adaptcl moleculenet: error: reading MoleculeNet 'bbbp'")


def test_interrupted_pretraining_resumes_from_its_last_epoch(shared_data, tmp_path,
                                                             monkeypatch, capsys):
    cfg = _tiny(shared_data, tmp_path / "out", pretrain_epochs=2, pretrain_molecules=120,
                inits=["graphcl"])
    ref_cfg = _tiny(shared_data, tmp_path / "ref", pretrain_epochs=2, pretrain_molecules=120,
                    inits=["graphcl"])
    reference = mt.pretrain(ref_cfg, "graphcl", mn.pretrain_path(ref_cfg, "graphcl"))
    final = mn.pretrain_path(cfg, "graphcl")
    real_save = mt.torch_save_atomic
    calls = {"n": 0}

    def save_then_die(obj, path):
        real_save(obj, path)
        calls["n"] += 1
        if calls["n"] == 1:  # after the first epoch's partial checkpoint
            raise KeyboardInterrupt

    monkeypatch.setattr(mt, "torch_save_atomic", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        mt.pretrain(cfg, "graphcl", final)
    partial = final.with_suffix(".partial.pt")
    assert partial.is_file() and not final.exists()
    monkeypatch.setattr(mt, "torch_save_atomic", real_save)
    capsys.readouterr()
    resumed = mt.pretrain(cfg, "graphcl", final)
    assert f"adaptcl: pre-training graphcl resumes from epoch 2 of 2 ({partial})" in (
        capsys.readouterr().err)  # said, not silent
    assert not partial.exists() and final.is_file()
    # resuming gives exactly the uninterrupted run (model, optimiser and RNG states restored)
    assert resumed["epoch_loss"] == pytest.approx(reference["epoch_loss"], abs=1e-6)
    for key, value in reference["encoder"].items():
        assert torch.allclose(resumed["encoder"][key].float(), value.float(), atol=1e-5), key


def test_multi_device_pretraining_has_its_own_identity(tmp_path):
    one = mn.MoleculeNetConfig(data_root=str(tmp_path))
    two = mn.MoleculeNetConfig(data_root=str(tmp_path), devices=2, strategy="ddp")
    fingerprint = {"test.csv.gz": "x"}
    # one device keeps the identity (and the stored encoders) of the single-process loop
    assert "distributed" not in mn.pretrain_identity(one, "macl", fingerprint)
    assert mn.pretrain_path(one, "macl", fingerprint) != mn.pretrain_path(two, "macl", fingerprint)


@pytest.mark.slow
def test_pretraining_on_two_gloo_processes_then_fine_tuning_on_rank_0(shared_data, tmp_path):
    """``--devices 2 --strategy ddp`` on CPU: Lightning relaunches the command for rank 1; both
    ranks pre-train with the loss gathering across them, rank 0 alone fine-tunes and writes."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "out"
    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
               PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    env.pop("LOCAL_RANK", None)
    command = [sys.executable, "-m", "adaptcl", "moleculenet", "--devices", "2", "--strategy",
               "ddp", "--device", "cpu", "--datasets", "bbbp", "--seeds", "0", "--inits", "macl",
               "--pretrain-molecules", "64", "--pretrain-epochs", "2", "--pretrain-batch-size",
               "16", "--finetune-epochs", "1", "--max-molecules", "200", "--emb-dim", "16",
               "--num-layers", "2", "--no-progress", "--no-plot", "--logger", "csv",
               "--output-dir", str(out),
               "--data-root", str(shared_data)]
    proc = subprocess.run(command, env=env, cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "All distributed processes registered. Starting with 2 processes" in (
        proc.stdout + proc.stderr)
    # rank 1 runs as a child of rank 0: its failure after training would not change the exit code
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (encoder,) = (out / "pretrain").glob("macl-*.pt")
    checkpoint = torch.load(encoder, weights_only=True)
    assert (checkpoint["devices"], checkpoint["strategy"]) == (2, "ddp")
    assert "gather_distributed=True" in checkpoint["loss_module"]
    # 64 molecules / 2 ranks / 8 per rank: 4 steps an epoch, the loss on the gathered 16
    assert checkpoint["steps"] == 8 and len(checkpoint["step_stats"]["temperature"]) == 8
    assert len(checkpoint["epoch_loss"]) == 2 and all(map(math.isfinite, checkpoint["epoch_loss"]))
    assert not list((out / "pretrain").glob("*.lightning"))  # Lightning's checkpoints removed
    # the recipe's logger (step,name,value rows), written once, by rank 0, for the 8 steps
    rows = (out / "logs" / encoder.stem / "metrics.csv").read_text().splitlines()[1:]
    losses = [row.split(",") for row in rows if row.split(",")[1] == "train/loss"]
    assert [int(step) for step, _, _ in losses] == list(range(1, 9))
    assert (out / "runs" / "bbbp" / "macl" / "seed0.json").is_file()
    assert "| BBBP |" in proc.stdout and proc.stdout.count("results: ") == 1  # rank 0 only
