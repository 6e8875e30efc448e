"""``adaptcl images``: the temperature schedule's period is identified by the steps it runs, and
one that cannot move the temperature is refused before any work."""

from __future__ import annotations

from adaptcl import cli
from adaptcl.recipes.engine.sweep import Sweep
from adaptcl.recipes.images.config import ImagesConfig
from adaptcl.recipes.images.recipe import ImagesRecipe

#: 256 training images in batches of 128: 2 optimisation steps per epoch
SMALL = ["--train-limit", "256", "--test-limit", "100", "--batch-size", "128"]


def test_a_schedule_period_of_one_step_is_refused_before_any_work(shared_data, tmp_path,
                                                                 capsys):
    out = tmp_path / "out"
    code = cli.main(["images", "--data-root", str(shared_data), "--losses", "infonce",
                     "temperature_schedule", "--epochs", "1", *SMALL, "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err == (
        "adaptcl images: error: --schedule-period 0.2 (epochs; none: a fifth of --epochs 1) is 1 "
        "optimisation step on cifar10 (2 per epoch): temperature_schedule's temperature would "
        "stay at --max-temperature; give at least 1 epoch (2 steps)\n")
    assert not out.exists()


def test_periods_of_the_same_steps_are_one_identity(shared_data, tmp_path):
    recipe = ImagesRecipe(Sweep.from_values(ImagesConfig, {
        "data_root": str(shared_data), "output_dir": str(tmp_path), "epochs": 10,
        "losses": ["infonce", "temperature_schedule"], "schedule_period": [None, 2.2, 3.0],
        "train_limit": 256, "test_limit": 100, "batch_size": 128}))
    recipe.prepare(recipe.point_configs())
    row = recipe.rows()[0]
    none, close, other = (recipe.identity_of(recipe.cell(row, "temperature_schedule", 0, p))
                          for p in recipe.sweep.points())
    assert none == close and none["settings"]["schedule_period_steps"] == 4
    assert other["settings"]["schedule_period_steps"] == 6
    infonce = [recipe.identity_of(recipe.cell(row, "infonce", 0, p))
               for p in recipe.sweep.points()]
    assert infonce[0] == infonce[1] == infonce[2]  # it reads no schedule setting


def test_a_limit_beyond_the_images_is_recorded_as_applied_and_is_one_run(shared_data, tmp_path,
                                                                        capsys):
    """``--train-limit 100000 --npz-variant lossless`` trains on the 4,000 images the copy
    has: the config (so results.json and ``compare --by``) and the identity say 4000, and
    the run is the one of ``--train-limit 4000``."""
    recipe = ImagesRecipe(Sweep.from_values(ImagesConfig, {
        "data_root": str(shared_data), "output_dir": str(tmp_path), "epochs": 1,
        "losses": ["infonce"], "npz_variant": "lossless", "train_limit": [100000, 4000],
        "test_limit": 5000}))
    recipe.prepare(recipe.point_configs())
    assert capsys.readouterr().err.count("adaptcl: note: --train-limit 100000 applies as 4000; "
                                         "--test-limit 5000 applies as 1000") == 1
    asked, exact = recipe.point_configs().values()
    assert (asked.train_limit, asked.test_limit) == (exact.train_limit, exact.test_limit) == (
        4000, 1000)
    row = recipe.rows()[0]
    first, second = (recipe.identity_of(recipe.cell(row, "infonce", 0, p))
                     for p in recipe.sweep.points())
    assert first == second and first["settings"]["train_limit"] == 4000
