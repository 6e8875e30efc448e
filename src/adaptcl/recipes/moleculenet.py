"""``adaptcl moleculenet``: GraphCL pre-training on SMILES, fine-tuning on MoleculeNet, ROC-AUC.

The transfer protocol of GraphCL (You et al., NeurIPS 2020) on Hu et al. (ICLR 2020), as used
by MACL (Huang et al., ICML 2023, Table 5, App. B.5): pre-train Hu et al.'s GIN (OGB atom/bond
encoders, mean pooling) with GraphCL (both views ``random2``, ratio 0.2, Adam 1e-3, batch 256;
loss ``graphcl``: DCL tau 0.1, or ``macl``: tau0 0.1, alpha 0.5, A0 0) on ZINC SMILES
(``<data-root>/zinc/moses/test.csv.gz`` or ``--pretrain-smiles``); fine-tune it (or a fresh
one: ``none``) with a linear head, dropout 0.5, batch 32, masked multi-task BCE on a scaffold
split 80/10/10 of each MoleculeNet set; report test ROC-AUC (tasks with both classes) at the
last epoch (the paper's protocol) and at the best-validation epoch.

Presets (``--preset``): ``cpu`` (the default; about 15 minutes on one CPU thread: five sets,
seeds 0-2, 6,000 pre-training SMILES for 3 epochs, 5 fine-tuning epochs, 5 x 128 GIN) and
``paper`` (a GPU job: eight sets, seeds 0-9, the whole corpus, 100 + 100 epochs, 5 x 300 GIN).

Pre-trained encoders are checkpointed every epoch under ``<output-dir>/pretrain/`` (named by
their identity: settings, corpus fingerprint, code) and resume there; each (dataset, init,
seed) is stored by :mod:`adaptcl.recipes.template.store` and reused only while its identity matches.
The training itself is :mod:`adaptcl.recipes.moleculenet_train`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptcl.io import resolve_data_root
from adaptcl.recipes.graph_common import (
    check_devices,
    devices_identity,
    draw_pretraining_curves,
    paper_columns,
)
from adaptcl.recipes.moleculenet_train import (
    finetune_one,
    load_pretrain_corpus,
    load_split_dataset,
    pretrain,
    pretrain_loss,
)
from adaptcl.recipes.template.config import validate_config
from adaptcl.recipes.template.loggers import metric_logger
from adaptcl.recipes.template.options import canonical_choice
from adaptcl.recipes.template.provenance import code_version, fingerprint_files, stable_hash
from adaptcl.recipes.template.recipe import Recipe
from adaptcl.recipes.template.store import Cell, GridRun, distributed_follower
from adaptcl.recipes.template.torch_env import resolve_device, torch_device_type

EXAMPLE = """adaptcl moleculenet --data-root ../shared/data --output-dir results/moleculenet
adaptcl moleculenet --preset paper --device cuda --precision bf16-mixed --data-root DATA
adaptcl moleculenet --preset paper --device cuda --devices 4 --strategy ddp --data-root DATA"""

ALL_DATASETS = ("bbbp", "tox21", "toxcast", "sider", "clintox", "muv", "hiv", "bace")
INITS = ("none", "graphcl", "macl")  # no pre-training, GraphCL, GraphCL + MACL
INIT_LABELS = {"none": "no pre-train", "graphcl": "GraphCL", "macl": "GraphCL+MACL"}
DISPLAY = {"bbbp": "BBBP", "tox21": "Tox21", "toxcast": "ToxCast", "sider": "SIDER",
           "clintox": "ClinTox", "muv": "MUV", "hiv": "HIV", "bace": "BACE"}
AUGMENTATIONS = ("none", "dnodes", "pedges", "subgraph", "random2", "random3")
DEFAULT_PRETRAIN_SMILES = ("zinc", "moses", "test.csv.gz")
# Huang et al. 2023 (MACL), Table 5: test ROC-AUC % (mean, std) over 10 seeds.
PAPER_TABLE5: dict[str, dict[str, tuple[float, float]]] = {
    "tox21": {"graphcl": (73.87, 0.66), "macl": (74.39, 0.29)},
    "bbbp": {"graphcl": (69.68, 0.67), "macl": (67.98, 0.97)},
    "toxcast": {"graphcl": (62.40, 0.57), "macl": (62.96, 0.28)},
    "sider": {"graphcl": (60.53, 0.88), "macl": (61.46, 0.39)},
    "clintox": {"graphcl": (75.99, 2.65), "macl": (78.13, 4.29)},
    "muv": {"graphcl": (69.80, 2.66), "macl": (72.77, 1.25)},
    "hiv": {"graphcl": (78.47, 1.22), "macl": (77.56, 1.12)},
    "bace": {"graphcl": (75.38, 1.44), "macl": (76.07, 0.90)},
}
_PRETRAIN_FIELDS = ("pretrain_molecules", "pretrain_epochs", "pretrain_batch_size",
                    "pretrain_lr", "temperature", "alpha", "a0", "aug", "aug_ratio",
                    "num_layers", "emb_dim", "jk", "pretrain_seed", "precision")
_FINETUNE_FIELDS = ("finetune_epochs", "batch_size", "lr", "weight_decay", "dropout",
                    "num_layers", "emb_dim", "jk", "max_molecules", "frac_train", "frac_valid",
                    "precision")
CODE = ("adaptcl.recipes.moleculenet", "adaptcl.recipes.moleculenet_train",
        "adaptcl.recipes.graph_common", "adaptcl.evaluation.graphs", "adaptcl.adapters.graphcl",
        "adaptcl.plugins")
PAPER = {"datasets": list(ALL_DATASETS), "seeds": list(range(10)), "pretrain_molecules": None,
         "pretrain_epochs": 100, "finetune_epochs": 100, "emb_dim": 300}


@dataclass
class MoleculeNetConfig:
    """Settings of a ``moleculenet`` run; defaults are the CPU preset (:meth:`paper` for a GPU)."""

    datasets: list[str] = field(default_factory=lambda: ["bbbp", "bace", "clintox", "sider",
                                                         "tox21"])
    inits: list[str] = field(default_factory=lambda: list(INITS))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    data_root: str | None = None
    output_dir: str = "results/moleculenet"
    cache_dir: str | None = None  # default <output_dir>/cache
    pretrain_smiles: str | None = None  # default <data_root>/zinc/moses/test.csv.gz
    pretrain_molecules: int | None = 6000  # None: every SMILES of the file
    pretrain_epochs: int = 3
    pretrain_batch_size: int = 256
    pretrain_lr: float = 1e-3
    temperature: float = 0.1  # tau (tau0 for MACL)
    alpha: float = 0.5
    a0: float = 0.0
    aug: str = "random2"
    aug_ratio: float = 0.2
    pretrain_seed: int = 0
    num_layers: int = 5
    emb_dim: int = 128
    jk: str = "last"
    finetune_epochs: int = 5
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.0
    dropout: float = 0.5
    max_molecules: int | None = None  # first N rows of each CSV (tests / quick looks)
    frac_train: float = 0.8
    frac_valid: float = 0.1
    threads: int | None = 1
    device: str = "auto"
    precision: str = "32"
    devices: int = 1  # > 1: pre-training on that many processes through Lightning
    strategy: str = "auto"  # Lightning's: "auto" or "ddp" (what "auto" picks for devices > 1)
    logger: str = "none"
    progress: bool = True
    plot: bool = True

    def __post_init__(self) -> None:
        self.datasets = [canonical_choice(d, ALL_DATASETS, "dataset") for d in self.datasets]
        self.inits = [canonical_choice(i, INITS, "init") for i in self.inits]
        validate_config(
            self, positive=("pretrain_epochs", "num_layers", "emb_dim", "finetune_epochs",
                            "batch_size", "pretrain_lr", "lr", "temperature",
                            "pretrain_molecules", "max_molecules", "devices"),
            non_negative=("weight_decay",), fractions=("aug_ratio",),
            non_empty=("datasets", "inits", "seeds"),
            choices={"aug": AUGMENTATIONS, "jk": ("last", "sum", "concat")})
        if self.pretrain_batch_size < 2:
            raise ValueError("pretrain_batch_size must be >= 2 (a contrastive batch needs negatives)")
        check_devices(self.pretrain_batch_size, self.devices, self.strategy,
                      batch_name="pretrain_batch_size")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not (0 < self.frac_train < 1 and 0 < self.frac_valid < 1
                and self.frac_train + self.frac_valid < 1):
            raise ValueError("need 0 < frac_train, frac_valid and frac_train + frac_valid < 1")

    @classmethod
    def cpu(cls, **overrides: Any) -> MoleculeNetConfig:
        """The CPU preset (the dataclass defaults)."""
        return cls(**overrides)

    @classmethod
    def paper(cls, **overrides: Any) -> MoleculeNetConfig:
        """GraphCL / MACL App. B.5 (a GPU job): 8 sets, seeds 0-9, whole corpus, 100 + 100
        epochs, 5 x 300 GIN."""
        return cls(**(PAPER | overrides))

    def resolved_pretrain_smiles(self) -> Path:
        if self.pretrain_smiles is not None:
            return Path(self.pretrain_smiles)
        return resolve_data_root(self.data_root).joinpath(*DEFAULT_PRETRAIN_SMILES)

    def cache_path(self) -> Path:
        """Where featurised datasets are cached (``cache_dir``, default ``<output_dir>/cache``)."""
        return Path(self.cache_dir) if self.cache_dir else Path(self.output_dir) / "cache"

    def settings(self, names: tuple[str, ...]) -> dict[str, Any]:
        return {n: getattr(self, n) for n in names} | {
            "device_type": torch_device_type(self.device)}


# ------------------------------------------------------------------- pre-trained encoders


def pretrain_identity(cfg: MoleculeNetConfig, loss_name: str,
                      fingerprint: dict | None = None) -> dict[str, Any]:
    """Everything that determines a pre-trained encoder: loss, settings, corpus, code."""
    corpus = cfg.resolved_pretrain_smiles()
    identity = {"loss": loss_name, "settings": cfg.settings(_PRETRAIN_FIELDS),
                "corpus": fingerprint or fingerprint_files([corpus], root=corpus.parent),
                "code": code_version(*CODE)}
    return identity | devices_identity(cfg.devices, cfg.strategy)


def pretrain_path(cfg: MoleculeNetConfig, loss_name: str, fingerprint: dict | None = None) -> Path:
    """``<output_dir>/pretrain/<loss>-<identity hash>.pt``."""
    key = stable_hash(pretrain_identity(cfg, loss_name, fingerprint))
    return Path(cfg.output_dir) / "pretrain" / f"{loss_name}-{key}.pt"


# ----------------------------------------------------------------------------- the recipe


class MoleculeNetRecipe(Recipe):
    """``adaptcl moleculenet``: pre-train each loss once, fine-tune every (dataset, init, seed)."""

    name, config_class, code = "moleculenet", MoleculeNetConfig, CODE
    metrics = ("test_roc_last", "test_roc_best_valid")
    frameworks = ("torch_geometric", "ogb", "rdkit", "scikit-learn")
    example = EXAMPLE
    presets = {"cpu": "cpu", "paper": "paper"}
    common = {"seeds": None, "devices": True,
              "data_root_help": "folder holding moleculenet/ and zinc/"}
    choices = {"datasets": ALL_DATASETS, "inits": INITS, "aug": AUGMENTATIONS,
               "jk": ("last", "sum", "concat")}
    helps = {"preset": "cpu: ~15 minutes on one CPU thread; paper: GraphCL/MACL App. B.5, a GPU "
             "job (options override either)", "inits": "none (no pre-training), graphcl, macl",
             "temperature": "tau (tau0 for MACL)", "pretrain_smiles": "SMILES file for "
             "pre-training (none: <data-root>/zinc/moses/test.csv.gz)", "pretrain_molecules":
             "use the first N SMILES (none: all)", "batch_size": "fine-tuning batch size",
             "lr": "fine-tuning learning rate", "max_molecules": "first N rows of each CSV "
             "(none: all)", "plot": "do not write the PNG plot"}
    plot_file = "pretraining_alignment_temperature.png"
    plot_layout = {"ncols": 2}

    def prepare(self) -> None:
        """The data root, the device and the fingerprint of every CSV and of the corpus."""
        from adaptcl.adapters.graphcl.molecules import MOLECULENET

        cfg = self.config
        for init in cfg.inits:  # each pre-training loss built once: its own argument checks
            if init != "none":
                pretrain_loss(cfg, init)
        self.data_root = resolve_data_root(cfg.data_root)
        cfg.device = resolve_device(cfg.device)
        for name in cfg.datasets:
            path = MOLECULENET[name].path(self.data_root)
            self.fingerprints[name] = fingerprint_files([path], root=path.parent)
        if any(i != "none" for i in cfg.inits):
            corpus = cfg.resolved_pretrain_smiles()
            self.fingerprints["pretrain"] = fingerprint_files([corpus], root=corpus.parent)

    def setup(self) -> None:
        """Pre-train (or resume, or reuse) the encoder of every loss in ``inits``."""
        cfg = self.config
        self.pretrained = {loss: pretrain_path(cfg, loss, self.fingerprints["pretrain"])
                           for loss in cfg.inits if loss != "none"}
        missing = any(not path.is_file() for path in self.pretrained.values())
        corpus = load_pretrain_corpus(cfg) if missing else None
        self.checkpoints = {loss: pretrain(cfg, loss, path, corpus)
                            for loss, path in self.pretrained.items()}
        self._loaded: dict[str, Any] = {}
        # a non-zero rank of a multi-device pre-training served it only: rank 0 fine-tunes
        self.follower = cfg.devices > 1 and distributed_follower()

    def cells(self) -> list[Cell]:
        """Seed by seed (an interrupted run already has complete rows)."""
        cfg = self.config
        return [Cell(n, i, s) for s in cfg.seeds for n in cfg.datasets for i in cfg.inits]

    def methods(self) -> list[str]:
        return list(self.config.inits)

    def identity(self, cell: Cell) -> dict[str, Any]:
        """Fine-tuning settings, the set's fingerprint, code, and the pre-trained encoder."""
        path = self.pretrained.get(cell.method)
        return {"settings": self.config.settings(_FINETUNE_FIELDS),
                "data": self.fingerprints[cell.dataset], "code": self._code,
                "pretrained": path.stem if path is not None else None}

    def compute(self, cell: Cell) -> dict[str, Any] | None:
        cfg = self.config
        if getattr(self, "follower", False):  # rank 0 computes and stores every cell
            return None
        if cell.dataset not in self._loaded:
            self._loaded.clear()  # one dataset in memory at a time
            self._loaded[cell.dataset] = load_split_dataset(cfg, cell.dataset)
        dataset, split = self._loaded[cell.dataset]
        state = self.checkpoints[cell.method]["encoder"] if cell.method != "none" else None
        log_dir = Path(cfg.output_dir) / "logs" / cell.dataset / cell.method / f"seed{cell.seed}"
        with metric_logger(cfg.logger, log_dir) as logger:
            record = finetune_one(cfg, cell, dataset, split, state, logger)
        return record | {"info": dataset.info() | {"split_sizes": record["split_sizes"]}}

    def report_spec(self) -> dict[str, Any]:
        cfg, checkpoints = self.config, self.checkpoints
        keep = ("num_molecules", "num_invalid", "corpus", "epoch_loss", "steps", "loss_module")

        def details(grid: GridRun) -> dict[str, Any]:
            return {"infos": {c.dataset: r.get("info") for c, r in grid.records.items()},
                    "pretraining": {loss: {k: ck.get(k) for k in keep} | {
                        "seconds": sum(ck["epoch_seconds"]),
                        "key": self.pretrained[loss].stem,
                        "final_temperature": (ck["step_stats"].get("temperature") or [None])[-1]}
                        for loss, ck in checkpoints.items()}}

        return {"baseline": "graphcl" if "graphcl" in cfg.inits else cfg.inits[0],
                "labels": INIT_LABELS, "dataset_labels": DISPLAY, "details": details,
                "extra": paper_columns(PAPER_TABLE5, {"graphcl": "paper GraphCL",
                                                      "macl": "paper GraphCL+MACL"}),
                "header": f"# MoleculeNet transfer: test ROC-AUC (%)\n\n{_describe(cfg)}\n\n"}

    def draw(self, grid: GridRun, axes) -> None:
        """Alignment and temperature over the pre-training steps of each loss."""
        draw_pretraining_curves(
            axes, {loss: ck.get("step_stats") for loss, ck in self.checkpoints.items()},
            empty="" if self.checkpoints else "no pre-training: --inits holds only 'none'")


