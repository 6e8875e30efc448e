"""``adaptcl images``: self-supervised pre-training on images via Lightly, kNN and linear probe.

SimCLR, MoCo v2, SimSiam, Barlow Twins or ASCL-MoCo (:mod:`adaptcl.adapters.lightning.modules`; one cell in
:mod:`adaptcl.recipes.image_training`)
with one or more losses on CIFAR-10 or an image folder (:mod:`adaptcl.recipes.image_data`),
trained by Lightning's ``Trainer`` (device, precision, devices/strategy, logger), then the
frozen backbone scored by Lightly's weighted kNN and a linear probe
(:mod:`adaptcl.evaluation.images`). Each (loss, seed) is a cell of the run store; an
unfinished one resumes from its ``last.ckpt`` (weights, optimiser, loss statistics, MoCo/ASCL
queues, training time; not the data order of the interrupted epoch).

Presets (``--preset``): ``cpu`` (minutes: ResNet-18 at width 1/8, the 4,000 exact-pixel
training images, 15 epochs) and ``paper`` (MACL App. B.3, a GPU job). Options override them.
Outputs: ``images_<method>_<preset>.json`` / ``.md`` / ``_temperature.png``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptcl.adapters.lightning.methods import (
    BACKBONES,
    METHOD_LOSSES,
    METHODS,
    check_method_loss,
)
from adaptcl.io import resolve_data_root
from adaptcl.recipes.template.config import validate_config
from adaptcl.recipes.template.plots import explain_empty
from adaptcl.recipes.template.provenance import stable_hash
from adaptcl.recipes.template.recipe import Recipe
from adaptcl.recipes.template.store import Cell, GridRun, RunStore
from adaptcl.recipes.template.torch_env import resolve_device
from adaptcl.registry import canonical_loss_name

EXAMPLE = """adaptcl images --data-root ../shared/data --losses infonce macl
adaptcl images --data-root ~/data/cifar10 --preset paper --device cuda --devices 4 \\
    --strategy ddp --precision bf16-mixed --logger tensorboard"""

ALL_LOSSES = tuple(dict.fromkeys(x for losses in METHOD_LOSSES.values() for x in losses))
PRESETS: dict[str, dict[str, Any]] = {
    "cpu": dict(backbone="resnet-18", width=0.125, epochs=15, batch_size=128, lr=1e-3,
                optimizer="adam", weight_decay=1e-6, train_limit=4000, test_limit=1000,
                npz_variant="auto", hidden_dim=512, output_dim=128, queue_size=1024,
                linear_epochs=100, linear_batch_size=128, linear_lr=0.02, knn_every=5),
    "paper": dict(backbone="resnet-18", width=1.0, epochs=200, batch_size=512, lr=2e-3,
                  optimizer="adam", weight_decay=1e-6, train_limit=None, test_limit=None,
                  npz_variant="jpeg", hidden_dim=512, output_dim=128, queue_size=4096,
                  linear_epochs=100, linear_batch_size=128, linear_lr=0.02, knn_every=10),
}
CODE = ("adaptcl.recipes.images", "adaptcl.recipes.image_training", "adaptcl.evaluation.images",
        "adaptcl.adapters.lightly", "adaptcl.adapters.lightning.modules",
        "adaptcl.adapters.lightning.factory", "adaptcl.adapters.lightning.methods",
        "adaptcl.plugins")


@dataclass
class ImagesConfig:
    """Settings of an ``images`` run; ``None`` fields take the preset's value (:meth:`resolved`)."""

    data_root: str | None = None
    output_dir: str = "results/images"
    preset: str = "cpu"
    method: str = "simclr"
    losses: list[str] = field(default_factory=lambda: ["infonce", "macl"])
    seeds: list[int] = field(default_factory=lambda: [0])
    source: str = "auto"
    npz_variant: str | None = None
    train_limit: int | None = None
    test_limit: int | None = None
    full_data: bool = False
    download: bool = False
    input_size: int = 32
    backbone: str | None = None
    width: float | None = None
    hidden_dim: int | None = None
    output_dim: int | None = None
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    optimizer: str | None = None
    weight_decay: float | None = None
    temperature: float | None = None
    macl_temperature: float | None = None
    alpha: float = 0.5
    a0: float | None = None
    num_heads: int = 2
    beta: float = 1e-3
    kappa: int = 1
    negative_term: str = "softmax"
    amcl_objective: str = "nt_xent"
    queue_size: int | None = None
    num_neighbors: int = 1
    sharpen_temperature: float = 0.05
    knn_k: int = 200
    knn_t: float = 0.1
    knn_every: int | None = None
    linear_epochs: int | None = None
    linear_batch_size: int | None = None
    linear_lr: float | None = None
    num_workers: int = 0
    device: str = "auto"
    devices: int = 1
    strategy: str = "auto"
    precision: str = "32"
    logger: str = "none"
    threads: int | None = 1
    progress: bool = True

    def resolved(self) -> ImagesConfig:
        """A copy with the preset's values filled in and everything validated."""
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {self.preset!r}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        out = dataclasses.replace(self, losses=list(self.losses), seeds=list(self.seeds))
        for key, value in PRESETS[self.preset].items():
            if getattr(out, key) is None and not (self.full_data and key in ("train_limit",
                                                                             "test_limit")):
                setattr(out, key, value)
        if self.full_data:
            out.train_limit = out.test_limit = None
            out.npz_variant = self.npz_variant or "jpeg"
        if out.temperature is None:
            out.temperature = 0.2 if out.method == "moco" else 0.1
        if out.macl_temperature is None:  # MACL App. B.2.1: tau0 0.15 for MoCo v2
            out.macl_temperature = (0.15 if out.method == "moco" and self.temperature is None
                                    else out.temperature)
        if out.a0 is None:
            out.a0 = 0.2 if out.method == "moco" else 0.0
        out.losses = [canonical_loss_name(loss, allowed=ALL_LOSSES) for loss in out.losses]
        for loss in out.losses:
            check_method_loss(out.method, loss)
        validate_config(out, non_empty=("losses", "seeds"), choices={"backbone": BACKBONES},
                        positive=(
            "epochs", "batch_size", "hidden_dim", "output_dim", "linear_batch_size", "num_heads",
            "queue_size", "knn_k", "input_size", "devices", "lr", "temperature",
            "macl_temperature", "knn_t", "linear_lr", "width", "sharpen_temperature"))
        if out.linear_epochs < 0 or out.knn_every < 0 or out.num_workers < 0:
            raise ValueError("linear_epochs, knn_every and num_workers must be >= 0")
        return out


