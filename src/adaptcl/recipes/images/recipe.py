"""``adaptcl images``: self-supervised pre-training on images via Lightly, kNN and linear probe.

SimCLR, MoCo v2, SimSiam, Barlow Twins or ASCL-MoCo with one or more losses, trained by
Lightning; a row per data set, a column per loss. The protocol, presets (MACL App. B.3) and
outputs are on the docs page ``docs/recipes/images.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from adaptcl.io import resolve_data_root
from adaptcl.recipes.common.cifar_settings import apply_limits
from adaptcl.recipes.common.devices import devices_identity
from adaptcl.recipes.common.gradient_cache import caching_identity
from adaptcl.recipes.common.schedule import check_period, period_in_steps
from adaptcl.recipes.common.step_cost import step_note
from adaptcl.recipes.engine import Cell, Figure, GridRun, Recipe, ReportSpec, note
from adaptcl.recipes.engine.plots import explain_empty
from adaptcl.recipes.engine.sweep import Point
from adaptcl.recipes.engine.torch_env import check_lightning_precision
from adaptcl.recipes.images.config import PRESETS, ImagesConfig

EXAMPLE = """adaptcl images --data-root ../shared/data --losses infonce macl
adaptcl images --losses infonce macl --method simclr moco --seeds 0 1 2
adaptcl images --data-root ~/data/cifar10 --preset paper --device cuda --devices 4 \\
    --strategy ddp --precision bf16-mixed --logger tensorboard"""


class ImagesRecipe(Recipe):
    """``adaptcl images``: every (loss, point, seed) pre-trained and scored on one data set."""

    name, config_class, presets, example = "images", ImagesConfig, PRESETS, EXAMPLE
    description = ("SimCLR/MoCo/SimSiam/Barlow Twins via Lightly on CIFAR-10 or a folder: "
                   "kNN + linear probe")
    axes = ("dataset", "loss")
    code = ("adaptcl.recipes.images", "adaptcl.evaluation.images", "adaptcl.adapters.lightly",
            "adaptcl.adapters.lightning", "adaptcl.plugins")
    frameworks = ("lightly", "pytorch-lightning", "torchvision")
    figure = Figure("images_temperature.png", ncols=3, figsize=(15, 4))

    def prepare(self, configs: Mapping[Point, ImagesConfig]) -> None:
        """The images of every point (each set loaded once), the limits as applied to them
        (:func:`~adaptcl.recipes.common.cifar_settings.apply_limits`), that its batch fits them,
        the module's settings (each checked), their fingerprints. Nothing is written."""
        from adaptcl.recipes.images.data import check_batch, load_splits
        from adaptcl.recipes.images.train import module_settings

        self.data_root = resolve_data_root(self.config.data_root)
        self._splits: dict[tuple[tuple[str, Any], ...], Any] = {}
        notes: dict[str, None] = {}  # each said once, however many points it concerns
        for config in configs.values():
            check_lightning_precision(config.device, config.precision)
            key = config.data_settings()
            if key not in self._splits:
                self._splits[key] = load_splits(self.data_root, config)
            splits = self._splits[key]
            sizes = {"train_limit": len(splits.train), "test_limit": len(splits.test)}
            notes[apply_limits(config, sizes, splits.source) or ""] = None
            self._splits[config.data_settings()] = splits  # under the limits as applied too
            check_batch(splits, config)
            steps = self.steps_per_epoch(config)
            check_period(config, steps, splits.name)
            module_settings(config, splits.num_classes, steps)
        self.fingerprints = {self.data_label(c): self.splits_of(c).fingerprint
                             for c in configs.values()}
        for message in filter(None, notes):
            note(message)

    def splits_of(self, config: ImagesConfig) -> Any:
        """The images of ``config`` (loaded by :meth:`prepare`)."""
        return self._splits[config.data_settings()]

    def data_label(self, config: ImagesConfig) -> str:
        """The data's name, with the data settings where ``config``'s differ from the run's."""
        moved = [f"{k}={v}" for (k, v), (_, first) in zip(
            config.data_settings(), self.config.data_settings(), strict=True) if v != first]
        return ", ".join([self.splits_of(self.config).name, *moved])

    def rows(self) -> list[str]:
        return [self.splits_of(self.config).name]

    def cells(self) -> list[Cell]:
        """Seed by seed: a seed's paired differences are there as soon as its losses are."""
        return [self.cell(row, loss, seed, point) for point in self.sweep.points()
                for seed in self.seeds() for row in self.rows() for loss in self.methods()]

    def steps_per_epoch(self, config: ImagesConfig) -> int:
        """The optimisation steps of one epoch (full batches, as the training loader takes)."""
        return len(self.splits_of(config).train) // config.batch_size

    def identity(self, cell: Cell, config: ImagesConfig) -> dict[str, Any]:
        """The settings (a schedule's period in steps; the mini-batch of cached steps, whose
        BatchNorm statistics are the chunk's), the fingerprint of the cell's images, the code,
        several devices."""
        out = (super().identity(cell, config) | {"data": self.splits_of(config).fingerprint}
               | devices_identity(config.devices, config.strategy))
        if cell.loss == "temperature_schedule":
            out["settings"] = period_in_steps(out["settings"], self.steps_per_epoch(config))
        out["settings"] = out["settings"] | caching_identity(config)
        return out

    def compute(self, cell: Cell, config: ImagesConfig) -> dict[str, Any] | None:
        from adaptcl.recipes.images.train import train_and_score

        return train_and_score(config, self.splits_of(config), cell,
                               self.checkpoint_dir(cell, config),
                               self.layout.cell_folder("logs", cell))

    def report_spec(self) -> ReportSpec:
        cfg, splits = self.config, self.splits_of(self.config)
        points = [self.sweep.config_at(p) for p in self.sweep.points()]
        linear = any(c.linear_epochs for c in points)
        header = (f"# images: {cfg.method} on {splits.name}, preset {self.preset}\n\n"
                  f"{splits.source}: {len(splits.train)} train / {len(splits.test)} test images; "
                  f"{cfg.backbone} width {cfg.width}, {cfg.epochs} epochs, batch "
                  f"{cfg.batch_size}, {cfg.optimizer} lr {cfg.lr}, precision {cfg.precision}; "
                  f"kNN k={cfg.knn_k} t={cfg.knn_t}; linear probe {cfg.linear_epochs} epochs; "
                  "settings in results.json. Top-1 (%), mean ± population std over seeds; "
                  f"differences against {cfg.losses[0]} paired over seeds with a 95% "
                  "t-interval.\n\n")
        data = {self.data_label(c): self.splits_of(c).describe() for c in points}
        return ReportSpec(metrics=("knn_top1", "linear_top1") if linear else ("knn_top1",),
                          baseline=cfg.losses[0],
                          header=lambda grid: (header + epoch_times(grid.records)
                                               + step_note(grid.records)),
                          details=lambda grid: {"data": data})

    def draw(self, grid: GridRun, axes: list[Any]) -> None:
        """Temperature and alignment per step, online kNN per epoch, every cell."""
        cfg = self.config
        for cell, r in grid.records.items():
            label = "/".join(cell.parts()[1:])
            steps = [h["step"] for h in r["history"]]
            for ax, key in zip(axes[:2], ("temperature", "alignment"), strict=True):
                values = [h.get(key, math.nan) for h in r["history"]]
                if any(not math.isnan(v) for v in values):
                    ax.plot(steps, values, label=label, linewidth=1)
            if r["online_knn"]:
                axes[2].plot([h["epoch"] + 1 for h in r["online_knn"]],
                             [100 * h["knn_top1"] for h in r["online_knn"]], marker="o",
                             label=label)
        axes[0].set(title="temperature (adaptive: MACL tau_a, AMCL mean tau+)", xlabel="step")
        axes[1].set(title="alignment A (mean positive cosine)", xlabel="step")
        axes[2].set(title="online kNN top-1 (%)", xlabel="epoch")
        losses = ", ".join(cfg.losses)
        explain_empty(axes[0], f"no loss of {losses} reports a temperature")
        explain_empty(axes[1], f"no loss of {losses} reports the alignment")
        explain_empty(axes[2], "online kNN monitor off (--knn-every 0)" if not cfg.knn_every
                      else f"no kNN point: --epochs {cfg.epochs} < --knn-every {cfg.knn_every}")
        methods = ", ".join(dict.fromkeys(self.config_of(c).method for c in grid.records))
        axes[0].figure.suptitle(f"{methods} on {self.rows()[0]} (preset {self.preset})")


def epoch_times(records: dict[Cell, dict[str, Any]]) -> str:
    """The markdown note of the seconds per training epoch of each column (the loss, and the
    swept settings), mean over its epochs and seeds, with the loader workers used; records
    written before epochs were timed are left out."""
    seconds: dict[str, list[float]] = {}
    workers: set[int] = set()
    for cell, record in records.items():
        if record.get("epoch_seconds"):
            seconds.setdefault("/".join(cell.parts()[1:-1]), []).extend(record["epoch_seconds"])
            workers.add(record.get("loader_workers", 0))
    if not seconds:
        return ""
    times = ", ".join(f"{name} {sum(v) / len(v):.3g}" for name, v in seconds.items())
    return (f"Seconds per training epoch (mean over epochs and seeds): {times}; DataLoader "
            f"workers: {', '.join(map(str, sorted(workers)))}.\n\n")


RECIPE = ImagesRecipe
