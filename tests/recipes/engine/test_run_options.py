"""The run options (``--threads``, ``--device``, ... ``--no-plot``) are declared once
(:func:`adaptcl.recipes.engine.options.run_options`) and come last in a config, in the order named."""

from __future__ import annotations

import dataclasses

import pytest

from adaptcl.recipes.engine import options, setting
from adaptcl.recipes.engine.settings import specs
from adaptcl.recipes.images.config import ImagesConfig
from adaptcl.recipes.simcse.config import SimCSERecipeConfig
from adaptcl.recipes.tu.config import TUConfig


def test_the_named_run_options_are_a_configs_last_fields_in_their_order():
    @dataclass_with("threads", "progress", "device")
    class Config:
        lr: float = setting(0.1, help="learning rate")

    names = [f.name for f in dataclasses.fields(Config)]
    assert names == ["lr", "threads", "progress", "device"]
    config = Config()
    assert (config.threads, config.progress, config.device) == (1, True, "auto")
    assert specs(config)["threads"].identity is False  # a run option: not in the identity


def dataclass_with(*names):
    return lambda cls: dataclasses.dataclass(options.run_options(*names)(cls))


def test_every_recipes_run_options_are_the_shared_ones():
    tail = list(options.RUN_OPTIONS)
    assert [f.name for f in dataclasses.fields(TUConfig)][-8:] == tail
    assert [f.name for f in dataclasses.fields(ImagesConfig)][-8:] == [
        "threads", "device", "devices", "strategy", "precision", "logger", "progress", "plot"]
    # simcse's precision is its own declaration: part of the training's identity only
    assert specs(SimCSERecipeConfig)["precision"].identity == "training"
    assert specs(TUConfig)["precision"].identity is True


@pytest.mark.parametrize(("names", "declared", "bad"), [
    (("threads", "thread"), {}, "'thread'"),
    (("threads",), {"plot": options.plot()}, "'plot'"),
])
def test_an_unknown_or_unnamed_run_option_is_refused(names, declared, bad):
    with pytest.raises(ValueError, match=f"run_options: {bad} is not one of the run options"):
        options.run_options(*names, **declared)


def test_a_config_declaring_a_run_option_itself_is_refused():
    class Config:
        threads: int = setting(2, help="mine")

    with pytest.raises(ValueError, match="Config declares the run option 'threads' itself"):
        options.run_options("threads")(Config)
