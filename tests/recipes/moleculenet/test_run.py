"""``moleculenet`` end to end on real data, tiny: the result files, reuse of cells and encoders,
sweeps, an interrupted pre-training resumed exactly, the fine-tuning loop's train/eval modes,
a malformed CSV (the loss and ROC-AUC: tests/evaluation/test_graphs.py)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_geometric")
pytest.importorskip("ogb")
pytest.importorskip("sklearn")

from adaptcl import cli  # noqa: E402
from adaptcl.recipes.engine.sweep import Sweep  # noqa: E402
from adaptcl.recipes.moleculenet import train  # noqa: E402
from adaptcl.recipes.moleculenet.config import MoleculeNetConfig  # noqa: E402
from adaptcl.recipes.moleculenet.data import load_corpus, load_split_dataset  # noqa: E402
from adaptcl.recipes.moleculenet.recipe import MoleculeNetRecipe  # noqa: E402


def _values(shared_data, out, **overrides):
    return {"datasets": ["bbbp"], "seeds": [0], "data_root": str(shared_data),
            "output_dir": str(out), "pretrain_molecules": 200, "pretrain_epochs": 1,
            "pretrain_batch_size": 64, "finetune_epochs": 1, "max_molecules": 400,
            "emb_dim": 32, "num_layers": 3, "progress": False, "plot": True} | overrides


def _run(shared_data, out, **overrides):
    recipe = MoleculeNetRecipe(Sweep.from_values(MoleculeNetConfig,
                                                 _values(shared_data, out, **overrides)))
    return recipe.run(), recipe


def _cells(result):
    return sorted(tuple(c.values()) for c in result["computed"])


@pytest.mark.slow
def test_tiny_run_structure_reuse_and_sweeps(shared_data, tmp_path):
    out = tmp_path / "out"
    res, recipe = _run(shared_data, out)
    assert res["complete"] and res["reused"] == []
    assert _cells(res) == [("bbbp", "dcl", 0), ("bbbp", "macl", 0), ("bbbp", "none", 0)]
    for loss in ("dcl", "macl"):
        path = recipe.encoders[(loss, ())]
        assert path.parent == out / "pretrain" and path.name.startswith(f"{loss}-")
        assert path.is_file() and not path.with_suffix(".lightning").exists()
        info = res["pretraining"][loss]
        assert info["num_molecules"] == 200 and info["num_invalid"] == 0 and info["steps"] == 4
        assert len(info["epoch_loss"]) == 1 and math.isfinite(info["epoch_loss"][0])
    assert res["pretraining"]["macl"]["final_temperature"] != pytest.approx(0.1)  # adaptive
    assert "MACL" in res["pretraining"]["macl"]["loss_module"]
    info = res["infos"]["bbbp"]
    assert info["num_molecules"] + info["num_invalid"] == 400
    last = res["summary"]["test_roc_last"]["bbbp"]
    assert set(res["tables"]) == {"test_roc_last", "test_roc_best_valid"}
    for init in ("none", "dcl", "macl"):
        assert last["methods"][init]["n"] == 1 and 0.0 <= last["methods"][init]["mean"] <= 100
    assert last["paired"]["macl"]["n"] == 1 and last["paired"]["macl"]["ci95"] is None
    runs = {tuple(r["cell"].values()): r for r in res["runs"]}
    rec = runs[("bbbp", "macl", 0)]
    assert sum(rec["split_sizes"]) == info["num_molecules"]
    assert len(rec["history"]["test_roc"]) == 1 and rec["best_epoch"] == 1
    assert rec["metrics"]["test_roc_last"] == rec["metrics"]["test_roc_best_valid"]
    encoders = {loss: torch.load(recipe.encoders[(loss, ())], weights_only=True)["encoder"]
                for loss in ("dcl", "macl")}
    assert not torch.equal(encoders["dcl"]["convs.0.nn.0.weight"],
                           encoders["macl"]["convs.0.nn.0.weight"])
    md = (out / "results.md").read_text()
    assert "| BBBP |" in md and "## test_roc_last" in md and "## test_roc_best_valid" in md
    assert "69.68 ± 0.67" in md and "GraphCL+MACL − GraphCL" in md
    assert (out / "pretraining_alignment_temperature.png").stat().st_size > 0
    assert (out / "config.yaml").is_file()

    # rerun: nothing recomputed, encoders reused untouched
    encoder = recipe.encoders[("macl", ())]
    mtime = encoder.stat().st_mtime_ns
    again, _ = _run(shared_data, out)
    assert again["computed"] == [] and len(again["reused"]) == 3
    assert again["table_markdown"] == res["table_markdown"]
    # a changed fine-tuning setting recomputes every cell, and keeps the encoders
    changed, _ = _run(shared_data, out, lr=5e-4)
    assert len(changed["computed"]) == 3 and len(changed["superseded"]) == 3
    # a swept pre-training setting pre-trains one more encoder and reuses the other
    swept, recipe = _run(shared_data, out, inits=["macl"], temperature=[0.1, 0.2], plot=False)
    assert _cells(swept) == [("bbbp", "macl", 0.1, 0), ("bbbp", "macl", 0.2, 0)]
    assert recipe.encoders[("macl", (("temperature", 0.1),))] == encoder
    assert encoder.stat().st_mtime_ns == mtime
    assert len(list((out / "pretrain").glob("macl-*.pt"))) == 2
    assert set(swept["summary_along"]) == {"temperature"}


def test_changed_pretraining_corpus_is_pretrained_again(shared_data, tmp_path):
    import gzip

    corpus = tmp_path / "corpus.csv.gz"
    with gzip.open(shared_data / "zinc" / "moses" / "test.csv.gz", "rt") as src:
        lines = [next(src) for _ in range(130)]
    corpus.write_bytes(gzip.compress("".join(lines).encode()))
    settings = {"pretrain_smiles": str(corpus), "inits": ["graphcl"], "pretrain_molecules": 120,
                "plot": False}
    _, first = _run(shared_data, tmp_path / "out", **settings)
    corpus.write_bytes(gzip.compress("".join(lines[:1] + lines[:0:-1]).encode()))  # reordered
    again, second = _run(shared_data, tmp_path / "out", **settings)
    assert second.encoders[("dcl", ())] != first.encoders[("dcl", ())]
    assert _cells(again) == [("bbbp", "dcl", 0)] and again["reused"] == []


def test_interrupted_pretraining_resumes_from_its_last_epoch(shared_data, tmp_path,
                                                             monkeypatch, capsys):
    from adaptcl.adapters.lightning.trainer import AtomicCheckpointIO

    cfg = MoleculeNetConfig(**_values(shared_data, tmp_path / "out", pretrain_epochs=2,
                                      pretrain_molecules=120))
    molecules = load_corpus(cfg, shared_data)
    reference = train.pretrained_encoder(cfg, "dcl", tmp_path / "ref.pt", lambda: molecules,
                                         tmp_path / "logs")
    final = tmp_path / "dcl.pt"
    real_save = AtomicCheckpointIO.save_checkpoint

    def save_then_stop(self, checkpoint, path, storage_options=None):
        real_save(self, checkpoint, path, storage_options)
        if str(path).endswith("last.ckpt"):  # after the first epoch's checkpoint
            raise RuntimeError("stopped")

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", save_then_stop)
    with pytest.raises(RuntimeError, match="stopped"):
        train.pretrained_encoder(cfg, "dcl", final, lambda: molecules, tmp_path / "logs")
    last = final.with_suffix(".lightning") / "last.ckpt"
    assert last.is_file() and not final.exists()
    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", real_save)
    capsys.readouterr()
    resumed = train.pretrained_encoder(cfg, "dcl", final, lambda: molecules, tmp_path / "logs")
    assert f"adaptcl: pre-training dcl resumes from {last}" in capsys.readouterr().err
    assert final.is_file() and not last.parent.exists()
    # exactly the uninterrupted run: weights, optimiser, data order and augmentations restored
    assert resumed["epoch_loss"] == reference["epoch_loss"] and resumed["steps"] == 4
    assert resumed["step_stats"] == reference["step_stats"]
    for key, value in reference["encoder"].items():
        assert torch.equal(resumed["encoder"][key], value), key


def test_fine_tuning_trains_every_epoch_in_train_mode(shared_data, tmp_path, monkeypatch):
    """The per-epoch evaluation puts the model in eval mode; every training step after it must
    see it in train mode again (dropout on, BatchNorm batch statistics)."""
    from adaptcl.adapters.graphcl import MolPropertyModel
    from adaptcl.recipes.engine.cells import Cell

    cfg = MoleculeNetConfig(**_values(shared_data, tmp_path / "out", finetune_epochs=3,
                                      max_molecules=120))
    dataset, split = load_split_dataset(cfg, "bbbp", shared_data)
    modes = []
    real_forward = MolPropertyModel.forward

    def forward(self, data):
        modes.append((torch.is_grad_enabled(), self.training))
        return real_forward(self, data)

    monkeypatch.setattr(MolPropertyModel, "forward", forward)
    cell = Cell((("dataset", "bbbp"), ("init", "none")), seed=0)
    record = train.finetune(cfg, cell, dataset, split, None, tmp_path / "logs")
    steps = [training for grad, training in modes if grad]
    assert len(steps) == record["optimisation_steps"] == 3 * math.ceil(len(split[0]) / 32)
    assert all(steps)  # every training step in train mode
    assert not any(training for grad, training in modes if not grad)  # evaluations in eval
    assert len(record["history"]["test_roc"]) == len(record["losses"]) == 3


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


def test_a_corrupt_featurisation_cache_is_one_note_and_rebuilt(shared_data, tmp_path, capsys):
    """The adapter's ``RuntimeWarning`` reaches the recipe's user as its own one line."""
    cfg = MoleculeNetConfig(**_values(shared_data, tmp_path / "out", max_molecules=60,
                                      cache_dir=str(tmp_path / "cache")))
    built, _ = load_split_dataset(cfg, "bbbp", shared_data)
    (cached,) = (tmp_path / "cache").glob("bbbp-*.pt")
    cached.write_bytes(cached.read_bytes()[:100])  # a kill or a full disk mid-write
    capsys.readouterr()
    rebuilt, _ = load_split_dataset(cfg, "bbbp", shared_data)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"adaptcl: note: featurisation cache {str(cached)!r} is corrupt or truncated ("), err
    assert err[0].endswith("; rebuilding it") and rebuilt.smiles == built.smiles
