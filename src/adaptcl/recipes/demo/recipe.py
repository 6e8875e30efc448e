"""``adaptcl demo``: a short real run comparing NT-Xent and MACL on scikit-learn's digits.

The same small CNN is trained SimCLR-style from the same seed on the same views with each loss,
then its frozen encoder is scored (kNN, alignment, uniformity) beside two untrained references;
the protocol and outputs are on the docs page ``docs/recipes/demo.md``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from adaptcl.recipes.demo.config import DemoConfig
from adaptcl.recipes.demo.data import NUM_CLASSES, digits_fingerprint, load_digits_split
from adaptcl.recipes.engine import Cell, Figure, GridRun, Recipe, ReportSpec
from adaptcl.recipes.engine.loggers import MetricLogger
from adaptcl.recipes.engine.sweep import Point
from adaptcl.recipes.engine.torch_env import resolve_device

if TYPE_CHECKING:
    from torch import nn

EXAMPLE = """adaptcl demo --output-dir results/demo
adaptcl demo --epochs 5 --seeds 0 1 2 --logger tensorboard --output-dir /tmp/demo"""
LOSSES = ("infonce", "macl")
REFERENCES = ("raw_pixels", "random_encoder")  # no training step, first seed only


def build_losses(config: DemoConfig) -> dict[str, tuple[str, nn.Module]]:
    """key -> (table name, loss module) of the two losses compared (at the run's tile size)."""
    from adaptcl.plugins import InfoNCELoss, MACLLoss

    tiles = config.tile_size
    return {
        "infonce": (f"NT-Xent (tau={config.temperature:g})",
                    InfoNCELoss(config.temperature, tile_size=tiles)),
        "macl": (f"MACL (tau0={config.temperature:g}, alpha={config.macl_alpha:g}, "
                 f"A0={config.macl_a0:g})",
                 MACLLoss(config.temperature, config.macl_alpha, config.macl_a0, reweight=True,
                          tile_size=tiles)),
    }


class DemoRecipe(Recipe):
    """``adaptcl demo``: NT-Xent and MACL per seed, two untrained references, one table."""

    name, config_class, example = "demo", DemoConfig, EXAMPLE
    description = "short NT-Xent vs MACL run on bundled digits, table + plot"
    axes = ("dataset", "method")
    code = ("adaptcl.recipes.demo", "adaptcl.plugins")
    frameworks = ("scikit-learn",)
    figure = Figure("demo_training.png", ncols=3, figsize=(13, 3.6),
                    title="adaptcl demo: NT-Xent vs MACL on sklearn digits (same seed, same "
                          "views)")

    def prepare(self, configs: Mapping[Point, DemoConfig]) -> None:
        resolve_device(self.config.device)
        self.fingerprints = {"digits": digits_fingerprint()}
        self.losses = {point: build_losses(config) for point, config in configs.items()}
        x_train, _, x_test, _ = load_digits_split(self.config.test_fraction, self.seeds()[0])
        self.sizes = (int(x_train.shape[0]), int(x_test.shape[0]))

    def rows(self) -> list[str]:
        return ["digits"]

    def methods(self) -> list[str]:
        return [*REFERENCES, *LOSSES]

    def cells(self) -> list[Cell]:
        """The references once (first seed, first point), every loss at every seed."""
        seeds, points = self.seeds(), self.sweep.points()
        return ([self.cell("digits", m, seeds[0], points[0]) for m in REFERENCES]
                + [self.cell("digits", m, s, p) for p in points for s in seeds for m in LOSSES])

    def loss_of(self, method: str) -> str | None:
        """The loss of a column (the references train none)."""
        return method if method in LOSSES else None

    def trains(self, cell: Cell) -> bool:
        return cell.method in LOSSES

    def compute(self, cell: Cell, config: DemoConfig) -> dict[str, Any]:
        from adaptcl.recipes.demo.data import split_and_views
        from adaptcl.recipes.demo.model import build_model, embed, evaluate, train

        cfg = config
        data, views = split_and_views(cfg.test_fraction, cell.seed)
        model = None if cell.method == "raw_pixels" else build_model(cfg, cell.seed)
        if cell.method in REFERENCES:
            features = (lambda x: x.flatten(1)) if model is None else (
                lambda x: embed(model.encoder, x))
            return {"metrics": evaluate(features, data, views, cfg.knn_k),
                    "optimisation_steps": 0, "train_seconds": 0.0}
        start = time.perf_counter()
        with MetricLogger(cfg.logger, self.layout.cell_folder("logs", cell)) as logger:
            history = train(model, self.losses[cell.point][cell.method][1], data[0], cfg,
                            cell.seed, logger, desc=cell.label())
        seconds = time.perf_counter() - start
        metrics = evaluate(lambda x: embed(model.encoder, x), data, views, cfg.knn_k)
        return {"metrics": metrics | {"final_temperature": history["temperature"][-1]},
                "optimisation_steps": len(history["step"]), "losses": history["loss"],
                "history": history, "train_seconds": seconds}

    def report_spec(self) -> ReportSpec:
        cfg, first, seeds = self.config, self.sweep.points()[0], self.seeds()
        names = {"raw_pixels": "raw pixels (no training)",
                 "random_encoder": "random-init encoder (no training)",
                 **{key: name for key, (name, _) in self.losses[first].items()}}
        min_temperature = self.losses[first]["macl"][1].min_temperature
        evaluation = {"features": f"encoder output ({cfg.feature_dim}-d, before the head)",
                      "knn": f"cosine, k={cfg.knn_k}, majority vote",
                      "alignment": "Wang & Isola, alpha=2, two augmented views of each test image",
                      "uniformity": "Wang & Isola, t=2, clean test images"}

        def details(grid: GridRun) -> dict[str, Any]:
            history = {c.method: r["history"] for c, r in grid.records.items()
                       if c.method in LOSSES and c.seed == seeds[0] and c.point == first}
            temps = history.get("macl", {}).get("temperature")
            return {
                "data": {"source": "sklearn.datasets.load_digits", "n_train": self.sizes[0],
                         "n_test": self.sizes[1], "classes": NUM_CLASSES, "image_shape": [8, 8]},
                "evaluation": evaluation, "chance_accuracy": 1.0 / NUM_CLASSES, "names": names,
                "history": history, "macl_min_temperature": min_temperature,
                "macl_temperature_range": [min(temps), max(temps)] if temps else None}

        header = (
            f"# adaptcl demo: sklearn digits ({self.sizes[0]} train / {self.sizes[1]} test), "
            f"{cfg.epochs} epochs, batch {cfg.batch_size}, seeds {seeds}\n\n"
            f"kNN: {evaluation['knn']} on the {evaluation['features']}, in % (chance is "
            f"{100 / NUM_CLASSES:.0f}%); alignment and uniformity: lower is better. "
            + ("Mean ± population std over seeds (the rows without training: first seed "
               "only); the last column is each row's kNN accuracy minus NT-Xent's, paired over "
               "seeds with a 95% t-interval." if len(seeds) > 1 else "One seed: each value is "
               "one run's; the last column is each row's kNN accuracy minus NT-Xent's.")
            + f" MACL's temperature floor is {min_temperature:g}.\n\n")
        percent = ("knn_accuracy", "knn_accuracy_augmented")
        return ReportSpec(
            metrics=("knn_accuracy", "alignment", "uniformity", "final_temperature",
                     "knn_accuracy_augmented"),
            baseline="infonce", header=header, labels=names, by_method=not self.sweep.axes,
            scale=dict.fromkeys(percent, 100.0),
            digits=dict.fromkeys(percent, 1) | {"alignment": 3, "uniformity": 3,
                                                "final_temperature": 4},
            metric_labels={"knn_accuracy": "kNN acc", "final_temperature": "final temperature",
                           "knn_accuracy_augmented": "kNN acc, augmented queries"},
            details=details, drop=("history", "losses"))

    def draw(self, grid: GridRun, axes: list[Any]) -> None:
        """Temperature, alignment magnitude A and InfoNCE over steps for every loss, first seed."""
        panels = (("temperature", "temperature tau"),
                  ("alignment", "alignment magnitude A (mean positive cosine)"),
                  ("plain_loss", "InfoNCE value (unweighted)"))
        for ax, (key, title) in zip(axes, panels, strict=True):
            for cell, record in grid.records.items():
                if cell.method in LOSSES and cell.seed == self.seeds()[0]:
                    hist = record["history"]
                    label = self.losses[cell.point][cell.method][0]
                    ax.plot(hist["step"], hist[key], linewidth=1.4,
                            label=", ".join(filter(None, (label, *(f"{k}={v}" for k, v
                                                                  in cell.point)))))
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("training step")
            ax.grid(alpha=0.3)
        floor = self.losses[self.sweep.points()[0]]["macl"][1].min_temperature
        axes[0].axhline(floor, color="grey", linestyle=":", linewidth=1,
                        label=f"MACL floor {floor:g}")


RECIPE = DemoRecipe