# ----------------------------------------------------------------------------- the recipe


class ImagesRecipe(Recipe):
    """``adaptcl images``: every (loss, seed) of one method pre-trained and scored."""

    name, config_class, code = "images", ImagesConfig, CODE
    metrics = ("knn_top1", "linear_top1")
    frameworks = ("lightly", "pytorch-lightning", "torchvision")
    example = EXAMPLE
    common = {"devices": True, "data_root_help": "folder with cifar-10-batches-py, "
              "cifar10_*.npz (or cifar10/), or train/ and test/ class folders"}
    choices = {"preset": tuple(PRESETS), "method": METHODS, "losses": ALL_LOSSES,
               "backbone": BACKBONES,
               "source": ("auto", "torchvision", "npz", "folder"),
               "npz_variant": ("auto", "lossless", "jpeg"), "optimizer": ("adam", "adamw", "sgd"),
               "negative_term": ("topk", "softmax"), "amcl_objective": ("nt_xent", "infonce")}
    helps = {"preset": "cpu: narrow ResNet-18, 4k images, minutes; paper: MACL App. B.3 (a GPU "
             "job); options override it", "losses": "losses (" + "; ".join(
                 f"{m}: {' '.join(losses)}" for m, losses in METHOD_LOSSES.items()) + ")",
             "full_data": "use every image available", "download": "download CIFAR-10 with torchvision if no local data is "
             "found", "backbone": "resnet-9/18/34/50 (Lightly's CIFAR ResNet; none: the "
             "preset's)", "temperature": "tau (MACL: tau0; none: 0.1, MoCo 0.2)",
             "a0": "MACL A0 (none: 0, MoCo 0.2)", "num_heads": "AMCL heads C",
             "beta": "AMCL regulariser weight", "kappa": "AMCL top-kappa negatives",
             "negative_term": "AMCL negative term (Eq. 7: hardest kappa or soft-max)",
             "amcl_objective": "AMCL objective (Table 2.1 nt_xent, 2.4 infonce)",
             "num_neighbors": "ASCL K",
             "knn_every": "online kNN monitor every N epochs (0: off; none: the preset's)"}

    def prepare(self) -> None:
        """The preset's values filled in and checked; the images, their fingerprint; the device."""
        from adaptcl.recipes.image_data import load_image_splits

        cfg = self.config = self.config.resolved()
        self.data_root = resolve_data_root(cfg.data_root)
        cfg.device = resolve_device(cfg.device)
        self.splits = load_image_splits(self.data_root, cfg.source, cfg.npz_variant,
                                        cfg.train_limit, cfg.test_limit, seed=0,
                                        download=cfg.download)
        self.fingerprints[cfg.method] = self.splits.fingerprint()
        per_rank = len(self.splits.train) // cfg.devices  # DistributedSampler's share, drop_last
        if per_rank < cfg.batch_size:
            ranks = f", {per_rank} per device over {cfg.devices}" if cfg.devices > 1 else ""
            raise ValueError(f"the training set ({len(self.splits.train)} images{ranks}) is "
                             f"smaller than one batch ({cfg.batch_size}); lower --batch-size")
        self.metrics = type(self).metrics[:2 if cfg.linear_epochs else 1]
        self.stem = f"images_{cfg.method}_{cfg.preset}"
        self.plot_file = f"{self.stem}_temperature.png"
        self.plot_layout = {"title": f"{cfg.method} ({cfg.preset})", "ncols": 3,
                            "figsize": (15, 4)}

    def cells(self) -> list[Cell]:
        """Seed by seed, every loss (a row of the table is complete after each seed)."""
        cfg = self.config
        return [Cell(cfg.method, loss, seed) for seed in cfg.seeds for loss in cfg.losses]

    def compute(self, cell: Cell) -> dict[str, Any] | None:
        out = Path(self.config.output_dir)
        run_dir = RunStore(out).path(cell).with_name(
            f"seed{cell.seed}-{stable_hash(self.identity(cell), 10)}")
        from adaptcl.recipes.image_training import run_one

        return run_one(self.config, self.splits, cell, run_dir,
                       out / "logs" / cell.dataset / cell.method / f"seed{cell.seed}")

    def report_spec(self) -> dict[str, Any]:
        cfg, splits = self.config, self.splits
        header = (f"# images: {cfg.method}, preset {cfg.preset}\n\n{splits.source}: "
                  f"{len(splits.train)} train / {len(splits.test)} test images; {cfg.backbone} "
                  f"width {cfg.width}, {cfg.epochs} epochs, batch {cfg.batch_size}, "
                  f"{cfg.optimizer} lr {cfg.lr}, precision {cfg.precision}; kNN k={cfg.knn_k} "
                  f"t={cfg.knn_t}; linear probe {cfg.linear_epochs} epochs. Top-1 (%), mean ± "
                  f"population std over seeds; differences against {cfg.losses[0]} paired over "
                  "seeds with a 95% t-interval.\n\n")
        return {"header": header, "stem": self.stem,
                "dataset_labels": {cfg.method: f"{cfg.method} ({splits.source})"},
                "data_fingerprint": self.fingerprints[cfg.method],
                "details": lambda grid: {"data": splits.describe()}}

    def draw(self, grid: GridRun, axes) -> None:
        """Temperature and alignment per step, online kNN per epoch, every (loss, seed)."""
        cfg = self.config
        for r in grid.records.values():
            label = f"{r['loss']} (seed {r['seed']})"
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


RECIPE = ImagesRecipe
