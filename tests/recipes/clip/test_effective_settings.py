"""``adaptcl clip``: a limit that asks for more images than there are is recorded as applied
(the config, so ``results.json`` and ``compare --by``, and the identity), so two limits that
resolve to the same images are one run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("open_clip")

from adaptcl.recipes.clip.config import ClipConfig  # noqa: E402
from adaptcl.recipes.clip.recipe import ClipRecipe  # noqa: E402
from adaptcl.recipes.engine.sweep import Sweep  # noqa: E402


def test_retrieval_beyond_the_test_images_is_recorded_as_applied(shared_data, tmp_path,
                                                                   capsys):
    recipe = ClipRecipe(Sweep.from_values(ClipConfig, {
        "data_root": str(shared_data), "output_dir": str(tmp_path), "losses": ["infonce"],
        "targets": ["pairs"], "train_limit": 256, "test_limit": 100,
        "retrieval_limit": [5000, 100], "batch_size": 64}))
    recipe.prepare(recipe.point_configs())
    assert capsys.readouterr().err.count(
        "adaptcl: note: --retrieval-limit 5000 applies as 100: the images loaded from npz "
        "(lossless)") == 1
    assert [c.retrieval_limit for c in recipe.point_configs().values()] == [100, 100]
    row = recipe.rows()[0]
    asked, exact = (recipe.identity_of(recipe.cell(row, "infonce", 0, p))
                    for p in recipe.sweep.points())
    assert asked == exact and asked["settings"]["retrieval_limit"] == 100
    header = recipe.report_spec().header
    no_records = SimpleNamespace(records={})   # the header of a grid before any run
    assert "R@1 on the first 100 test images" in (header(no_records) if callable(header)
                                                   else header)


def test_a_training_limit_beyond_the_copy_is_recorded_as_applied(shared_data, tmp_path, capsys):
    recipe = ClipRecipe(ClipConfig(data_root=str(shared_data), output_dir=str(tmp_path),
                                   losses=["infonce"], targets=["pairs"], npz_variant="lossless",
                                   train_limit=100000, test_limit=100))
    recipe.prepare(recipe.point_configs())
    assert "--train-limit 100000 applies as 4000" in capsys.readouterr().err
    assert recipe.config.train_limit == 4000
    assert recipe.identity_of(recipe.cell(recipe.rows()[0], "infonce", 0))["settings"][
        "train_limit"] == 4000
