"""The settings of ``adaptcl moleculenet`` (the defaults: the CPU preset). ``identity="pretrain"``
settings determine the pre-trained encoder, ``"finetune"`` a fine-tuned cell, ``True`` both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adaptcl.recipes.common import macl_settings, tiling
from adaptcl.recipes.common.devices import check_devices
from adaptcl.recipes.engine import options
from adaptcl.recipes.engine.settings import (
    at_least,
    check_settings,
    fraction,
    non_negative,
    open_fraction,
    positive,
    seed_range,
    setting,
)
from adaptcl.registry import canonical_loss_name, loss_help

DATASETS = ("bbbp", "tox21", "toxcast", "sider", "clintox", "muv", "hiv", "bace")
AUGMENTATIONS = ("none", "dnodes", "pedges", "subgraph", "random2", "random3")
#: the pre-training corpus under the data root when ``--pretrain-smiles`` is not given
DEFAULT_PRETRAIN_SMILES = ("zinc", "moses", "test.csv.gz")
#: the fine-tuning of a fresh encoder (no pre-training): the column beside the losses
NO_PRETRAINING = "none"


def _losses() -> tuple[tuple[str, ...], dict[str, str]]:
    """The losses GraphCL builds and its paper's name for its own (``graphcl`` is DCL),
    without importing torch-geometric."""
    from adaptcl.adapters.graphcl.names import LOSS_ALIASES, LOSS_NAMES

    return LOSS_NAMES, LOSS_ALIASES


def _init(name: str) -> str:
    """``none`` or the canonical name of a pre-training loss."""
    if isinstance(name, str) and name.strip().lower() == NO_PRETRAINING:
        return NO_PRETRAINING
    try:
        return canonical_loss_name(name, allowed=_losses()[0], aliases=_losses()[1])
    except ValueError:
        raise ValueError(f"unknown init {name!r}; choose from {NO_PRETRAINING}, "
                         f"{loss_help(*_losses())}") from None


#: GraphCL / MACL App. B.5, a GPU job: 8 sets, seeds 0-9, the whole corpus, 100 + 100 epochs,
#: a 5 x 300 GIN
PAPER: dict[str, Any] = {"datasets": list(DATASETS), "seeds": list(range(10)),
                         "pretrain_molecules": None, "pretrain_epochs": 100,
                         "finetune_epochs": 100, "emb_dim": 300}
#: the presets: ``cpu`` (the defaults: about 15 minutes on one CPU thread) and ``paper``
PRESETS: dict[str, dict[str, Any]] = {"cpu": {}, "paper": PAPER}

_PRETRAIN: dict[str, Any] = {"identity": "pretrain"}
_FINETUNE: dict[str, Any] = {"identity": "finetune"}
_PATH: dict[str, Any] = {"identity": False, "sweep": False}


@dataclass
@options.run_options()
class MoleculeNetConfig:
    """Settings of a ``moleculenet`` run: GraphCL pre-training on SMILES, fine-tuning on
    MoleculeNet scaffold splits, test ROC-AUC."""

    datasets: list[str] = setting(factory=lambda: ["bbbp", "bace", "clintox", "sider", "tox21"],
                                  axis="dataset", choices=DATASETS, help="MoleculeNet sets")
    inits: list[str] = setting(factory=lambda: [NO_PRETRAINING, "graphcl", "macl"], axis="init",
                               convert=_init, help="the encoder fine-tuned: none (no "
                               "pre-training) or pre-trained with " + loss_help(*_losses()))
    seeds: list[int] = options.seeds([0, 1, 2])
    data_root: str | None = options.data_root("folder holding moleculenet/ and zinc/")
    output_dir: str = options.output_dir("results/moleculenet")
    cache_dir: str | None = options.work_folder("featurised datasets (none: "
                                                "<output-dir>/cache)")
    pretrain_smiles: str | None = setting(None, **_PATH, help="SMILES file for pre-training "
                                          "(none: <data-root>/zinc/moses/test.csv.gz)")
    pretrain_molecules: int | None = setting(6000, check=positive, **_PRETRAIN,
                                             help="use the first N SMILES (none: all)")
    pretrain_epochs: int = setting(3, check=positive, **_PRETRAIN, help="pre-training epochs")
    pretrain_batch_size: int = setting(256, check=at_least(2), **_PRETRAIN, help="pre-training "
                                       "batch (a contrastive batch needs a negative)")
    pretrain_lr: float = setting(1e-3, check=positive, **_PRETRAIN, help="pre-training Adam "
                                 "learning rate")
    temperature: float = setting(0.1, check=positive, **_PRETRAIN, help="tau (tau0 for MACL)")
    alpha: float = macl_settings.alpha(**_PRETRAIN)
    a0: float = macl_settings.a0(**_PRETRAIN)
    tile_size: str | int | None = tiling.tile_size(identity="pretrain")
    aug: str = setting("random2", choices=AUGMENTATIONS, **_PRETRAIN, help="GraphCL "
                       "augmentation of both views")
    aug_ratio: float = setting(0.2, check=fraction, **_PRETRAIN, help="augmentation ratio")
    pretrain_seed: int = setting(0, check=seed_range, **_PRETRAIN, help="seed of the pre-training (weights, "
                                 "augmentations, order)")
    num_layers: int = setting(5, check=positive, help="GIN layers")
    emb_dim: int = setting(128, check=positive, help="GIN width")
    jk: str = setting("last", choices=("last", "sum", "concat"), help="jumping knowledge")
    finetune_epochs: int = setting(5, check=positive, **_FINETUNE, help="fine-tuning epochs")
    batch_size: int = setting(32, check=positive, **_FINETUNE, help="fine-tuning batch size")
    lr: float = setting(1e-3, check=positive, **_FINETUNE, help="fine-tuning learning rate")
    weight_decay: float = setting(0.0, check=non_negative, **_FINETUNE,
                                  help="fine-tuning weight decay")
    dropout: float = setting(0.5, check=fraction, **_FINETUNE, help="fine-tuning dropout")
    max_molecules: int | None = setting(None, check=positive, **_FINETUNE, help="first N rows "
                                        "of each CSV (none: all)")
    frac_train: float = setting(0.8, check=open_fraction, **_FINETUNE, help="scaffold split: "
                                "training share")
    frac_valid: float = setting(0.1, check=open_fraction, **_FINETUNE, help="scaffold split: "
                                "validation share (the test set takes the rest)")

    def __post_init__(self) -> None:
        check_settings(self)
        check_devices(self.pretrain_batch_size, self.devices, self.strategy,
                      batch_name="pretrain_batch_size")
        if self.frac_train + self.frac_valid >= 1:
            raise ValueError(f"frac_train + frac_valid must be < 1 (the test set takes the "
                             f"rest), got {self.frac_train} + {self.frac_valid}")

    @property
    def losses(self) -> list[str]:
        """The inits that pre-train an encoder (every one but ``none``)."""
        return [init for init in self.inits if init != NO_PRETRAINING]
