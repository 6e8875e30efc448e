"""The settings of ``adaptcl clip``; the defaults are the ``cpu`` preset (minutes on a CPU)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from adaptcl.adapters.open_clip.names import LOSS_NAMES
from adaptcl.recipes.common import gradient_cache, macl_settings, tiling
from adaptcl.recipes.common.cifar import CIFAR10_TEMPLATES
from adaptcl.recipes.common.cifar_settings import limit_setting, npz_variant_setting
from adaptcl.recipes.engine import options
from adaptcl.recipes.engine.settings import check_settings, non_negative, positive, setting

#: the losses of the open_clip adapter a CLIP is trained with here (not its
#: ``temperature_schedule``, whose schedule this recipe does not set)
CLIP_LOSSES = tuple(name for name in LOSS_NAMES if name != "temperature_schedule")

#: ``pairs``: CLIP's targets, each image's own caption (every other caption of the batch is a
#: negative, the same class's included); ``labels``: every caption of the image's class is a
#: positive (the multi-positive targets of open_clip#1027)
TARGETS = ("pairs", "labels")

#: the settings that choose the images of a run (a sweep over one loads each value's images)
DATA_SETTINGS = ("npz_variant", "train_limit", "test_limit")

#: ``cpu``: the defaults (the 4,000 exact-pixel training images, a 2-layer ViT with 8x8
#: patches and a 2-layer text transformer of width 64: minutes on one CPU thread);
#: ``paper``: a larger CLIP on the 15,000 (JPEG-decoded) training and 10,000 test images,
#: a ViT of 4x4 patches, width 256 and 6 layers, a text transformer 6 x 256, batch 512: a GPU job
PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {},
    "paper": {"train_limit": None, "test_limit": None, "npz_variant": "jpeg", "epochs": 100,
              "batch_size": 512, "patch_size": 4, "vision_width": 256, "vision_layers": 6,
              "text_width": 256, "text_layers": 6, "embed_dim": 256, "lr": 5e-4,
              "warmup_steps": 500, "retrieval_limit": 5000},
}


@dataclass
@options.run_options("threads", "device", "precision", "logger", "progress")
class ClipConfig:
    """Settings of a ``clip`` run: CLIP trained from scratch on CIFAR-10 images and prompt
    captions with one or more losses and targets, scored by zero-shot top-1 and R@1.

    The columns of the table are the losses with CLIP's targets (``pairs``) and, for
    ``--targets labels``, each loss again with multi-positive targets (``infonce+labels``).

    Example:
        >>> ClipConfig(losses=["infonce"], targets=["pairs", "labels"]).columns()
        ['infonce', 'infonce+labels']
    """

    data_root: str | None = options.data_root("folder with the CIFAR-10 cifar10_*.npz copies "
                                              "(or cifar10/)")
    output_dir: str = options.output_dir("results/clip")
    losses: list[str] = options.losses(["infonce", "macl", "dystress"], CLIP_LOSSES)
    targets: list[str] = setting(
        factory=lambda: ["pairs", "labels"], choices=TARGETS, identity=False, sweep=False,
        help="pairs: each image's own caption is its positive (CLIP); labels: every caption "
             "of its class is (multi-positive, open_clip#1027); a column per loss and target")
    seeds: list[int] = options.seeds([0])
    npz_variant: str = npz_variant_setting()
    train_limit: int | None = limit_setting("training", 4000)
    test_limit: int | None = limit_setting("test", 1000, " for zero-shot top-1")
    retrieval_limit: int = setting(1000, check=positive, help="the first N test images (and "
                                   "their captions) for image->text and text->image R@1")
    templates: int = setting(18, check=positive, help="how many of CLIP's 18 CIFAR-10 prompt "
                             "templates make the captions and the zero-shot classifier")
    caption_seed: int = setting(0, check=non_negative, help="seed of the template drawn for "
                                "each training and test image (the same captions for every "
                                "cell; the training seed orders the batches)")
    embed_dim: int = setting(64, check=positive, help="joint embedding dimension")
    patch_size: int = setting(8, check=positive, help="ViT patch side (a divisor of 32)")
    vision_width: int = setting(64, check=positive, help="ViT width")
    vision_layers: int = setting(2, check=positive, help="ViT layers")
    text_width: int = setting(64, check=positive, help="text transformer width")
    text_layers: int = setting(2, check=positive, help="text transformer layers")
    head_width: int = setting(32, check=positive, help="attention head width of both towers")
    context_length: int = setting(20, check=positive, help="text tokens per caption")
    init_temperature: float = setting(0.07, check=positive, help="initial temperature "
                                      "(CLIP: 0.07, logit_scale = ln(1/0.07)); learned, clamped "
                                      "to logit_scale in [0, ln 100] after each step")
    epochs: int = setting(3, check=positive, help="training epochs")
    batch_size: int = setting(128, check=positive, help="image-caption pairs per step")
    mini_batch_size: int | None = gradient_cache.mini_batch_size(
        "the towers have LayerNorm only, so the numbers are those without caching (to float "
        "rounding; not part of a run's identity)")
    lr: float = setting(1e-3, check=positive, help="AdamW learning rate (cosine schedule)")
    warmup_steps: int = setting(20, check=non_negative, help="linear learning-rate warm-up")
    weight_decay: float = setting(0.1, check=non_negative, help="AdamW weight decay (not on "
                                  "gains, biases and logit_scale, as open_clip)")
    alpha: float = macl_settings.alpha()
    a0: float = macl_settings.a0()
    min_temperature: float = setting(0.05, check=positive, losses=("dystress",),
                                     help="DySTreSS's lowest pair "
                                     "temperature (it ignores the learned logit_scale)")
    max_temperature: float = setting(0.1, check=positive, losses=("dystress",),
                                     help="DySTreSS's highest pair "
                                     "temperature")
    tile_size: str | int | None = tiling.tile_size()
    num_workers: int = setting(0, check=non_negative, identity=False, sweep=False,
                               help="DataLoader worker processes")

    def __post_init__(self) -> None:
        check_settings(self)
        gradient_cache.check_mini_batch_fits(self)
        self.targets = list(dict.fromkeys(self.targets))
        if not self.targets:
            raise ValueError("targets must not be empty")
        if self.min_temperature >= self.max_temperature:
            raise ValueError(f"min_temperature ({self.min_temperature}) must be below "
                             f"max_temperature ({self.max_temperature})")
        if self.templates > len(CIFAR10_TEMPLATES):
            raise ValueError(f"templates must be at most {len(CIFAR10_TEMPLATES)} (CLIP's "
                             f"CIFAR-10 prompts), got {self.templates}")
        if 32 % self.patch_size:
            raise ValueError(f"patch_size must divide the 32-pixel CIFAR-10 images, got "
                             f"{self.patch_size}")
        for tower in ("vision", "text"):
            width = getattr(self, f"{tower}_width")
            if width % self.head_width:
                raise ValueError(f"{tower}_width ({width}) must be a multiple of head_width "
                                 f"({self.head_width})")
        if math.log(1 / self.init_temperature) > math.log(100):
            raise ValueError("init_temperature must be at least 0.01 (logit_scale is clamped "
                             f"to ln 100), got {self.init_temperature}")

    def columns(self) -> list[str]:
        """The table's columns: each loss with each target (``loss`` or ``loss+labels``)."""
        return [column_name(loss, t) for t in self.targets for loss in self.losses]

    def data_settings(self) -> tuple[tuple[str, Any], ...]:
        """``((setting, value), ...)`` of the settings that choose the images."""
        return tuple((name, getattr(self, name)) for name in DATA_SETTINGS)


def column_name(loss: str, targets: str) -> str:
    """``infonce`` (CLIP's pairs) or ``infonce+labels``."""
    return loss if targets == "pairs" else f"{loss}+{targets}"


def parse_column(column: str) -> tuple[str, str]:
    """``(loss, targets)`` of a column name."""
    loss, _, targets = column.partition("+")
    return loss, targets or "pairs"
