"""The settings of ``adaptcl images``; the defaults are the ``cpu`` preset (minutes on a CPU)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adaptcl.adapters.lightning.methods import BACKBONES, METHOD_LOSSES, METHODS, check_method_loss
from adaptcl.recipes.common import gradient_cache, macl_settings, schedule, tiling
from adaptcl.recipes.common.cifar_settings import limit_setting, npz_variant_setting
from adaptcl.recipes.common.schedule import resolve_schedule
from adaptcl.recipes.engine import options
from adaptcl.recipes.engine.settings import (
    at_least,
    check_settings,
    non_negative,
    positive,
    setting,
)

#: every loss some method accepts (which one applies is checked against ``method``)
ALL_LOSSES = tuple(dict.fromkeys(x for losses in METHOD_LOSSES.values() for x in losses))


#: the losses that read AMCL's settings and ASCL's (``ascl`` with SimCLR or MoCo, and the modes
#: of ``ascl-moco``, whose ``infonce`` is MoCo without neighbours): ``setting(losses=...)``
AMCL_LOSSES, ASCL_LOSSES = ("amcl",), ("ascl", "ahcl", "hard")

#: the settings that choose the images of a run (a sweep over one loads each value's images)
DATA_SETTINGS = ("source", "npz_variant", "train_limit", "test_limit", "download")

#: ``cpu``: the defaults (a narrow ResNet-18, the 4,000 exact-pixel CIFAR-10 training images);
#: ``paper``: MACL App. B.3 (the whole training set at full width, 200 epochs: a GPU job)
PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {},
    "paper": {"width": 1.0, "epochs": 200, "batch_size": 512, "lr": 2e-3, "train_limit": None,
              "test_limit": None, "npz_variant": "jpeg", "queue_size": 4096, "knn_every": 10},
}


@dataclass
@options.run_options("threads", "device", "devices", "strategy", "precision", "logger",
                     "progress", "plot")
class ImagesConfig:
    """Settings of an ``images`` run: one SSL method with one or more losses, kNN and a linear
    probe on the frozen backbone.

    ``temperature``, ``macl_temperature`` and ``a0`` left ``None`` take the method's defaults
    (MACL App. B.2.1): tau 0.1 (MoCo 0.2); MACL's tau0 the temperature (MoCo 0.15 unless a
    temperature is given); A0 0 (MoCo 0.2).

    Example:
        >>> ImagesConfig(method="moco").macl_temperature
        0.15
    """

    data_root: str | None = options.data_root("folder with cifar-10-batches-py, cifar10_*.npz "
                                              "(or cifar10/), or train/ and test/ class folders")
    output_dir: str = options.output_dir("results/images")
    method: str = setting("simclr", choices=METHODS, help="self-supervised method")
    losses: list[str] = options.losses(
        ["infonce", "macl"], ALL_LOSSES, what="losses (" + "; ".join(
            f"{m}: {' '.join(losses)}" for m, losses in METHOD_LOSSES.items()) + ")")
    seeds: list[int] = options.seeds([0])
    source: str = setting("auto", choices=("auto", "torchvision", "npz", "folder"),
                          sweep=False, help="where the images come from (auto: the first found)")
    npz_variant: str = npz_variant_setting()
    train_limit: int | None = limit_setting("training", 4000)
    test_limit: int | None = limit_setting("test", 1000)
    full_data: bool = setting(False, help="use every image available (no limits)")
    download: bool = setting(False, identity=False, help="download CIFAR-10 with torchvision "
                             "if no local data is found")
    input_size: int = setting(32, check=positive, help="image side the transforms produce")
    backbone: str = setting("resnet-18", choices=BACKBONES, help="Lightly's CIFAR ResNet")
    width: float = setting(0.125, check=positive, help="backbone width multiplier")
    hidden_dim: int = setting(512, check=positive, help="projection head hidden units")
    output_dim: int = setting(128, check=positive, help="projection head output")
    epochs: int = setting(15, check=positive, help="pre-training epochs")
    batch_size: int = setting(128, check=positive, help="images per step (per device)")
    mini_batch_size: int | None = gradient_cache.mini_batch_size(
        "BatchNorm normalises each chunk with its own statistics, so the numbers are those of "
        "steps over the chunks (part of a run's identity)")
    lr: float = setting(1e-3, check=positive, help="learning rate")
    optimizer: str = setting("adam", choices=("adam", "adamw", "sgd"), help="optimiser")
    weight_decay: float = setting(1e-6, check=non_negative, help="weight decay")
    temperature: float | None = setting(None, check=positive, help="tau (MACL: tau0; none: "
                                        "0.1, MoCo 0.2)")
    macl_temperature: float | None = setting(None, check=positive, losses=("macl",),
                                             help="MACL's tau0 (none: --temperature; MoCo "
                                             "0.15)")
    max_temperature: float = schedule.max_temperature()
    schedule_period: float | None = schedule.schedule_period()
    tile_size: str | int | None = tiling.tile_size()
    alpha: float = macl_settings.alpha()
    a0: float | None = macl_settings.a0(None, help="MACL's A0 (none: 0, MoCo 0.2)")
    num_heads: int = setting(2, check=positive, losses=AMCL_LOSSES, help="AMCL heads C")
    beta: float = setting(1e-3, check=non_negative, losses=AMCL_LOSSES,
                          help="AMCL regulariser weight")
    kappa: int = setting(1, check=at_least(1), losses=AMCL_LOSSES,
                         help="AMCL top-kappa negatives")
    negative_term: str = setting("softmax", choices=("topk", "softmax"), losses=AMCL_LOSSES,
                                 help="AMCL negative term (Eq. 7: hardest kappa or soft-max)")
    amcl_objective: str = setting("nt_xent", choices=("nt_xent", "infonce"), losses=AMCL_LOSSES,
                                  help="AMCL objective (Table 2.1 nt_xent, 2.4 infonce)")
    queue_size: int = setting(1024, check=positive, help="MoCo / ASCL-MoCo queue length")
    num_neighbors: int = setting(1, check=non_negative, losses=ASCL_LOSSES,
                                 help="ASCL K (0: InfoNCE)")
    sharpen_temperature: float = setting(0.05, check=positive, losses=ASCL_LOSSES,
                                         help="ASCL's sharpening tau")
    knn_k: int = setting(200, check=positive, help="kNN neighbours")
    knn_t: float = setting(0.1, check=positive, help="kNN temperature")
    knn_every: int = setting(5, check=non_negative, help="online kNN monitor every N epochs "
                             "(0: off)")
    linear_epochs: int = setting(100, check=non_negative, help="linear probe epochs (0: none)")
    linear_batch_size: int = setting(128, check=positive, help="linear probe batch")
    linear_lr: float = setting(0.02, check=positive, help="linear probe SGD learning rate")
    num_workers: int | None = setting(None, check=non_negative, identity=False, sweep=False,
                                      help="DataLoader worker processes (none: 0 on the CPU; "
                                      "on CUDA from the CPUs available, at most 16)")

    def __post_init__(self) -> None:
        check_settings(self)
        gradient_cache.check_mini_batch_fits(self)
        for loss in self.losses:
            check_method_loss(self.method, loss)
        if self.full_data:
            self.train_limit = self.test_limit = None
        moco, given = self.method == "moco", self.temperature
        if self.temperature is None:
            self.temperature = 0.2 if moco else 0.1
        if self.macl_temperature is None:  # MACL App. B.2.1: tau0 0.15 for MoCo v2
            self.macl_temperature = 0.15 if moco and given is None else self.temperature
        if self.a0 is None:
            self.a0 = 0.2 if moco else 0.0
        resolve_schedule(self)

    def data_settings(self) -> tuple[tuple[str, Any], ...]:
        """``((setting, value), ...)`` of the settings that choose the images."""
        return tuple((name, getattr(self, name)) for name in DATA_SETTINGS)
