"""``--tile-size`` (:mod:`adaptcl.recipes.common.tiling`): declared once for every recipe that
trains with the core's losses, read as ``auto`` / ``none`` / an int, passed to each loss, and in a
run's identity except at its default."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest

from adaptcl import cli
from adaptcl.recipes.common.tiling import parse_tile_size
from adaptcl.recipes.engine.provenance import stable_hash
from adaptcl.recipes.engine.settings import identity_settings, spec_of
from adaptcl.recipes.engine.sweep import Sweep

#: recipe -> its config class, for the recipes that train with the core's losses
TRAINING = {"tu": "adaptcl.recipes.tu.config:TUConfig",
            "moleculenet": "adaptcl.recipes.moleculenet.config:MoleculeNetConfig",
            "images": "adaptcl.recipes.images.config:ImagesConfig",
            "clip": "adaptcl.recipes.clip.config:ClipConfig",
            "simcse": "adaptcl.recipes.simcse.config:SimCSERecipeConfig",
            "demo": "adaptcl.recipes.demo.config:DemoConfig"}


def _config_class(recipe: str) -> type:
    module, name = TRAINING[recipe].split(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("recipe", sorted(TRAINING))
def test_every_training_recipe_declares_the_one_setting(recipe):
    import dataclasses

    field = {f.name: f for f in dataclasses.fields(_config_class(recipe))}["tile_size"]
    spec = spec_of(field)
    assert field.default == "auto" and spec.convert is parse_tile_size and spec.omit_default


@pytest.mark.parametrize("text, value", [("auto", "auto"), ("AUTO", "auto"), ("none", None),
                                         ("None", None), ("4096", 4096), (64, 64),
                                         (None, None)])
def test_a_value_is_read_as_auto_none_or_an_int(text, value):
    assert parse_tile_size(text) == value


@pytest.mark.parametrize("bad", ["big", "0", 0, -3, 2.5, "1e3", True])
def test_a_bad_value_is_refused_naming_the_setting(bad):
    with pytest.raises(ValueError, match=r"^tile_size must be auto, none or an integer >= 1, "):
        parse_tile_size(bad)


def test_a_bad_value_on_the_command_line_is_one_line_and_exit_2(tmp_path, capsys):
    out = tmp_path / "out"
    code = cli.main(["tu", "--tile-size", "big", "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err == ("adaptcl tu: error: tile_size must be auto, none or an "
                                 "integer >= 1, got 'big'\n")
    assert not out.exists()


def test_the_default_stays_out_of_the_identity_and_any_other_value_enters_it():
    from adaptcl.recipes.tu.config import TUConfig

    default, tiled, none = TUConfig(), TUConfig(tile_size="4096"), TUConfig(tile_size="none")
    assert "tile_size" not in identity_settings(default)
    assert identity_settings(tiled)["tile_size"] == 4096
    assert identity_settings(none)["tile_size"] is None
    hashes = {stable_hash(identity_settings(c)) for c in (default, tiled, none)}
    assert len(hashes) == 3
    swept = Sweep.from_values(TUConfig, {"tile_size": ["auto", 2048]})
    assert [identity_settings(swept.config_at(p)).get("tile_size") for p in swept.points()] \
        == [None, 2048]


def test_each_recipe_passes_its_tile_size_to_its_losses(monkeypatch):
    from adaptcl.recipes.clip import train as clip_train
    from adaptcl.recipes.clip.config import ClipConfig
    from adaptcl.recipes.demo.config import DemoConfig
    from adaptcl.recipes.demo.recipe import build_losses
    from adaptcl.recipes.moleculenet.config import MoleculeNetConfig
    from adaptcl.recipes.moleculenet.train import pretrain_loss
    from adaptcl.recipes.tu import train as tu_train
    from adaptcl.recipes.tu.config import TUConfig

    assert tu_train.build_loss(TUConfig(tile_size=64), "macl").tile_size == 64
    assert tu_train.build_loss(TUConfig(), "macl").tile_size == "auto"
    assert pretrain_loss(MoleculeNetConfig(tile_size="none"), "graphcl").tile_size is None
    assert clip_train.build_loss("dystress", "labels", ClipConfig(tile_size=32)).tile_size == 32
    assert {loss.tile_size for _, loss in build_losses(DemoConfig(tile_size=16)).values()} \
        == {16}


@pytest.mark.parametrize("method, loss", [("simclr", "macl"), ("moco", "amcl"),
                                          ("ascl-moco", "ascl")])
def test_images_passes_its_tile_size_through_the_module_settings(method, loss):
    from adaptcl.recipes.images import train
    from adaptcl.recipes.images.config import ImagesConfig

    cfg = ImagesConfig(method=method, losses=[loss], tile_size=48, width=0.125)
    module = train.build_module(cfg, loss, num_classes=10, steps_per_epoch=4)
    core = module.criterion.criterion
    assert train.module_settings(cfg, 10, 4).tile_size == 48 and core.tile_size == 48


def test_simcse_passes_its_tile_size_to_make_loss(monkeypatch, tmp_path):
    from adaptcl.recipes.simcse import train
    from adaptcl.recipes.simcse.config import SimCSERecipeConfig

    class Built(Exception):
        pass

    def make_loss(name, model, **kwargs):
        raise Built(kwargs)

    monkeypatch.setattr(train, "build_simcse_model", lambda *args, **kwargs: object())
    monkeypatch.setattr(train, "training_projection", lambda *args: None)
    monkeypatch.setattr(train, "make_loss", make_loss)
    cfg = SimCSERecipeConfig(tile_size="1024")
    with pytest.raises(Built) as built:
        train.train_cell(cfg, SimpleNamespace(method="macl", seed=0), "m", ["a", "b"], tmp_path,
                         tmp_path, tmp_path)
    assert built.value.args[0]["tile_size"] == 1024
