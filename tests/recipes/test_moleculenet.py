"""The ``moleculenet`` recipe: masked loss, ROC-AUC, config, a tiny real run with resume, CLI."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
import torch

pytest.importorskip("torch_geometric")
pytest.importorskip("ogb")
pytest.importorskip("sklearn")

from adaptcl import cli  # noqa: E402
from adaptcl.recipes import moleculenet as mn  # noqa: E402

NAN = math.nan

# ------------------------------------------------------------------- loss and ROC-AUC


def test_masked_bce_hand_computed():
    logits = torch.tensor([[0.0, 2.0], [-1.0, 0.0]], requires_grad=True)
    y = torch.tensor([[1.0, NAN], [0.0, 1.0]])
    loss = mn.masked_bce_loss(logits, y)
    # present entries: BCE(0, 1) = log 2, BCE(-1, 0) = log(1 + e^-1), BCE(0, 1) = log 2
    expected = (2 * math.log(2) + math.log(1 + math.exp(-1))) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert loss.item() == pytest.approx(0.5665187, abs=1e-6)
    loss.backward()
    grad = logits.grad
    assert grad[0, 1] == 0  # a missing label gives no gradient
    # d/dz BCE = (sigmoid(z) - y) / (number of present labels)
    assert grad[0, 0].item() == pytest.approx((0.5 - 1) / 3, abs=1e-6)
    assert grad[1, 0].item() == pytest.approx(1 / (1 + math.e) / 3, abs=1e-6)
    assert torch.isfinite(grad).all()


def test_masked_bce_all_missing_is_zero_and_finite():
    logits = torch.randn(3, 2, requires_grad=True)
    loss = mn.masked_bce_loss(logits, torch.full((3, 2), NAN))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logits.grad, torch.zeros(3, 2))


def test_multitask_roc_auc_skips_single_class_tasks_and_counts_them():
    y = np.array([[0, 1, 1], [0, 1, NAN], [1, 1, 0], [1, 1, 1]], dtype=float)
    s = np.array([[0.1, 0.3, 0.9], [0.4, 0.2, 0.0], [0.35, 0.5, 0.2], [0.8, 0.1, 0.1]])
    res = mn.multitask_roc_auc(y, s)
    # task 0: positives {0.35, 0.8} vs negatives {0.1, 0.4}: 3 of 4 pairs ordered -> 0.75
    # task 1: only positives -> skipped; task 2 (row 1 missing): pos {0.9, 0.1} vs neg {0.2}
    assert res["per_task"][0] == pytest.approx(0.75)
    assert res["per_task"][1] is None
    assert res["per_task"][2] == pytest.approx(0.5)
    assert res["mean"] == pytest.approx(0.625)
    assert (res["num_tasks"], res["num_evaluated"], res["num_skipped"]) == (3, 2, 1)
    none = mn.multitask_roc_auc(np.ones((4, 2)), s[:, :2])
    assert math.isnan(none["mean"]) and none["num_skipped"] == 2
    single = mn.multitask_roc_auc(np.array([0, 1, 1.0]), np.array([0.2, 0.9, 0.7]))
    assert single["mean"] == 1.0
    with pytest.raises(ValueError):
        mn.multitask_roc_auc(y, s[:, :2])


# ---------------------------------------------------------------------------- config


def test_presets_keys_and_validation(tmp_path):
    paper = mn.MoleculeNetConfig.paper(data_root=str(tmp_path))
    assert (paper.emb_dim, paper.num_layers, paper.finetune_epochs, paper.pretrain_epochs) == (
        300, 5, 100, 100)
    assert paper.seeds == list(range(10)) and len(paper.datasets) == 8
    assert (paper.temperature, paper.alpha, paper.a0, paper.batch_size, paper.lr,
            paper.dropout, paper.pretrain_batch_size) == (0.1, 0.5, 0.0, 32, 1e-3, 0.5, 256)
    cpu = mn.MoleculeNetConfig.cpu(data_root=str(tmp_path))
    assert cpu.datasets == ["bbbp", "bace", "clintox", "sider", "tox21"] and cpu.seeds == [0, 1, 2]
    assert cpu.pretrain_molecules == 6000
    assert cpu.resolved_pretrain_smiles() == tmp_path / "zinc" / "moses" / "test.csv.gz"
    # fine-tuning results do not depend on pre-training settings, and vice versa
    a = mn.MoleculeNetConfig.cpu(data_root=str(tmp_path))
    b = mn.MoleculeNetConfig.cpu(data_root=str(tmp_path), pretrain_epochs=7)
    c = mn.MoleculeNetConfig.cpu(data_root=str(tmp_path), finetune_epochs=7)
    assert a.finetune_key() == b.finetune_key() and a.pretrain_key() != b.pretrain_key()
    assert a.pretrain_key() == c.pretrain_key() and a.finetune_key() != c.finetune_key()
    assert a.pretrain_key() != mn.MoleculeNetConfig.cpu(data_root=str(tmp_path),
                                                        alpha=0.3).pretrain_key()
    for bad in ({"datasets": ["esol"]}, {"inits": ["simclr"]}, {"aug": "random4"},
                {"dropout": 1.0}, {"pretrain_batch_size": 1}, {"frac_train": 0.95},
                {"seeds": []}):
        with pytest.raises(ValueError):
            mn.MoleculeNetConfig(**bad)


def test_cli_preset_with_overrides():
    assert cli.RECIPES["moleculenet"][0] == "adaptcl.recipes.moleculenet"
    parser = argparse.ArgumentParser()
    mn.add_arguments(parser)
    args = parser.parse_args(["--preset", "cpu", "--datasets", "bbbp",
                              "--finetune-epochs", "2", "--out-dir", "x"])
    cfg = mn.config_from_args(args)
    assert cfg.datasets == ["bbbp"] and cfg.finetune_epochs == 2 and cfg.emb_dim == 128
    assert cfg.seeds == [0, 1, 2] and cfg.out_dir == "x"
    paper = mn.config_from_args(parser.parse_args([]))
    assert paper.emb_dim == 300 and paper.finetune_epochs == 100


# --------------------------------------------------------------- tiny end-to-end run


def _tiny(shared_data, out, **overrides):
    params = {"datasets": ["bbbp"], "seeds": [0], "data_root": str(shared_data),
              "out_dir": str(out), "pretrain_molecules": 200, "pretrain_epochs": 1,
              "pretrain_batch_size": 64, "finetune_epochs": 1, "max_molecules": 400,
              "emb_dim": 32, "num_layers": 3, "progress": False, "plot": True}
    params.update(overrides)
    return mn.MoleculeNetConfig(**params)


def test_tiny_run_structure_and_resume(shared_data, tmp_path):
    cfg = _tiny(shared_data, tmp_path / "out")
    res = mn.run_moleculenet(cfg)
    assert res["complete"] and sorted(map(tuple, res["computed"])) == [
        ("bbbp", "graphcl", 0), ("bbbp", "macl", 0), ("bbbp", "none", 0)]
    assert res["skipped"] == []
    for loss_name in ("graphcl", "macl"):
        assert mn.pretrain_path(cfg, loss_name).is_file()
        assert not mn.pretrain_path(cfg, loss_name).with_suffix(".partial.pt").exists()
        info = res["pretraining"][loss_name]
        assert info["num_molecules"] == 200 and info["num_invalid"] == 0
        assert len(info["epoch_loss"]) == 1 and math.isfinite(info["epoch_loss"][0])
    assert res["pretraining"]["macl"]["final_temperature"] != pytest.approx(0.1)  # adaptive
    assert "MACL" in res["pretraining"]["macl"]["loss_module"]
    entry = res["summary"]["bbbp"]
    assert entry["info"]["num_molecules"] + entry["info"]["num_invalid"] == 400
    assert entry["paper_table5"] == {"graphcl": (69.68, 0.67), "macl": (67.98, 0.97)}
    for init in ("none", "graphcl", "macl"):
        stats = entry["inits"][init]
        assert stats["n_seeds"] == 1
        for which in ("last", "best_valid"):
            assert 0.0 <= stats[which]["mean"] <= 100.0 and stats[which]["std"] == 0.0
    runs = {(r["dataset"], r["init"], r["seed"]): r for r in res["runs"]}
    rec = runs[("bbbp", "macl", 0)]
    assert sum(rec["split_sizes"]) == entry["info"]["num_molecules"]
    assert len(rec["history"]["test_roc"]) == 1 and rec["best_epoch"] == 1
    assert rec["test_roc_last"] == rec["test_roc_best_valid"]
    assert rec["test_tasks_skipped"] in (0, 1)
    # the two losses give different encoders, which fine-tuning started from
    g_state = torch.load(mn.pretrain_path(cfg, "graphcl"), weights_only=True)["encoder"]
    m_state = torch.load(mn.pretrain_path(cfg, "macl"), weights_only=True)["encoder"]
    assert g_state.keys() == m_state.keys()
    assert not torch.allclose(g_state["convs.0.nn.0.weight"], m_state["convs.0.nn.0.weight"])
    out = tmp_path / "out"
    md = (out / "results.md").read_text()
    assert "| BBBP |" in md and "Last epoch" in md and "best validation" in md
    assert "69.68 ± 0.67" in md and "(n=1)" in md
    assert (out / "pretraining_alignment_temperature.png").stat().st_size > 0

    # rerun: nothing recomputed, checkpoints reused untouched
    ckpt = mn.pretrain_path(cfg, "macl")
    mtime = ckpt.stat().st_mtime_ns
    again = mn.run_moleculenet(cfg)
    assert again["computed"] == [] and len(again["skipped"]) == 3
    assert ckpt.stat().st_mtime_ns == mtime
    assert again["table_markdown"] == res["table_markdown"]
    # a lost (dataset, init, seed) result is recomputed alone, identically (seeded)
    mn.run_path(cfg, "bbbp", "graphcl", 0).unlink()
    third = mn.run_moleculenet(cfg)
    assert third["computed"] == [["bbbp", "graphcl", 0]]
    new = {(r["dataset"], r["init"], r["seed"]): r for r in third["runs"]}
    assert new[("bbbp", "graphcl", 0)]["test_roc_last"] == pytest.approx(
        runs[("bbbp", "graphcl", 0)]["test_roc_last"], abs=1e-6)


def test_interrupted_pretraining_resumes_from_its_last_epoch(shared_data, tmp_path,
                                                             monkeypatch):
    cfg = _tiny(shared_data, tmp_path / "out", pretrain_epochs=2, pretrain_molecules=120,
                inits=["graphcl"])
    reference = mn.pretrain(_tiny(shared_data, tmp_path / "ref", pretrain_epochs=2,
                                  pretrain_molecules=120, inits=["graphcl"]), "graphcl")
    real_save = mn._torch_save_atomic
    calls = {"n": 0}

    def save_then_die(obj, path):
        real_save(obj, path)
        calls["n"] += 1
        if calls["n"] == 1:  # after the first epoch's partial checkpoint
            raise KeyboardInterrupt

    monkeypatch.setattr(mn, "_torch_save_atomic", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        mn.pretrain(cfg, "graphcl")
    partial = mn.pretrain_path(cfg, "graphcl").with_suffix(".partial.pt")
    assert partial.is_file() and not mn.pretrain_path(cfg, "graphcl").exists()
    monkeypatch.setattr(mn, "_torch_save_atomic", real_save)
    resumed = mn.pretrain(cfg, "graphcl")
    assert not partial.exists() and mn.pretrain_path(cfg, "graphcl").is_file()
    # resuming gives exactly the uninterrupted run (model, optimiser and RNG states restored)
    assert resumed["epoch_loss"] == pytest.approx(reference["epoch_loss"], abs=1e-6)
    for key, value in reference["encoder"].items():
        assert torch.allclose(resumed["encoder"][key].float(), value.float(), atol=1e-5), key
