"""``adaptcl moleculenet``: GraphCL pre-training on SMILES, fine-tuning on MoleculeNet, ROC-AUC.

The transfer protocol of GraphCL (You et al., NeurIPS 2020) on Hu et al. (ICLR 2020), as used
by MACL (Huang et al., ICML 2023, Table 5, App. B.5). One pre-trained encoder per (loss,
pre-training settings) serves every cell; the protocol, presets and outputs are on the docs
page ``docs/recipes/moleculenet.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adaptcl.io import fingerprint_files, resolve_data_root
from adaptcl.recipes.common.devices import devices_identity
from adaptcl.recipes.common.graph_report import draw_pretraining_curves, paper_columns
from adaptcl.recipes.engine import Cell, Figure, GridRun, Recipe, ReportSpec, distributed_follower
from adaptcl.recipes.engine.provenance import stable_hash
from adaptcl.recipes.engine.settings import identity_settings
from adaptcl.recipes.engine.summary import point_text
from adaptcl.recipes.engine.sweep import Point
from adaptcl.recipes.engine.torch_env import resolve_device
from adaptcl.recipes.moleculenet.config import PRESETS, MoleculeNetConfig
from adaptcl.recipes.moleculenet.data import corpus_path, load_corpus, load_split_dataset

EXAMPLE = """adaptcl moleculenet --data-root ../shared/data --output-dir results/moleculenet
adaptcl moleculenet --datasets bbbp --inits none macl --temperature 0.1 0.2 --seeds 0 1 2
adaptcl moleculenet --preset paper --device cuda --precision bf16-mixed --data-root DATA
adaptcl moleculenet --preset paper --device cuda --devices 4 --strategy ddp --data-root DATA"""

INIT_LABELS = {"none": "no pre-train", "dcl": "GraphCL", "macl": "GraphCL+MACL",
               "infonce": "GraphCL+InfoNCE"}
DISPLAY = {"bbbp": "BBBP", "tox21": "Tox21", "toxcast": "ToxCast", "sider": "SIDER",
           "clintox": "ClinTox", "muv": "MUV", "hiv": "HIV", "bace": "BACE"}
# Huang et al. 2023 (MACL), Table 5: test ROC-AUC % (mean, std) over 10 seeds.
PAPER_TABLE5: dict[str, dict[str, tuple[float, float]]] = {
    "tox21": {"dcl": (73.87, 0.66), "macl": (74.39, 0.29)},
    "bbbp": {"dcl": (69.68, 0.67), "macl": (67.98, 0.97)},
    "toxcast": {"dcl": (62.40, 0.57), "macl": (62.96, 0.28)},
    "sider": {"dcl": (60.53, 0.88), "macl": (61.46, 0.39)},
    "clintox": {"dcl": (75.99, 2.65), "macl": (78.13, 4.29)},
    "muv": {"dcl": (69.80, 2.66), "macl": (72.77, 1.25)},
    "hiv": {"dcl": (78.47, 1.22), "macl": (77.56, 1.12)},
    "bace": {"dcl": (75.38, 1.44), "macl": (76.07, 0.90)},
}


class MoleculeNetRecipe(Recipe):
    """``adaptcl moleculenet``: each encoder pre-trained once, every (dataset, init, point,
    seed) fine-tuned."""

    name, config_class, presets, example = "moleculenet", MoleculeNetConfig, PRESETS, EXAMPLE
    description = "GraphCL/MACL pre-training on SMILES, MoleculeNet fine-tuning, ROC-AUC"
    axes = ("dataset", "init")
    code = ("adaptcl.recipes.moleculenet", "adaptcl.recipes.common", "adaptcl.evaluation.graphs",
            "adaptcl.adapters.graphcl", "adaptcl.plugins")
    frameworks = ("torch_geometric", "ogb", "rdkit", "scikit-learn", "pytorch-lightning")
    figure = Figure("pretraining_alignment_temperature.png", ncols=2)

    def prepare(self, configs: Mapping[Point, MoleculeNetConfig]) -> None:
        """Each loss built once per point (its own argument checks), the device, the
        fingerprint of every CSV and of the corpus. Nothing is written."""
        from adaptcl.adapters.graphcl.molecules import MOLECULENET
        from adaptcl.recipes.moleculenet.train import pretrain_loss

        for config in configs.values():
            for loss in config.losses:
                pretrain_loss(config, loss)
        resolve_device(self.config.device)
        self.data_root = resolve_data_root(self.config.data_root)
        for name in self.config.datasets:
            path = MOLECULENET[name].path(self.data_root)  # FileNotFoundError names where
            self.fingerprints[name] = fingerprint_files([path], root=path.parent)
        if self.config.losses:
            corpus = corpus_path(self.config, self.data_root)
            self.fingerprints["pretrain"] = fingerprint_files([corpus], root=corpus.parent)
        self._loaded: dict[tuple[Any, ...], Any] = {}

    def encoder_path(self, config: MoleculeNetConfig, loss: str) -> Path:
        """``<output-dir>/pretrain/<loss>-<hash of what determines the encoder>.pt``."""
        settings = identity_settings(config, part="pretrain", loss=loss, base=self.sweep.base)
        identity = {"loss": loss, "settings": settings,
                    "corpus": self.fingerprints["pretrain"], "code": self._code}
        key = stable_hash(identity | devices_identity(config.devices, config.strategy))
        return self.layout.folder("pretrain") / f"{loss}-{key}.pt"

    def setup(self) -> None:
        """Reuse, resume or pre-train the encoder of every loss at every point (points that
        differ only in fine-tuning share it)."""
        from adaptcl.recipes.moleculenet.train import pretrained_encoder

        #: (init, point) -> the file of its pre-trained encoder
        self.encoders: dict[tuple[str, Point], Path] = {}
        #: encoder file -> its checkpoint (``None`` on a non-zero rank of several devices)
        self.checkpoints: dict[Path, dict[str, Any] | None] = {}
        corpora: dict[Any, Any] = {}
        for point in self.sweep.points():
            config = self.sweep.config_at(point)
            for loss in config.losses:
                path = self.encoders[(loss, point)] = self.encoder_path(config, loss)
                if path in self.checkpoints:
                    continue

                def corpus(config: MoleculeNetConfig = config) -> Any:
                    if config.pretrain_molecules not in corpora:
                        corpora[config.pretrain_molecules] = load_corpus(config, self.data_root)
                    return corpora[config.pretrain_molecules]

                self.checkpoints[path] = pretrained_encoder(
                    config, loss, path, corpus, self.layout.folder("logs") / path.stem)

    def cells(self) -> list[Cell]:
        """Seed by seed (an interrupted run already has complete rows)."""
        return [self.cell(row, init, seed, point) for seed in self.seeds() for row in self.rows()
                for init in self.methods() for point in self.sweep.points()]

    def identity(self, cell: Cell, config: MoleculeNetConfig) -> dict[str, Any]:
        """Fine-tuning settings, the set's fingerprint, code, and the pre-trained encoder."""
        path = self.encoders.get((cell.init, cell.point))
        return {"settings": self.settings_identity(cell, config, part="finetune"),
                "row": cell.row, "data": self.fingerprints[cell.row], "code": self._code,
                "pretrained": path.stem if path is not None else None}

    def compute(self, cell: Cell, config: MoleculeNetConfig) -> dict[str, Any] | None:
        from adaptcl.recipes.moleculenet.train import finetune

        if config.devices > 1 and distributed_follower():
            return None  # the other ranks served the pre-training; rank 0 fine-tunes
        key = (cell.dataset, config.max_molecules, config.frac_train, config.frac_valid)
        if key not in self._loaded:
            self._loaded.clear()  # one dataset in memory at a time
            self._loaded[key] = load_split_dataset(config, cell.dataset, self.data_root)
        dataset, split = self._loaded[key]
        path = self.encoders.get((cell.init, cell.point))
        encoder = self.checkpoints[path]["encoder"] if path is not None else None
        record = finetune(config, cell, dataset, split, encoder,
                          self.layout.cell_folder("logs", cell))
        return record | {"info": dataset.info() | {"split_sizes": record["split_sizes"]}}

    def encoder_labels(self) -> dict[Path, str]:
        """Each pre-trained encoder's label: ``macl, temperature=0.2`` (its pre-training point)."""
        labels: dict[Path, str] = {}
        for (loss, point), path in self.encoders.items():
            pretraining = identity_settings(self.sweep.config_at(point), part="pretrain")
            shown = point_text([(k, v) for k, v in point if k in pretraining])
            labels.setdefault(path, ", ".join(filter(None, (loss, shown))))
        return labels

    def pretrainings(self) -> dict[str, dict[str, Any]]:
        """What ``results.json`` says of each pre-trained encoder, by its label."""
        keep = ("num_molecules", "num_invalid", "corpus", "epoch_loss", "steps", "loss_module")
        out = {}
        for path, label in self.encoder_labels().items():
            checkpoint = self.checkpoints[path] or {}
            temperatures = (checkpoint.get("step_stats") or {}).get("temperature") or [None]
            out[label] = {**{k: checkpoint.get(k) for k in keep}, "key": path.stem,
                          "seconds": sum(checkpoint.get("epoch_seconds") or []),
                          "final_temperature": temperatures[-1]}
        return out

    def report_spec(self) -> ReportSpec:
        inits = self.config.inits
        swept = ", ".join(f"{k} {' / '.join(map(str, v))}" for k, v in self.sweep.axes.items())

        def details(grid: GridRun) -> dict[str, Any]:
            return {"infos": {c.dataset: r.get("info") for c, r in grid.records.items()},
                    "pretraining": self.pretrainings()}

        return ReportSpec(
            metrics=("test_roc_last", "test_roc_best_valid"),
            baseline="dcl" if "dcl" in inits else inits[0], labels=INIT_LABELS,
            row_labels=DISPLAY, details=details,
            header=("# MoleculeNet transfer: test ROC-AUC (%)\n\n"
                    f"{describe(self.config, swept)}\n\n"),
            extra_columns=paper_columns(PAPER_TABLE5, {"dcl": "paper GraphCL",
                                                       "macl": "paper GraphCL+MACL"}))

    def draw(self, grid: GridRun, axes: list[Any]) -> None:
        """Alignment and temperature over the pre-training steps of each encoder."""
        draw_pretraining_curves(
            axes, {label: (self.checkpoints[path] or {}).get("step_stats")
                   for path, label in self.encoder_labels().items()},
            empty="" if self.encoders else "no pre-training: --inits holds only 'none'")


def describe(cfg: MoleculeNetConfig, swept: str = "") -> str:
    """The protocol of a run, above its tables (``swept``: the settings given several values,
    whose first value the text shows)."""
    lead = f"Swept: {swept} (a row per value). " if swept else ""
    return (f"{lead}Pre-training: {cfg.pretrain_molecules or 'all'} molecules of "
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
