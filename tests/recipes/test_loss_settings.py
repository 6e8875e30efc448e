"""Each recipe declares which losses read its loss-specific settings (``setting(losses=...)``),
as its ``train.py`` passes them: a sweep over one trains every other loss once."""

from __future__ import annotations

import pytest

from adaptcl.recipes.engine.sweep import Sweep


def _recipe(recipe_class, **values):
    return recipe_class(Sweep.from_values(recipe_class.config_class, values))


def test_tu_macl_and_the_schedule_settings_are_read_by_their_loss_only():
    from adaptcl.recipes.tu.recipe import TURecipe

    losses = ["graphcl", "macl", "temperature_schedule"]
    assert _recipe(TURecipe, losses=losses, alpha=[0.5, 1.0], a0=[0.0, 0.2]).ignoring() == {
        "alpha": ["dcl", "temperature_schedule"], "a0": ["dcl", "temperature_schedule"]}
    swept = _recipe(TURecipe, losses=losses, max_temperature=[1.0, 2.0], epochs=10,
                    schedule_period=[1.0, 2.0])
    assert swept.ignoring() == {"max_temperature": ["dcl", "macl"],
                                "schedule_period": ["dcl", "macl"]}
    assert _recipe(TURecipe, losses=losses, temperature=[0.1, 0.2]).ignoring() == {}


@pytest.mark.parametrize("setting, values, ignoring", [
    ("alpha", [0.5, 1.0], ["infonce", "amcl", "ascl"]),
    ("macl_temperature", [0.1, 0.2], ["infonce", "amcl", "ascl"]),
    ("num_heads", [2, 4], ["infonce", "macl", "ascl"]),
    ("kappa", [1, 2], ["infonce", "macl", "ascl"]),
    ("num_neighbors", [1, 2], ["infonce", "macl", "amcl"]),
    ("sharpen_temperature", [0.05, 0.1], ["infonce", "macl", "amcl"]),
    ("queue_size", [512, 1024], []),  # MoCo's queue: every loss of the method reads it
])
def test_images_settings_of_macl_amcl_and_ascl(setting, values, ignoring):
    from adaptcl.recipes.images.recipe import ImagesRecipe

    recipe = _recipe(ImagesRecipe, method="moco", losses=["infonce", "macl", "amcl", "ascl"],
                     **{setting: values})
    assert recipe.ignoring() == ({setting: ignoring} if ignoring else {})


def test_ascl_moco_reads_its_neighbours_in_every_mode_but_plain_moco():
    from adaptcl.recipes.images.recipe import ImagesRecipe

    recipe = _recipe(ImagesRecipe, method="ascl-moco", losses=["infonce", "ascl", "ahcl", "hard"],
                     num_neighbors=[1, 2])
    assert recipe.ignoring() == {"num_neighbors": ["infonce"]}


def test_clip_columns_are_matched_by_their_loss():
    from adaptcl.recipes.clip.recipe import ClipRecipe

    recipe = _recipe(ClipRecipe, losses=["infonce", "macl", "dystress"], alpha=[0.5, 1.0],
                     min_temperature=[0.02, 0.05])
    assert recipe.ignoring() == {
        "alpha": ["infonce", "dystress", "infonce+labels", "dystress+labels"],
        "min_temperature": ["infonce", "macl", "infonce+labels", "macl+labels"]}


def test_demo_references_train_no_loss():
    from adaptcl.recipes.demo.recipe import DemoRecipe

    assert _recipe(DemoRecipe, macl_alpha=[0.5, 1.0]).ignoring() == {"macl_alpha": ["infonce"]}


def test_moleculenet_pretrains_a_loss_once_under_a_sweep_of_a_setting_it_ignores():
    from adaptcl.recipes.moleculenet.recipe import MoleculeNetRecipe

    recipe = _recipe(MoleculeNetRecipe, inits=["none", "graphcl", "macl"], alpha=[0.5, 1.0])
    recipe.fingerprints = {"pretrain": {"sha256": "0" * 64}}
    encoders = {(loss, point): recipe.encoder_path(recipe.sweep.config_at(point), loss)
                for loss in ("dcl", "macl") for point in recipe.sweep.points()}
    first, second = recipe.sweep.points()
    assert encoders["dcl", first] == encoders["dcl", second]
    assert encoders["macl", first] != encoders["macl", second]
    assert recipe.ignoring() == {"alpha": ["none", "dcl"]}
