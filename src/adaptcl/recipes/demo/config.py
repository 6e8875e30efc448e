"""The settings of ``adaptcl demo``."""

from __future__ import annotations

from dataclasses import dataclass

from adaptcl.recipes.common import macl_settings, tiling
from adaptcl.recipes.engine import options
from adaptcl.recipes.engine.settings import (
    at_least,
    check_settings,
    non_negative,
    open_fraction,
    positive,
    setting,
)


@dataclass
@options.run_options("threads", "device", "precision", "logger", "progress")
class DemoConfig:
    """Settings of the ``demo`` recipe (see :mod:`adaptcl.recipes.demo.recipe`)."""

    epochs: int = setting(30, check=positive, help="training epochs per loss")
    batch_size: int = setting(256, check=at_least(2), help="pairs per step (contrastive "
                              "losses need negatives)")
    seeds: list[int] = options.seeds([0])
    output_dir: str = options.output_dir("results/demo")
    lr: float = setting(2e-3, check=positive, help="Adam learning rate")
    weight_decay: float = setting(1e-5, check=non_negative, help="Adam weight decay")
    temperature: float = setting(0.1, check=positive, help="tau (NT-Xent) and tau0 (MACL)")
    macl_alpha: float = macl_settings.alpha()
    macl_a0: float = macl_settings.a0()
    tile_size: str | int | None = tiling.tile_size()
    test_fraction: float = setting(0.25, check=open_fraction, help="share of the digits held "
                                   "out for the evaluation")
    knn_k: int = setting(15, check=positive, help="neighbours of the kNN vote")
    width: int = setting(16, check=positive, help="channels of the first conv layer")
    feature_dim: int = setting(128, check=positive, help="encoder output, the representation "
                               "that is evaluated")
    projection_dim: int = setting(64, check=positive, help="projection head output")
    # One thread: the model is tiny (about 0.3 GFLOP per step), so OpenMP's per-op
    # synchronisation costs more than a second thread saves, badly so on a busy machine.

    def __post_init__(self) -> None:
        check_settings(self)
