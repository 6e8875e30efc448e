"""``adaptcl tu``: GraphCL pre-training on TU datasets, SVM evaluation, every loss in one table.

The unsupervised TU protocol of GraphCL (You et al., NeurIPS 2020) as used by MACL (Huang et al.,
ICML 2023, Table 4, App. B.5); the protocol, presets and outputs are on the docs page
``docs/recipes/tu.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adaptcl.io import fingerprint_files, resolve_data_root
from adaptcl.recipes.common.devices import devices_identity
from adaptcl.recipes.common.graph_report import draw_pretraining_curves, paper_columns
from adaptcl.recipes.common.schedule import check_period, period_in_steps
from adaptcl.recipes.engine import Cell, Figure, GridRun, Recipe, ReportSpec
from adaptcl.recipes.engine.settings import drop_repeats
from adaptcl.recipes.engine.sweep import Point
from adaptcl.recipes.engine.torch_env import check_lightning_precision
from adaptcl.recipes.tu.config import PRESETS, TUConfig
from adaptcl.recipes.tu.data import check_folds, find_raw, graph_label_counts, load_tu_graphs

EXAMPLE = """adaptcl tu --data-root ../shared/data --datasets MUTAG --losses graphcl macl \\
    --seeds 0 1 2 3 4 --output-dir results/tu
