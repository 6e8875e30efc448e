"""The settings of ``adaptcl tu``; defaults are GraphCL's TU setting with fixed CV seeds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adaptcl.adapters.graphcl.names import LOSS_ALIASES, LOSS_NAMES
from adaptcl.recipes.common import macl_settings, schedule, tiling
from adaptcl.recipes.common.devices import check_devices
from adaptcl.recipes.common.schedule import resolve_schedule
from adaptcl.recipes.engine import options
from adaptcl.recipes.engine.settings import (
    at_least,
    check_settings,
    fraction,
    positive,
    seed_range,
    setting,
)

SOCIAL_DATASETS = ("IMDB-BINARY", "IMDB-MULTI", "REDDIT-BINARY", "REDDIT-MULTI-5K", "COLLAB")
AUGMENTATIONS = ("auto", "none", "dnodes", "pedges", "mask_nodes", "subgraph", "random2",
                 "random3", "random4")


#: presets: the default (GraphCL's settings, fixed CV folds) and GraphCL's own code paths
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "graphcl-exact": {"aug_ratio": 0.1, "subgraph_ratio": 0.2, "graphcl_quirks": True,
                      "cv_seed": None},
}


@dataclass
@options.run_options()
class TUConfig:
    """Settings of a ``tu`` run: GraphCL pre-training on TU datasets, SVM under 10-fold CV."""

    datasets: list[str] = setting(factory=lambda: ["MUTAG"], axis="dataset",
                                  help="TU dataset names (case-insensitive)")
    losses: list[str] = options.losses(["graphcl", "macl"], LOSS_NAMES, LOSS_ALIASES,
                                       "contrastive losses (GraphCL's own: graphcl)")
    seeds: list[int] = options.seeds([0, 1, 2, 3, 4])
    data_root: str | None = options.data_root("folder holding tu/<NAME>/raw or <NAME>/raw")
    output_dir: str = options.output_dir("results/tu")
    work_dir: str | None = options.work_folder("writable copy of the raw data + processed/ "
                                               "(none: <output-dir>/data)")
    epochs: int = setting(20, check=positive, help="pre-training epochs")
    batch_size: int = setting(128, check=at_least(2), help="graphs per step (a contrastive "
                              "batch needs a negative)")
    lr: float = setting(0.01, check=positive, help="Adam learning rate")
    hidden: int = setting(32, check=positive, help="GIN hidden units")
    layers: int = setting(3, check=positive, help="GIN layers")
    temperature: float = setting(0.2, check=positive, help="tau (tau0 for MACL)")
    alpha: float = macl_settings.alpha()
    a0: float = macl_settings.a0()
    max_temperature: float = schedule.max_temperature()
    schedule_period: float | None = schedule.schedule_period()
    tile_size: str | int | None = tiling.tile_size()
    aug: str = setting("auto", choices=AUGMENTATIONS, help="GraphCL augmentation of the second "
                       "view (auto: random4 on social sets, random2 on the others)")
    aug_ratio: float = setting(0.2, check=fraction, help="augmentation ratio")
    subgraph_ratio: float | None = setting(None, check=fraction, help="fraction of nodes the "
                                           "subgraph removes (none: --aug-ratio)")
    graphcl_quirks: bool = setting(False, help="removal-only edge perturbation and one-hop "
                                   "subgraph, as GraphCL's code")
    first_view: str = setting("identity", choices=("identity", "augmented"),
                              help="the first view: the graph itself (GraphCL) or augmented")
    node_features: str = setting("constant", choices=("constant", "degree"), help="features "
                                 "of datasets without any: x = 1 or a capped one-hot degree")
    max_degree: int = setting(100, check=positive, help="cap of the one-hot degree")
    folds: int = setting(10, check=at_least(2), help="outer CV folds")
    inner_folds: int = setting(5, check=at_least(2), help="inner CV folds (the C grid)")
    c_grid: list[float] = setting(factory=lambda: [1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3],
                                  check=positive, help="values of C searched by the inner grid")
    classifier: str = setting("svc", choices=("svc", "linear"), help="SVM kernel: RBF or linear")
    standardize: bool = setting(False, help="z-score the embeddings before the SVM")
    cv_seed: int | None = setting(0, check=seed_range, help="seed of the CV splits (none: GraphCL's unseeded "
                                  "splits)")

    def __post_init__(self) -> None:
        check_settings(self)
        check_devices(self.batch_size, self.devices, self.strategy)
        resolve_schedule(self)

    def augmentation(self, dataset: str) -> str:
        """The augmentation of ``dataset``'s second view (``auto`` resolved)."""
        if self.aug != "auto":
            return self.aug
        return "random4" if dataset.upper() in SOCIAL_DATASETS else "random2"