def _describe(cfg: MoleculeNetConfig) -> str:
    return (f"Pre-training: {cfg.pretrain_molecules or 'all'} molecules of "
            f"{cfg.pretrain_smiles or 'zinc/moses/test.csv.gz'}, {cfg.pretrain_epochs} epochs, "
            f"batch {cfg.pretrain_batch_size}, lr {cfg.pretrain_lr}, aug {cfg.aug} (ratio "
            f"{cfg.aug_ratio}) on both views, tau {cfg.temperature} (MACL alpha {cfg.alpha}, A0 "
            f"{cfg.a0}). GIN {cfg.num_layers} x {cfg.emb_dim}, JK {cfg.jk}, mean pooling. "
            f"Fine-tuning: {cfg.finetune_epochs} epochs, batch {cfg.batch_size}, lr {cfg.lr}, "
            f"dropout {cfg.dropout}, masked BCE; scaffold split; seeds {cfg.seeds}; precision "
            f"{cfg.precision}. test_roc_last: the last epoch (the paper's protocol); "
            "test_roc_best_valid: the epoch with the best validation ROC-AUC. Mean ± population "
            "std over seeds; differences paired over seeds with a 95% t-interval. Paper columns: "
            "Huang et al. 2023 (MACL), Table 5 (2M ZINC15 molecules, 5 x 300 GIN, 100 + 100 "
            "epochs, 10 seeds).")


RECIPE = MoleculeNetRecipe
