"""``moleculenet``'s settings: presets, checks, the command line, what enters the identity of
an encoder and of a cell, and which encoders a sweep shares (no training: the pre-training is
replaced by a stand-in that records its calls)."""

from __future__ import annotations

import pytest

from adaptcl.adapters.graphcl.names import LOSS_NAMES
from adaptcl.recipes.engine.command_line import parse
from adaptcl.recipes.engine.settings import identity_settings
from adaptcl.recipes.engine.sweep import Sweep
from adaptcl.recipes.moleculenet.config import PAPER, MoleculeNetConfig
from adaptcl.recipes.moleculenet.recipe import MoleculeNetRecipe


def test_presets_and_validation():
    assert list(MoleculeNetRecipe.presets) == ["cpu", "paper"]  # the first is the default
    assert MoleculeNetRecipe.presets["cpu"] == {}  # the dataclass defaults
    cpu = MoleculeNetConfig()
    assert cpu.datasets == ["bbbp", "bace", "clintox", "sider", "tox21"] and cpu.seeds == [0, 1, 2]
    assert (cpu.pretrain_molecules, cpu.emb_dim, cpu.finetune_epochs) == (6000, 128, 5)
    paper = MoleculeNetConfig(**PAPER)
    assert (paper.emb_dim, paper.num_layers, paper.finetune_epochs, paper.pretrain_epochs) == (
        300, 5, 100, 100)
    assert paper.seeds == list(range(10)) and len(paper.datasets) == 8
    assert (paper.temperature, paper.alpha, paper.a0, paper.batch_size, paper.lr,
            paper.dropout, paper.pretrain_batch_size) == (0.1, 0.5, 0.0, 32, 1e-3, 0.5, 256)
    assert MoleculeNetConfig(datasets=["BBBP"], inits=["MACL"]).datasets == ["bbbp"]
    for bad in ({"datasets": ["esol"]}, {"inits": ["simclr"]}, {"aug": "random4"},
                {"dropout": 1.0}, {"pretrain_batch_size": 1}, {"frac_train": 0.95},
                {"seeds": []}, {"precision": "fp8"}, {"devices": 0}, {"lr": float("nan")},
                {"devices": 2, "pretrain_batch_size": 15}, {"devices": 4, "pretrain_batch_size": 4},
                {"devices": 2, "strategy": "ddp_spawn"}):
        with pytest.raises(ValueError):
            MoleculeNetConfig(**bad)


def test_the_inits_are_none_and_every_loss_graphcl_builds():
    assert MoleculeNetConfig().inits == ["none", "dcl", "macl"]  # graphcl is GraphCL's DCL
    every = MoleculeNetConfig(inits=["None", *LOSS_NAMES]).inits
    assert every == ["none", *LOSS_NAMES]
    assert MoleculeNetConfig(inits=["none", "macl"]).losses == ["macl"]
    with pytest.raises(ValueError, match="unknown init 'simclr'; choose from none, dcl"):
        MoleculeNetConfig(inits=["simclr"])


def test_command_line_preset_with_overrides():
    prog = "adaptcl moleculenet"
    cfg = parse(MoleculeNetRecipe, ["--datasets", "BBBP", "--finetune-epochs", "2",
                                    "--output-dir", "x"], prog).sweep.base
    assert cfg.datasets == ["bbbp"] and cfg.finetune_epochs == 2 and cfg.emb_dim == 128
    assert cfg.seeds == [0, 1, 2] and cfg.output_dir == "x"
    invocation = parse(MoleculeNetRecipe, ["--preset", "paper", "--pretrain-molecules", "none"],
                       prog)
    paper = invocation.sweep.base
    assert invocation.preset == "paper" and paper.pretrain_molecules is None
    assert paper.emb_dim == 300 and paper.finetune_epochs == 100 and paper.seeds == list(range(10))
    swept = parse(MoleculeNetRecipe, ["--temperature", "0.1", "0.2", "--lr", "1e-3"], prog).sweep
    assert swept.axes == {"temperature": [0.1, 0.2]}


