"""``adaptcl moleculenet``: GraphCL pre-training on SMILES, fine-tuning on MoleculeNet, ROC-AUC.

The transfer protocol of GraphCL (You et al., NeurIPS 2020) on Hu et al. (ICLR 2020), as used
by MACL (Huang et al., ICML 2023, Table 5, App. B.5): pre-train Hu et al.'s GIN (OGB atom/bond
encoders, mean pooling) with GraphCL (both views ``random2``, ratio 0.2, Adam 1e-3, batch 256;
loss ``graphcl``: DCL tau 0.1, or ``macl``: tau0 0.1, alpha 0.5, A0 0) on ZINC SMILES
(``<data-root>/zinc/moses/test.csv.gz`` or ``--pretrain-smiles``); fine-tune it (or a fresh
one: ``none``) with a linear head, dropout 0.5, batch 32, masked multi-task BCE on a scaffold
split 80/10/10 of each MoleculeNet set; report test ROC-AUC (tasks with both classes) at the
last epoch (the paper's protocol) and at the best-validation epoch.

Presets (``--preset``): ``cpu`` (the default; about 40 minutes on two CPU cores: five sets,
seeds 0-2, 6,000 pre-training SMILES for 3 epochs, 5 fine-tuning epochs, 5 x 128 GIN) and
``paper`` (a GPU job: eight sets, seeds 0-9, the whole corpus, 100 + 100 epochs, 5 x 300 GIN).

Pre-trained encoders are checkpointed every epoch under ``<output-dir>/pretrain/`` (named by
their identity: settings, corpus fingerprint, code) and resume there; each (dataset, init,
seed) is stored by :mod:`adaptcl.recipes.template.store` and reused only while its identity matches.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptcl.recipes.graph_common import paper_columns
from adaptcl.recipes.template.config import validate_config
from adaptcl.recipes.template.errors import RecipeError, require_steps, user_errors
from adaptcl.recipes.template.files import resolve_data_root, torch_load_checked, torch_save_atomic
from adaptcl.recipes.template.loggers import metric_logger
from adaptcl.recipes.template.options import (
    add_common_arguments,
    add_config_arguments,
    canonical_choice,
    config_kwargs,
)
from adaptcl.recipes.template.plots import save_plot
from adaptcl.recipes.template.provenance import code_version, fingerprint_files, stable_hash
from adaptcl.recipes.template.report import Report
from adaptcl.recipes.template.store import Cell, GridRun, run_grid
from adaptcl.recipes.template.torch_env import (
    apply_thread_policy,
    loader_options,
    resolve_device,
    seed_everything,
    torch_device_type,
)

EXAMPLE = """adaptcl moleculenet --data-root ../shared/data --output-dir results/moleculenet
adaptcl moleculenet --preset paper --device cuda --precision bf16-mixed --data-root DATA"""

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
CODE = ("adaptcl.recipes.moleculenet", "adaptcl.recipes.graph_common", "adaptcl.adapters.graphcl",
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
    logger: str = "none"
    progress: bool = True
    plot: bool = True

    def __post_init__(self) -> None:
        self.datasets = [canonical_choice(d, ALL_DATASETS, "dataset") for d in self.datasets]
        self.inits = [canonical_choice(i, INITS, "init") for i in self.inits]
        validate_config(
            self, positive=("pretrain_epochs", "num_layers", "emb_dim", "finetune_epochs",
                            "batch_size"), non_empty=("datasets", "inits", "seeds"),
            choices={"aug": AUGMENTATIONS, "jk": ("last", "sum", "concat")})
        if self.pretrain_batch_size < 2:
            raise ValueError("pretrain_batch_size must be >= 2 (a contrastive batch needs negatives)")
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

    def settings(self, names: tuple[str, ...]) -> dict[str, Any]:
        return {n: getattr(self, n) for n in names} | {
            "device_type": torch_device_type(self.device)}


# ----------------------------------------------------------------------------- models


def build_encoder(cfg: MoleculeNetConfig, dropout: float):
    from adaptcl.adapters.graphcl import MolGINEncoder

    return MolGINEncoder(num_layers=cfg.num_layers, emb_dim=cfg.emb_dim, drop_ratio=dropout,
                         jk=cfg.jk, pooling="mean")


def build_classifier(cfg: MoleculeNetConfig, num_tasks: int):
    """MolGIN encoder (dropout ``cfg.dropout``) + mean pooling + linear head (Hu et al.)."""
    from adaptcl.adapters.graphcl import MolPropertyModel

    return MolPropertyModel(build_encoder(cfg, cfg.dropout), num_tasks)


# ------------------------------------------------------------------------ pre-training


def pretrain_identity(cfg: MoleculeNetConfig, loss_name: str,
                      fingerprint: dict | None = None) -> dict[str, Any]:
    corpus = cfg.resolved_pretrain_smiles()
    return {"loss": loss_name, "settings": cfg.settings(_PRETRAIN_FIELDS),
            "corpus": fingerprint or fingerprint_files([corpus], root=corpus.parent),
            "code": code_version(*CODE)}


def pretrain_path(cfg: MoleculeNetConfig, loss_name: str, fingerprint: dict | None = None) -> Path:
    key = stable_hash(pretrain_identity(cfg, loss_name, fingerprint))
    return Path(cfg.output_dir) / "pretrain" / f"{loss_name}-{key}.pt"


def load_pretrain_corpus(cfg: MoleculeNetConfig):
    from adaptcl.adapters.graphcl.molecules import load_smiles_dataset

    return load_smiles_dataset(cfg.resolved_pretrain_smiles(), cache_dir=_cache_dir(cfg),
                               limit=cfg.pretrain_molecules, progress=cfg.progress)


def pretrain(cfg: MoleculeNetConfig, loss_name: str, corpus=None,
             fingerprint: dict | None = None) -> dict[str, Any]:
    """Pre-train (or resume / reuse) the GraphCL encoder with ``loss_name``; return the checkpoint.

    A ``.partial.pt`` next to :func:`pretrain_path` holds model, optimiser and RNG states after
    each epoch, so an interrupted run resumes exactly; corrupt checkpoints are recomputed.
    """
    import torch
    from torch_geometric.loader import DataLoader

    from adaptcl.adapters.graphcl import GraphCL, TwoViewDataset, graphcl_augmentation, graphcl_loss
    from adaptcl.recipes.graph_common import train_epochs

    final = pretrain_path(cfg, loss_name, fingerprint)
    done = torch_load_checked(final, what="pre-trained encoder", weights_only=True)
    if done is not None:
        return done
    partial = final.with_suffix(".partial.pt")
    corpus = corpus if corpus is not None else load_pretrain_corpus(cfg)
    if len(corpus) < 2:
        raise RecipeError("the pre-training corpus needs at least 2 valid molecules")
    seed_everything(cfg.pretrain_seed)
    device = resolve_device(cfg.device)
    kwargs = {"alpha": cfg.alpha, "a0": cfg.a0} if loss_name == "macl" else {}
    model = GraphCL(build_encoder(cfg, dropout=0.0), xavier_init=False,
                    loss_fn=graphcl_loss(loss_name, temperature=cfg.temperature, **kwargs))
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.pretrain_lr)
    aug_gen = torch.Generator().manual_seed(cfg.pretrain_seed)
    shuffle_gen = torch.Generator().manual_seed(cfg.pretrain_seed + 1)
    state: dict[str, Any] = {"epoch": 0, "epoch_loss": [], "epoch_seconds": [], "steps": 0,
                             "step_stats": {}}
    saved = torch_load_checked(partial, what="partial pre-training checkpoint",
                                      weights_only=True)
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        aug_gen.set_state(saved["aug_gen"])
        shuffle_gen.set_state(saved["shuffle_gen"])
        torch.set_rng_state(saved["torch_rng"])
        state = saved["state"]
    aug = graphcl_augmentation(cfg.aug, cfg.aug_ratio, generator=aug_gen)
    loader = DataLoader(TwoViewDataset(corpus, aug, aug), batch_size=cfg.pretrain_batch_size,
                        shuffle=True, generator=shuffle_gen, **loader_options(device))
    clock = [time.perf_counter()]

    def checkpoint_epoch(epoch: int, loss: float, steps: int) -> None:
        state["epoch_loss"].append(loss)
        state["epoch_seconds"].append(time.perf_counter() - clock[0])
        state.update(epoch=epoch + 1, steps=steps)
        torch_save_atomic({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                           "aug_gen": aug_gen.get_state(), "shuffle_gen": shuffle_gen.get_state(),
                           "torch_rng": torch.get_rng_state(), "state": state}, partial)
        clock[0] = time.perf_counter()

    with metric_logger(cfg.logger, Path(cfg.output_dir) / "logs" / final.stem) as logger:
        train_epochs(model, loader, optimizer,
                     epochs=range(state["epoch"], cfg.pretrain_epochs), progress=cfg.progress,
                     desc=f"pre-train {loss_name}", on_epoch_end=checkpoint_epoch,
                     step=state["steps"], device=device, precision=cfg.precision,
                     stats=state["step_stats"], logger=logger)
    require_steps(state["steps"], f"pre-training {loss_name}")
    checkpoint = {"encoder": model.encoder.state_dict(), "loss": loss_name,
                  "loss_module": repr(model.loss_fn), "num_molecules": len(corpus),
                  "num_invalid": corpus.num_invalid, "corpus": str(cfg.resolved_pretrain_smiles()),
                  **{k: state[k] for k in ("epoch_loss", "epoch_seconds", "steps", "step_stats")}}
    torch_save_atomic(checkpoint, final)
    partial.unlink(missing_ok=True)
    return checkpoint


# ------------------------------------------------------------------------- fine-tuning


def _cache_dir(cfg: MoleculeNetConfig) -> Path:
    return Path(cfg.cache_dir) if cfg.cache_dir else Path(cfg.output_dir) / "cache"


def load_split_dataset(cfg: MoleculeNetConfig, name: str):
    """A MoleculeNet set and its scaffold split (train, valid, test index lists)."""
    from adaptcl.adapters.graphcl.molecules import load_moleculenet, scaffold_split

    root = resolve_data_root(cfg.data_root)
    try:
        dataset = load_moleculenet(name, root, cache_dir=_cache_dir(cfg), limit=cfg.max_molecules)
    except (ValueError, KeyError) as err:  # malformed CSV: name the set and the root
        raise RecipeError(f"reading MoleculeNet {name!r} under {root}: {err}") from err
    split = scaffold_split(dataset.smiles, cfg.frac_train, cfg.frac_valid,
                           1.0 - cfg.frac_train - cfg.frac_valid)
    return dataset, split


def evaluate(model, graphs, device: str = "cpu") -> dict[str, Any]:
    """Multi-task ROC-AUC of ``model`` (eval mode, no gradient) on a list of labelled graphs."""
    from adaptcl.recipes.graph_common import embed_graphs
    from adaptcl.recipes.graph_eval import multitask_roc_auc

    model.eval()
    scores, labels = embed_graphs(model, graphs, device=device,
                                  where="fine-tuned model scores", allow_constant=True)
    return multitask_roc_auc(labels, scores)


def finetune_one(cfg: MoleculeNetConfig, cell: Cell, dataset, split,
                 encoder_state: dict | None, logger=None) -> dict[str, Any]:
    """Fine-tune one (dataset, init, seed); ROC-AUC on valid and test after every epoch."""
    import torch
    from torch_geometric.loader import DataLoader

    from adaptcl.recipes.graph_common import train_epochs
    from adaptcl.recipes.graph_eval import masked_bce_loss

    train, valid, test = ([dataset[i] for i in part] for part in split)
    seed_everything(cell.seed)
    device = resolve_device(cfg.device)
    model = build_classifier(cfg, dataset.num_tasks)
    if encoder_state is not None:
        model.encoder.load_state_dict(encoder_state)
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    loader = DataLoader(train, batch_size=cfg.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(cell.seed),
                        **loader_options(device))
    history: dict[str, list] = {"train_loss": [], "valid_roc": [], "test_roc": []}
    last: dict[str, Any] = {}

    def evaluate_epoch(epoch: int, loss: float, steps: int) -> None:
        last.update(val=evaluate(model, valid, device), tst=evaluate(model, test, device))
        history["train_loss"].append(loss)
        for key, res in (("valid_roc", last["val"]), ("test_roc", last["tst"])):
            history[key].append(None if math.isnan(res["mean"]) else res["mean"])
            if logger is not None:
                logger.log({f"eval/{key}": history[key][-1]}, steps)

    start = time.perf_counter()
    _, steps = train_epochs(model, loader, optimizer,
                            lambda b: masked_bce_loss(model(b), b.y),
                            epochs=range(cfg.finetune_epochs), progress=cfg.progress,
                            desc=cell.label(), on_epoch_end=evaluate_epoch, device=device,
                            precision=cfg.precision, logger=logger)
    tst = last["tst"]
    finite = [(v, i) for i, v in enumerate(history["valid_roc"]) if v is not None]
    best = max(finite, key=lambda t: (t[0], -t[1]))[1] if finite else len(finite) - 1
    metrics = {"test_roc_last": history["test_roc"][-1], "test_roc_best_valid":
               history["test_roc"][best]}
    return {"metrics": metrics, "optimisation_steps": steps, "losses": history["train_loss"],
            "best_epoch": best + 1, "valid_roc_best": history["valid_roc"][best],
            "test_per_task_last": tst["per_task"], "test_tasks_skipped": tst["num_skipped"],
            "num_tasks": dataset.num_tasks, "split_sizes": [len(train), len(valid), len(test)],
            "history": history, "train_seconds": time.perf_counter() - start}


# ------------------------------------------------------------------------------ the grid


def validate(cfg: MoleculeNetConfig) -> dict[str, Any]:
    """Check every input before any work; return the fingerprints of the data used."""
    from adaptcl.adapters.graphcl.molecules import MOLECULENET

    with user_errors():
        root = resolve_data_root(cfg.data_root)
        cfg.device = resolve_device(cfg.device)
        prints = {}
        for name in cfg.datasets:
            path = MOLECULENET[name].path(root)
            prints[name] = fingerprint_files([path], root=path.parent)
        if any(i != "none" for i in cfg.inits):
            corpus = cfg.resolved_pretrain_smiles()
            prints["pretrain"] = fingerprint_files([corpus], root=corpus.parent)
    return prints


def run_moleculenet(cfg: MoleculeNetConfig) -> dict[str, Any]:
    """Pre-train what is missing, fine-tune every (dataset, init, seed) not stored, write results.

    Cells run seed by seed, so an interrupted run already has complete rows.
    """
    prints = validate(cfg)
    apply_thread_policy(cfg.threads)
    out = Path(cfg.output_dir)
    losses = [i for i in cfg.inits if i != "none"]
    corpus = load_pretrain_corpus(cfg) if any(
        not pretrain_path(cfg, loss, prints["pretrain"]).is_file() for loss in losses) else None
    checkpoints = {loss: pretrain(cfg, loss, corpus, prints["pretrain"]) for loss in losses}
    corpus = None
    pretrain_keys = {loss: pretrain_path(cfg, loss, prints["pretrain"]).stem for loss in losses}
    settings, code = cfg.settings(_FINETUNE_FIELDS), code_version(*CODE)
    cells = [Cell(n, i, s) for s in cfg.seeds for n in cfg.datasets for i in cfg.inits]
    loaded: dict[str, Any] = {}

    def identity(cell: Cell) -> dict[str, Any]:
        return {"settings": settings, "data": prints[cell.dataset], "code": code,
                "pretrained": pretrain_keys.get(cell.method)}

    def compute(cell: Cell) -> dict[str, Any]:
        if cell.dataset not in loaded:
            loaded.clear()
            loaded[cell.dataset] = load_split_dataset(cfg, cell.dataset)
        dataset, split = loaded[cell.dataset]
        state = checkpoints[cell.method]["encoder"] if cell.method != "none" else None
        log_dir = out / "logs" / cell.dataset / cell.method / f"seed{cell.seed}"
        with metric_logger(cfg.logger, log_dir) as logger:
            record = finetune_one(cfg, cell, dataset, split, state, logger)
        return record | {"info": dataset.info() | {"split_sizes": record["split_sizes"]}}

    def details(grid: GridRun) -> dict[str, Any]:
        keep = ("num_molecules", "num_invalid", "corpus", "epoch_loss", "steps", "loss_module")
        return {"infos": {c.dataset: r.get("info") for c, r in grid.records.items()},
                "pretraining": {loss: {k: ck.get(k) for k in keep} | {
                    "seconds": sum(ck["epoch_seconds"]), "key": pretrain_keys[loss],
                    "final_temperature": (ck["step_stats"].get("temperature") or [None])[-1]}
                    for loss, ck in checkpoints.items()}}

    report = Report(
        "moleculenet", out, cfg, metrics=["test_roc_last", "test_roc_best_valid"],
        datasets=cfg.datasets, methods=cfg.inits, labels=INIT_LABELS, dataset_labels=DISPLAY,
        baseline="graphcl" if "graphcl" in cfg.inits else cfg.inits[0],
        extra=paper_columns(PAPER_TABLE5, {"graphcl": "paper GraphCL", "macl": "paper GraphCL+MACL"}),
        header=f"# MoleculeNet transfer: test ROC-AUC (%)\n\n{_describe(cfg)}\n\n",
        frameworks=["torch_geometric", "ogb", "rdkit", "scikit-learn"], device=cfg.device,
        data_root=resolve_data_root(cfg.data_root), data_fingerprint=prints, details=details)

    grid = run_grid("moleculenet", out, cells, identity=identity, compute=compute,
                           on_record=report.write, progress_bar=cfg.progress)
    result = report.write(grid)
    if cfg.plot:
        result["plot"] = save_plot(out / "pretraining_alignment_temperature.png",
                                          lambda axes: _draw(checkpoints, axes), ncols=2)
    return result


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
            "std over seeds; differences paired over seeds with a 95% t-interval. Paper columns: Huang et al. 2023 (MACL), Table 5 (2M ZINC15 "
            "molecules, 5 x 300 GIN, 100 + 100 epochs, 10 seeds).")


def _draw(checkpoints: dict[str, dict[str, Any]], axes) -> None:
    from adaptcl.recipes.graph_common import draw_pretraining_curves

    draw_pretraining_curves(axes, {loss: ck.get("step_stats") for loss, ck in checkpoints.items()},
                            empty="" if checkpoints else "no pre-training: --inits holds only 'none'")


# ----------------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = MoleculeNetConfig()
    parser.add_argument("--preset", choices=["cpu", "paper"], default="cpu",
                        help="cpu: ~40 minutes on two CPU cores; paper: GraphCL/MACL App. B.5, "
                             "a GPU job (options override either)")
    add_common_arguments(parser, output_dir=d.output_dir, seeds=None,
                                data_root_help="folder holding moleculenet/ and zinc/")
    add_config_arguments(parser, MoleculeNetConfig, choices={
        "datasets": ALL_DATASETS, "inits": INITS, "aug": AUGMENTATIONS,
        "jk": ("last", "sum", "concat")}, helps={
        "inits": "none (no pre-training), graphcl, macl", "temperature": "tau (tau0 for MACL)",
        "pretrain_smiles": "SMILES file for pre-training (none: <data-root>/zinc/moses/test.csv.gz)",
        "pretrain_molecules": "use the first N SMILES (none: all)", "batch_size":
        "fine-tuning batch size", "lr": "fine-tuning learning rate", "max_molecules":
        "first N rows of each CSV (none: all)", "plot": "do not write the PNG plot"})


def config_from_args(args: argparse.Namespace) -> MoleculeNetConfig:
    with user_errors():
        factory = MoleculeNetConfig.paper if args.preset == "paper" else MoleculeNetConfig.cpu
        return factory(**config_kwargs(MoleculeNetConfig, args))


def main(args: argparse.Namespace) -> int:
    result = run_moleculenet(config_from_args(args))
    print("Last epoch (paper protocol):\n" + result["table_markdown"])
    print("Best-validation epoch:\n" + result["tables"]["test_roc_best_valid"])
    print(f"results: {result['outputs']['json']}  table: {result['outputs']['markdown']}")
    return 0