adaptcl tu --datasets MUTAG --losses macl --temperature 0.1 0.2 --alpha 0.5 1.0 --seeds 0 1 2"""

# Huang et al. 2023 (MACL), Table 4: accuracy % (mean, std) of GraphCL and GraphCL w/ MACL.
PAPER_TABLE4: dict[str, dict[str, tuple[float, float]]] = {
    "NCI1": {"dcl": (77.87, 0.41), "macl": (78.41, 0.47)},
    "PROTEINS": {"dcl": (74.39, 0.45), "macl": (74.47, 0.85)},
    "MUTAG": {"dcl": (86.80, 1.34), "macl": (89.04, 0.98)},
    "REDDIT-BINARY": {"dcl": (89.53, 0.84), "macl": (90.59, 0.36)},
    "DD": {"dcl": (78.62, 0.40), "macl": (78.80, 0.66)},
    "IMDB-BINARY": {"dcl": (71.14, 0.44), "macl": (71.42, 1.05)},
}


class TURecipe(Recipe):
    """``adaptcl tu``: every (dataset, loss, point, seed) pre-trained and scored by the SVM."""

    name, config_class, presets, example = "tu", TUConfig, PRESETS, EXAMPLE
    description = "GraphCL pre-training on TU datasets, SVM 10-fold CV, every loss"
    axes = ("dataset", "loss")
    code = ("adaptcl.recipes.tu", "adaptcl.recipes.common", "adaptcl.evaluation.graphs",
            "adaptcl.adapters.graphcl", "adaptcl.plugins")
    frameworks = ("torch_geometric", "scikit-learn", "pytorch-lightning")
    figure = Figure("macl_temperature_alignment.png", ncols=2, figsize=(10, 3.6))

    def prepare(self, configs: Mapping[Point, TUConfig]) -> None:
        """Each loss built once (its own argument checks), the precision, each dataset's raw
        folder, fingerprint, the folds it can fill and the schedule's period in its steps.
        Nothing is written."""
        from adaptcl.recipes.tu.train import build_loss

        for config in configs.values():
            for loss in config.losses:
                build_loss(config, loss)
        for config in configs.values():
            check_lightning_precision(self.config.device, config.precision)
        self.data_root = resolve_data_root(self.config.data_root)
        self.sources: dict[str, Path] = {}
        self.sizes: dict[str, int] = {}  # graphs per dataset
        found = [find_raw(self.data_root, name) for name in self.config.datasets]
        raws = dict(found)  # a name's canonical spelling and folder: MUTAG mutag run once, noted
        for canonical in drop_repeats("datasets", list(self.config.datasets),
                                      [name for name, _ in found]):
            raw = raws[canonical]
            counts = graph_label_counts(raw, canonical)
            self.sizes[canonical] = sum(counts.values())
            for config in configs.values():
                check_folds(canonical, counts, config.folds, config.inner_folds)
                check_period(config, self.steps_per_epoch(canonical, config), canonical)
            self.sources[canonical] = raw
            self.fingerprints[canonical] = fingerprint_files([raw], root=raw)
        self._loaded: dict[tuple[str, Any], tuple[list, int, dict]] = {}

    def rows(self) -> list[str]:
        return list(self.sources)  # the canonical names

    def setup(self) -> None:
        """With ``--jobs``/``--cluster`` or ``--devices``: each dataset processed here, before
        another process could write its ``processed/`` too."""
        if self.jobs.parallel or self.config.devices > 1:
            for name in self.sources:
                self._graphs(name, self.config)

    def _graphs(self, name: str, config: TUConfig) -> tuple[list, int, dict]:
        """The graphs of ``name`` with ``config``'s node features (one dataset in memory)."""
        key = (name, (config.node_features, config.max_degree))
        if key not in self._loaded:
            self._loaded.clear()
            self._loaded[key] = load_tu_graphs(config, name, self.sources[name],
                                               self.fingerprints[name]["sha256"])
        return self._loaded[key]

    def steps_per_epoch(self, dataset: str, config: TUConfig) -> int:
        """The optimisation steps of one epoch on ``dataset`` (as ``train_and_score`` counts)."""
        return math.ceil(self.sizes[dataset] / config.batch_size)

    def identity(self, cell: Cell, config: TUConfig) -> dict[str, Any]:
        """The settings (a schedule's period in steps), data, code, several devices."""
        out = super().identity(cell, config) | devices_identity(config.devices, config.strategy)
        if cell.loss == "temperature_schedule":
            out["settings"] = period_in_steps(out["settings"],
                                              self.steps_per_epoch(cell.dataset, config))
        return out

    def compute(self, cell: Cell, config: TUConfig) -> dict[str, Any] | None:
        from adaptcl.recipes.tu.train import train_and_score

        graphs, dim, info = self._graphs(cell.dataset, config)
        record = train_and_score(config, cell, graphs, dim,
                                 self.layout.cell_folder("logs", cell))
        return record | {"info": info} if record is not None else None

    def report_spec(self) -> ReportSpec:
        cfg = self.config

        def details(grid: GridRun) -> dict[str, Any]:
            infos = {c.dataset: r.get("info") for c, r in grid.records.items()}
            return {"datasets": {n: {"info": infos.get(n), "paper_table4": PAPER_TABLE4.get(n)}
                                 for n in self.rows()}}

        header = (f"# GraphCL on TU datasets: SVM accuracy (%)\n\nSeeds {cfg.seeds}; settings in "
                  "results.json. Mean ± population std over seeds; differences are paired over "
                  "seeds with a 95% t-interval; the paper columns are Huang et al. 2023 (MACL), "
                  "Table 4.\n\n")
        return ReportSpec(
            metrics=("accuracy",), baseline="dcl" if "dcl" in cfg.losses else cfg.losses[0],
            labels={"dcl": "GraphCL (dcl)"}, header=header, details=details,
            drop=("step_stats",),
            extra_columns=paper_columns(PAPER_TABLE4, {"dcl": "paper GraphCL",
                                                       "macl": "paper GraphCL w/ MACL"}))

    def draw(self, grid: GridRun, axes: list[Any]) -> None:
        """Alignment of every loss and the temperature over pre-training steps, first seed."""
        seed = min(c.seed for c in grid.records)
        draw_pretraining_curves(axes, {"/".join(c.parts()[:-1]): r.get("step_stats", {})
                                       for c, r in grid.records.items() if c.seed == seed})
        axes[0].set(title=f"seed {seed}")


RECIPE = TURecipe