def test_each_setting_enters_the_identity_of_its_part():
    cfg = MoleculeNetConfig()
    pretrain = identity_settings(cfg, part="pretrain")
    finetune = identity_settings(cfg, part="finetune")
    shared = {"num_layers", "emb_dim", "jk", "precision", "device"}
    assert shared <= set(pretrain) and shared <= set(finetune)
    assert {"temperature", "alpha", "a0", "aug", "pretrain_molecules", "pretrain_seed"} <= set(
        pretrain) - set(finetune)
    assert {"lr", "batch_size", "dropout", "finetune_epochs", "max_molecules"} <= set(
        finetune) - set(pretrain)
    for bookkeeping in ("output_dir", "threads", "progress", "cache_dir", "devices", "inits"):
        assert bookkeeping not in pretrain and bookkeeping not in finetune
    assert finetune["device"] == "cpu" or finetune["device"] == "cuda"  # its type


@pytest.fixture
def stand_in_pretraining(monkeypatch):
    """``pretrained_encoder`` replaced: records (loss, temperature, lr, file) and returns a
    checkpoint without training."""
    from adaptcl.recipes.moleculenet import train

    calls = []

    def pretrained_encoder(cfg, loss, final, corpus, log_dir):
        calls.append((loss, cfg.temperature, cfg.lr, final))
        return {"encoder": {}, "loss": loss, "epoch_loss": [1.0], "epoch_seconds": [0.0],
                "steps": 1, "step_stats": {"temperature": [cfg.temperature]}}

    monkeypatch.setattr(train, "pretrained_encoder", pretrained_encoder)
    return calls


def _ready(shared_data, tmp_path, values, **config):
    sweep = Sweep.from_values(MoleculeNetConfig, {
        "datasets": ["bbbp"], "seeds": [0], "data_root": str(shared_data),
        "output_dir": str(tmp_path / "out"), "progress": False, **config} | values)
    recipe = MoleculeNetRecipe(sweep)
    recipe.ready(threads=1)
    return recipe


def test_a_sweep_pretrains_one_encoder_per_pretraining_setting(shared_data, tmp_path,
                                                               stand_in_pretraining):
    recipe = _ready(shared_data, tmp_path, {"temperature": [0.1, 0.2], "lr": [1e-3, 5e-4]},
                    inits=["none", "macl", "graphcl"])
    # 2 losses x 2 temperatures, each shared by both learning rates
    assert sorted((loss, t) for loss, t, _, _ in stand_in_pretraining) == [
        ("dcl", 0.1), ("dcl", 0.2), ("macl", 0.1), ("macl", 0.2)]
    files = [final for *_, final in stand_in_pretraining]
    assert len(set(files)) == 4 and all(f.parent == tmp_path / "out" / "pretrain" for f in files)
    cells = recipe.cells()
    assert len(cells) == 3 * 4
    stems = {(c.init, c.temperature, c.lr): recipe.identity_of(c)["pretrained"] for c in cells}
    assert stems[("macl", 0.1, 1e-3)] == stems[("macl", 0.1, 5e-4)] != stems[("macl", 0.2, 1e-3)]
    assert stems[("none", 0.1, 1e-3)] is None
    # a fine-tuning setting enters the cell's identity, a pre-training one only its encoder's
    none = {(c.temperature, c.lr): recipe.identity_of(c)["settings"] for c in cells
            if c.init == "none"}
    assert none[(0.1, 1e-3)] == none[(0.2, 1e-3)] != none[(0.1, 5e-4)]
    assert set(recipe.pretrainings()) == {"dcl, temperature=0.1", "dcl, temperature=0.2",
                                          "macl, temperature=0.1", "macl, temperature=0.2"}


def test_the_encoder_of_several_devices_has_its_own_identity(shared_data, tmp_path,
                                                             stand_in_pretraining):
    one = _ready(shared_data, tmp_path, {}, inits=["macl"])
    two = _ready(shared_data, tmp_path, {}, inits=["macl"], devices=2, strategy="ddp")
    assert one.encoders[("macl", ())] != two.encoders[("macl", ())]
    other = _ready(shared_data, tmp_path, {}, inits=["macl"], threads=2, progress=True)
    assert other.encoders[("macl", ())] == one.encoders[("macl", ())]  # bookkeeping only
