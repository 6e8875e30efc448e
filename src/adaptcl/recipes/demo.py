"""``adaptcl demo``: a short real run comparing NT-Xent and MACL on scikit-learn's digits.

The data ships with scikit-learn (:mod:`adaptcl.recipes.demo_data`: 1797 grey 8x8 digits, no
download, a stratified 75/25 split: 1347 training and 450 test images). The same small CNN
encoder with an MLP projection head is trained SimCLR-style from the same seed, on the same
augmented views in the same order, once with NT-Xent (:class:`~adaptcl.plugins.InfoNCELoss`,
tau = 0.1) and once with MACL (:class:`~adaptcl.plugins.MACLLoss`, the vision setting
tau0 = 0.1, alpha = 0.5, A0 = 0, reweighting on), both in Lightly's symmetric NT-Xent form
(2N - 2 negatives per anchor). Each view is a random affine warp, a brightness/contrast jitter,
Gaussian noise and pixel dropout.

The frozen encoder (the 128-d features before the projection head) is evaluated on the test
images: cosine kNN accuracy (k = 15, majority vote, the training images as the memory), also
with one augmented view of each test image as the query ("augmented queries", the invariance
the training bought); alignment and uniformity (Wang & Isola, :func:`adaptcl.plugins.alignment`
/ ``uniformity``, lower is better) on the L2-normalised features; the final temperature. Two
reference rows take no training step: raw pixels and the randomly initialised encoder (first
seed only). On clean 8x8 digits raw pixels already reach about 97% kNN, so the augmented-query
column, alignment and uniformity show what the training itself added.

Every (method, seed) is a cell of the :class:`~adaptcl.recipes.template.recipe.Recipe` template,
stored and reused while its identity (settings, data fingerprint, code) matches; several
``--seeds`` give mean ± std and MACL - NT-Xent paired over seeds with a 95% t-interval.

Usage::

    adaptcl demo --output-dir results/demo

    from adaptcl.recipes.demo import DemoConfig, DemoRecipe
    result = DemoRecipe(DemoConfig(epochs=30, output_dir="results/demo")).run()
    result["summary"]["knn_accuracy"]["digits"]["methods"]["macl"]["mean"]  # kNN accuracy, %

Outputs in ``output_dir``: ``results.json`` / ``results.md`` (the table: a row per method, a
column per metric) and ``demo_training.png`` (temperature, alignment A and the InfoNCE value
over the training steps of both losses).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaptcl.recipes.demo_data import (
    NUM_CLASSES,
    digits_fingerprint,
    load_digits_split,
    split_and_views,
)
from adaptcl.recipes.demo_model import build_model, embed, evaluate, train
from adaptcl.recipes.template.config import validate_config
from adaptcl.recipes.template.loggers import metric_logger
from adaptcl.recipes.template.recipe import Recipe
from adaptcl.recipes.template.store import Cell, GridRun
from adaptcl.recipes.template.torch_env import resolve_device

if TYPE_CHECKING:
    from torch import nn

EXAMPLE = """adaptcl demo --output-dir results/demo
adaptcl demo --epochs 5 --seeds 0 1 2 --logger tensorboard --output-dir /tmp/demo"""
LOSSES = ("infonce", "macl")
REFERENCES = ("raw_pixels", "random_encoder")  # no training step, first seed only
CODE = ("adaptcl.recipes.demo", "adaptcl.recipes.demo_data", "adaptcl.recipes.demo_model",
        "adaptcl.plugins")


@dataclass
class DemoConfig:
    """Configuration of the ``demo`` recipe (see the module docstring).

    Example:
        >>> config = DemoConfig(epochs=2, output_dir="/tmp/demo", progress=False)
    """

    epochs: int = 30
    batch_size: int = 256
    seeds: list[int] = field(default_factory=lambda: [0])
    output_dir: str = "results/demo"
    lr: float = 2e-3
    weight_decay: float = 1e-5
    temperature: float = 0.1  # tau (NT-Xent) and tau0 (MACL)
    macl_alpha: float = 0.5
    macl_a0: float = 0.0
    test_fraction: float = 0.25
    knn_k: int = 15
    width: int = 16  # channels of the first conv layer
    feature_dim: int = 128  # encoder output, the representation that is evaluated
    projection_dim: int = 64
    # torch intra-op threads. The model is tiny (about 0.3 GFLOP per step), so one thread beats
    # two: OpenMP's per-op synchronisation costs more than it saves, badly so on a busy machine.
    threads: int = 1
    device: str = "auto"
    precision: str = "32"
    logger: str = "none"
    progress: bool = True

    def __post_init__(self) -> None:
        whole = ("epochs", "batch_size", "knn_k", "width", "feature_dim", "projection_dim",
                 "threads")
        for name in whole:
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"{name} must be an int, got {getattr(self, name)!r}")
        validate_config(self, positive=(*whole, "lr", "temperature"), non_empty=("seeds",))
        if self.batch_size < 2:
            raise ValueError("batch_size must be >= 2: contrastive losses need negatives")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {self.test_fraction}")


def build_losses(config: DemoConfig) -> dict[str, tuple[str, nn.Module]]:
    """key -> (table name, loss module) of the two losses compared."""
    from adaptcl.plugins import InfoNCELoss, MACLLoss

    return {
        "infonce": (f"NT-Xent (tau={config.temperature:g})", InfoNCELoss(config.temperature)),
        "macl": (f"MACL (tau0={config.temperature:g}, alpha={config.macl_alpha:g}, "
                 f"A0={config.macl_a0:g})",
                 MACLLoss(config.temperature, config.macl_alpha, config.macl_a0, reweight=True)),
    }


class DemoRecipe(Recipe):
    """``adaptcl demo``: NT-Xent and MACL per seed, two untrained references, one table."""

    name, config_class, code, example = "demo", DemoConfig, CODE, EXAMPLE
    metrics = ("knn_accuracy", "alignment", "uniformity", "final_temperature",
               "knn_accuracy_augmented")
    frameworks = ("scikit-learn",)
    common = {"data_root": False}
    helps = {"epochs": "training epochs per loss", "batch_size": "pairs per step",
             "lr": "Adam learning rate", "temperature": "tau (NT-Xent) and tau0 (MACL)"}
    plot_file = "demo_training.png"
    plot_layout = {"ncols": 3, "figsize": (13, 3.6), "title": "adaptcl demo: NT-Xent vs MACL on "
                   "sklearn digits (same seed, same views)"}

    def prepare(self) -> None:
        cfg = self.config
        cfg.device = resolve_device(cfg.device)
        self.fingerprints = {"digits": digits_fingerprint()}
        self.losses = build_losses(cfg)
        x_train, _, x_test, _ = load_digits_split(cfg.test_fraction, cfg.seeds[0])
        self.sizes = (int(x_train.shape[0]), int(x_test.shape[0]))

    def methods(self) -> list[str]:
        return [*REFERENCES, *LOSSES]

    def cells(self) -> list[Cell]:
        seeds = self.config.seeds
        return ([Cell("digits", m, seeds[0]) for m in REFERENCES]
                + [Cell("digits", m, s) for s in seeds for m in LOSSES])

    def trains(self, cell: Cell) -> bool:
        return cell.method in LOSSES

    def compute(self, cell: Cell) -> dict[str, Any]:
        cfg = self.config
        data, views = split_and_views(cfg.test_fraction, cell.seed)
        if cell.method == "raw_pixels":
            return {"metrics": evaluate(lambda x: x.flatten(1), data, views, cfg.knn_k),
                    "optimisation_steps": 0, "train_seconds": 0.0}
        model = build_model(cfg, cell.seed)
        if cell.method == "random_encoder":
            return {"metrics": evaluate(lambda x: embed(model.encoder, x), data, views,
                                        cfg.knn_k), "optimisation_steps": 0, "train_seconds": 0.0}
        log_dir = Path(cfg.output_dir) / "logs" / cell.method / f"seed{cell.seed}"
        start = time.perf_counter()
        with metric_logger(cfg.logger, log_dir) as logger:
            history = train(model, self.losses[cell.method][1], data[0], cfg, cell.seed, logger,
                            desc=cell.label())
        seconds = time.perf_counter() - start
        metrics = evaluate(lambda x: embed(model.encoder, x), data, views, cfg.knn_k)
        return {"metrics": metrics | {"final_temperature": history["temperature"][-1]},
                "optimisation_steps": len(history["step"]), "losses": history["loss"],
                "history": history, "train_seconds": seconds}

    def report_spec(self) -> dict[str, Any]:
        cfg = self.config
        names = {"raw_pixels": "raw pixels (no training)",
                 "random_encoder": "random-init encoder (no training)",
                 **{key: name for key, (name, _) in self.losses.items()}}
        min_temperature = self.losses["macl"][1].min_temperature
        evaluation = {"features": f"encoder output ({cfg.feature_dim}-d, before the head)",
                      "knn": f"cosine, k={cfg.knn_k}, majority vote",
                      "alignment": "Wang & Isola, alpha=2, two augmented views of each test image",
                      "uniformity": "Wang & Isola, t=2, clean test images"}

        def details(grid: GridRun) -> dict[str, Any]:
            history = {c.method: r["history"] for c, r in grid.records.items()
                       if c.method in LOSSES and c.seed == cfg.seeds[0]}
            temps = history.get("macl", {}).get("temperature")
            return {
                "data": {"source": "sklearn.datasets.load_digits", "n_train": self.sizes[0],
                         "n_test": self.sizes[1], "classes": NUM_CLASSES, "image_shape": [8, 8]},
                "evaluation": evaluation, "chance_accuracy": 1.0 / NUM_CLASSES, "names": names,
                "history": history, "macl_min_temperature": min_temperature,
                "macl_temperature_range": [min(temps), max(temps)] if temps else None}

        header = (
            f"# adaptcl demo: sklearn digits ({self.sizes[0]} train / {self.sizes[1]} test), "
            f"{cfg.epochs} epochs, batch {cfg.batch_size}, seeds {cfg.seeds}\n\n"
            f"kNN: {evaluation['knn']} on the {evaluation['features']}, in % (chance is "
            f"{100 / NUM_CLASSES:.0f}%); alignment and uniformity: lower is better. Mean ± "
            "population std over seeds (the rows without training: first seed only); the last "
            "column is each row's kNN accuracy minus NT-Xent's, paired over seeds with a 95% "
            f"t-interval. MACL's temperature floor is {min_temperature:g}.\n\n")
        percent = ("knn_accuracy", "knn_accuracy_augmented")
        return {"baseline": "infonce", "header": header, "labels": names, "table_rows": "methods",
                "scale": dict.fromkeys(percent, 100.0),
                "digits": dict.fromkeys(percent, 1) | {"alignment": 3, "uniformity": 3,
                                                       "final_temperature": 4},
                "metric_labels": {"knn_accuracy": "kNN acc", "final_temperature":
                                  "final temperature", "knn_accuracy_augmented":
                                  "kNN acc, augmented queries"},
                "details": details, "drop": ("history", "losses")}

    def draw(self, grid: GridRun, axes: list[Any]) -> None:
        """Temperature, alignment magnitude A and InfoNCE over steps for every loss, first seed."""
        panels = (("temperature", "temperature tau"),
                  ("alignment", "alignment magnitude A (mean positive cosine)"),
                  ("plain_loss", "InfoNCE value (unweighted)"))
        for ax, (key, title) in zip(axes, panels, strict=True):
            for cell, record in grid.records.items():
                if cell.method in LOSSES and cell.seed == self.config.seeds[0]:
                    hist = record["history"]
                    ax.plot(hist["step"], hist[key], label=self.losses[cell.method][0],
                            linewidth=1.4)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("training step")
            ax.grid(alpha=0.3)
        floor = self.losses["macl"][1].min_temperature
        axes[0].axhline(floor, color="grey", linestyle=":", linewidth=1,
                        label=f"MACL floor {floor:g}")


RECIPE = DemoRecipe
