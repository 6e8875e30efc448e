"""``adaptcl tu``: GraphCL pre-training on TU datasets, SVM evaluation, every loss in one table.

The unsupervised TU protocol of GraphCL (You et al., NeurIPS 2020) as used by MACL (Huang et al.,
ICML 2023, Table 4, App. B.5), GraphCL's settings (they run on a CPU): ``TUDataset`` from
``<data-root>/tu/<NAME>/raw`` (names match case-insensitively), copied to
``<work-dir>/<fingerprint>/`` since torch-geometric writes ``processed/`` next to ``raw/`` (a
truncated one is named and rebuilt); featureless sets get ``x = 1`` or a capped one-hot degree;
a 3 x 32 GIN with every layer's sum pooling concatenated, Adam lr 0.01, batch 128, 20 epochs;
the un-augmented graph against a GraphCL augmentation (``random2``; ``random4`` for social
sets), ratio 0.2; losses ``dcl`` (GraphCL's loss; ``graphcl`` names it too, tau 0.2), ``macl`` (tau0 0.2, alpha 0.5, A0 0),
``infonce``; encoder embeddings into an RBF SVC, 10-fold CV with an inner 5-fold grid over C.

``--graphcl-exact`` uses GraphCL's own code paths (ratios 0.1 / subgraph 0.2, removal-only edge
perturbation, one-hop subgraph, unseeded CV); the default fixes the CV folds (``--cv-seed 0``).

Every (dataset, loss, seed) is stored by :mod:`adaptcl.recipes.template.store` with its identity
(settings, data fingerprint, code version) and reused only when that identity matches.
Outputs: ``results.json``, ``results.md``, ``macl_temperature_alignment.png``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptcl.io import resolve_data_root
from adaptcl.recipes.graph_common import (
    AUGMENTATION_RANK_STRIDE,
    check_devices,
    devices_identity,
    draw_pretraining_curves,
    paper_columns,
    rank_logger,
)
from adaptcl.recipes.template.config import result_settings, validate_config
from adaptcl.recipes.template.errors import require_steps, user_errors
from adaptcl.recipes.template.options import config_kwargs
from adaptcl.recipes.template.provenance import fingerprint_files
from adaptcl.recipes.template.recipe import Recipe
from adaptcl.recipes.template.store import Cell, GridRun
from adaptcl.recipes.template.torch_env import (
    loader_options,
    resolve_device,
    seed_everything,
)
from adaptcl.recipes.tu_data import check_folds, find_raw, graph_label_counts, load_tu_graphs
from adaptcl.registry import canonical_loss_name

EXAMPLE = """adaptcl tu --data-root ../shared/data --datasets MUTAG --losses graphcl macl \\
    --seeds 0 1 2 3 4 --output-dir results/tu"""

SOCIAL_DATASETS = ("IMDB-BINARY", "IMDB-MULTI", "REDDIT-BINARY", "REDDIT-MULTI-5K", "COLLAB")
LOSSES = ("dcl", "infonce", "macl")
#: GraphCL's name for its loss (DCL, cross-view), resolved by :mod:`adaptcl.registry`
LOSS_ALIASES = {"graphcl": "dcl"}
AUGMENTATIONS = ("auto", "none", "dnodes", "pedges", "mask_nodes", "subgraph", "random2",
                 "random3", "random4")
# Huang et al. 2023 (MACL), Table 4: accuracy % (mean, std) of GraphCL and GraphCL w/ MACL.
PAPER_TABLE4: dict[str, dict[str, tuple[float, float]]] = {
    "NCI1": {"dcl": (77.87, 0.41), "macl": (78.41, 0.47)},
    "PROTEINS": {"dcl": (74.39, 0.45), "macl": (74.47, 0.85)},
    "MUTAG": {"dcl": (86.80, 1.34), "macl": (89.04, 0.98)},
    "REDDIT-BINARY": {"dcl": (89.53, 0.84), "macl": (90.59, 0.36)},
    "DD": {"dcl": (78.62, 0.40), "macl": (78.80, 0.66)},
    "IMDB-BINARY": {"dcl": (71.14, 0.44), "macl": (71.42, 1.05)},
}
CODE = ("adaptcl.recipes.tu", "adaptcl.recipes.tu_data", "adaptcl.recipes.graph_common", "adaptcl.evaluation.graphs",
        "adaptcl.adapters.graphcl", "adaptcl.plugins")


@dataclass
class TUConfig:
    """Settings of a ``tu`` run; defaults are GraphCL's TU setting with fixed CV seeds."""

    datasets: list[str] = field(default_factory=lambda: ["MUTAG"])
    losses: list[str] = field(default_factory=lambda: ["graphcl", "macl"])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    data_root: str | None = None
    output_dir: str = "results/tu"
    work_dir: str | None = None  # default <output_dir>/data
    epochs: int = 20
    batch_size: int = 128
    lr: float = 0.01
    hidden: int = 32
    layers: int = 3
    temperature: float = 0.2
    alpha: float = 0.5
    a0: float = 0.0
    aug: str = "auto"
    aug_ratio: float = 0.2
    subgraph_ratio: float | None = None  # default: aug_ratio
    graphcl_quirks: bool = False
    first_view: str = "identity"  # or "augmented"
    node_features: str = "constant"  # for datasets without x: constant | degree
    max_degree: int = 100
    folds: int = 10
    inner_folds: int = 5
    c_grid: list[float] = field(default_factory=lambda: [1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0,
                                                          1e3])
    classifier: str = "svc"
    standardize: bool = False
    cv_seed: int | None = 0
    threads: int | None = 1
    device: str = "auto"
    precision: str = "32"
    devices: int = 1  # > 1: each pre-training on that many processes through Lightning
    strategy: str = "auto"  # Lightning's: "auto" or "ddp" (what "auto" picks for devices > 1)
    logger: str = "none"
    progress: bool = True
    plot: bool = True

    def __post_init__(self) -> None:
        self.losses = [canonical_loss_name(x, allowed=LOSSES, aliases=LOSS_ALIASES)
                       for x in self.losses]
        validate_config(
            self, positive=("epochs", "hidden", "layers", "max_degree", "lr", "temperature",
                            "c_grid", "devices"), at_least={"folds": 2, "inner_folds": 2},
            fractions=("aug_ratio", "subgraph_ratio"),
            non_empty=("datasets", "losses", "seeds"), choices={
                "first_view": ("identity", "augmented"), "node_features": ("constant", "degree"),
                "classifier": ("svc", "linear"), "aug": AUGMENTATIONS})
        if self.batch_size < 2:
            raise ValueError(f"batch_size must be >= 2 (a contrastive batch needs a negative), "
                             f"got {self.batch_size}")
        check_devices(self.batch_size, self.devices, self.strategy)

    @classmethod
    def graphcl_exact(cls, **overrides: Any) -> TUConfig:
        """GraphCL's own code paths: ratios 0.1 / subgraph 0.2, quirks on, unseeded CV."""
        params: dict[str, Any] = {"aug_ratio": 0.1, "subgraph_ratio": 0.2,
                                  "graphcl_quirks": True, "cv_seed": None}
        return cls(**(params | overrides))

    def result_settings(self) -> dict[str, Any]:
        """Every setting that changes a (dataset, loss, seed) result."""
        return result_settings(self)


def resolve_aug(cfg: TUConfig, name: str) -> str:
    if cfg.aug != "auto":
        return cfg.aug
    return "random4" if name.upper() in SOCIAL_DATASETS else "random2"


def build_views(cfg: TUConfig, name: str, generator):
    """The two view transforms of a run (first view identity unless ``first_view='augmented'``)."""
    from adaptcl.adapters.graphcl import Identity, graphcl_augmentation

    aug = resolve_aug(cfg, name)
    view1 = graphcl_augmentation(aug, cfg.aug_ratio, graphcl_quirks=cfg.graphcl_quirks,
                                 generator=generator, subgraph_ratio=cfg.subgraph_ratio or None)
    return (Identity() if cfg.first_view == "identity" else view1), view1, aug


# ------------------------------------------------------------------------------ one cell


def build_loss(cfg: TUConfig, name: str):
    """The loss module of ``name`` with the run's temperature (and MACL's alpha, A0)."""
    from adaptcl.adapters.graphcl import graphcl_loss

    extra = {"alpha": cfg.alpha, "a0": cfg.a0} if name == "macl" else {}
    return graphcl_loss(name, temperature=cfg.temperature, **extra)


def run_one(cfg: TUConfig, cell: Cell, graphs, in_dim: int,
            logger=None) -> dict[str, Any] | None:
    """Pre-train one model and evaluate it with the SVM protocol; return the run record.

    On several devices (``cfg.devices > 1``) every rank pre-trains and rank 0 alone evaluates
    and returns the record; the other ranks return ``None``.
    """
    import torch
    from torch_geometric.loader import DataLoader

    from adaptcl.adapters.graphcl import GraphCL, TUGINEncoder, TwoViewDataset
    from adaptcl.evaluation.graphs import svm_cv_accuracy
    from adaptcl.recipes.graph_common import embed_graphs, train_epochs

    seed_everything(cell.seed)
    device = resolve_device(cfg.device)
    loss_fn = build_loss(cfg, cell.method)
    model = GraphCL(TUGINEncoder(in_dim, cfg.hidden, cfg.layers), loss_fn=loss_fn).to(device)

    def pairs(rank: int = 0) -> TwoViewDataset:  # each rank its own augmentation stream
        seed = 10_000 + cell.seed + AUGMENTATION_RANK_STRIDE * rank
        view0, view1, _ = build_views(cfg, cell.dataset, torch.Generator().manual_seed(seed))
        return TwoViewDataset(graphs, view0, view1)

    start = time.perf_counter()
    if cfg.devices > 1:
        from adaptcl.recipes.graph_distributed import pretrain_on_devices

        run = pretrain_on_devices(
            model, pairs, devices=cfg.devices, strategy=cfg.strategy, epochs=cfg.epochs,
            batch_size=cfg.batch_size, lr=cfg.lr, device=device, precision=cfg.precision,
            shuffle_seed=20_000 + cell.seed, where=cell.label(), progress=cfg.progress,
            logger=logger)
        if run is None:  # rank 0 evaluates and stores
            return None
        epoch_loss, steps, history = run["epoch_loss"], run["steps"], run["step_stats"]
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        loader = DataLoader(pairs(), batch_size=cfg.batch_size, shuffle=True,
                            generator=torch.Generator().manual_seed(20_000 + cell.seed),
                            **loader_options(device))
        history: dict[str, list[float]] = {}
        epoch_loss, steps = train_epochs(model, loader, optimizer, epochs=range(cfg.epochs),
                                         progress=cfg.progress, desc=cell.label(),
                                         device=device, precision=cfg.precision,
                                         stats=history, logger=logger)
    train_seconds = time.perf_counter() - start
    require_steps(steps, cell.label())
    start = time.perf_counter()
    model.eval()
    x, y = embed_graphs(model.embed, graphs, device=device, where=f"{cell.label()} embeddings")
    evaluation = svm_cv_accuracy(x, y, folds=cfg.folds, inner_folds=cfg.inner_folds,
                                 c_grid=cfg.c_grid, classifier=cfg.classifier,
                                 cv_seed=cfg.cv_seed, standardize=cfg.standardize)
    if logger is not None:
        logger.log({"eval/svm_accuracy": evaluation["accuracy"]}, steps)
    return {"metrics": {"accuracy": evaluation["accuracy"]}, "optimisation_steps": steps,
            "losses": epoch_loss, "aug": resolve_aug(cfg, cell.dataset),
            "loss_module": repr(loss_fn), "evaluation": evaluation, "step_stats": history,
            "embedding_dim": int(x.shape[1]), "train_seconds": train_seconds,
            "eval_seconds": time.perf_counter() - start}


# ----------------------------------------------------------------------------- the recipe


class TURecipe(Recipe):
    """``adaptcl tu``: every (dataset, loss, seed) pre-trained and scored by the SVM protocol."""

    name, config_class, code, metrics = "tu", TUConfig, CODE, ("accuracy",)
    frameworks = ("torch_geometric", "scikit-learn")
    example = EXAMPLE
    common = {"devices": True, "data_root_help": "folder holding tu/<NAME>/raw or <NAME>/raw"}
    loss_aliases = LOSS_ALIASES
    choices = {"losses": LOSSES, "aug": AUGMENTATIONS, "first_view": ("identity", "augmented"),
               "node_features": ("constant", "degree"), "classifier": ("svc", "linear")}
    helps = {"datasets": "TU dataset names (case-insensitive)", "losses": "contrastive losses",
             "work_dir": "writable copy of the raw data + processed/ (default <output-dir>/data)",
             "temperature": "tau (tau0 for MACL)", "aug_ratio": "augmentation ratio (0.1 with "
             "--graphcl-exact)", "subgraph_ratio": "fraction of nodes the subgraph removes "
             "(none: --aug-ratio)", "graphcl_quirks": "removal-only edge perturbation and "
             "one-hop subgraph", "cv_seed": "seed of the CV splits, or none for GraphCL's "
             "unseeded splits", "c_grid": "values of C searched by the inner grid",
             "plot": "do not write the PNG plot"}
    plot_file = "macl_temperature_alignment.png"
    plot_layout = {"ncols": 2, "figsize": (10, 3.6)}

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--graphcl-exact", action="store_true",
                            help="GraphCL's code paths: ratios 0.1/0.2, quirks, unseeded CV")
        super().add_arguments(parser)

    @classmethod
    def config_from_args(cls, args: argparse.Namespace) -> TUConfig:
        with user_errors():
            params = config_kwargs(TUConfig, args)
            return TUConfig.graphcl_exact(**params) if args.graphcl_exact else TUConfig(**params)

    def prepare(self) -> None:
        """Each loss built once (its own argument checks), canonical dataset names, their raw
        folders, fingerprints and the folds they can fill; the device. Nothing is written."""
        cfg = self.config
        for loss in cfg.losses:
            build_loss(cfg, loss)
        self.data_root = resolve_data_root(cfg.data_root)
        cfg.device = resolve_device(cfg.device)
        self.sources: dict[str, Path] = {}
        for i, name in enumerate(cfg.datasets):
            canonical, raw = find_raw(self.data_root, name)
            check_folds(canonical, graph_label_counts(raw, canonical), cfg.folds, cfg.inner_folds)
            cfg.datasets[i] = canonical
            self.sources[canonical] = raw
            self.fingerprints[canonical] = fingerprint_files([raw], root=raw)
        self._loaded: dict[str, tuple[list, int, dict]] = {}

    def setup(self) -> None:
        """With ``--jobs``/``--cluster`` or ``--devices``: each dataset processed once here,
        before any job or rank reads it (torch-geometric writes ``processed/`` in place; two
        processes must not both write it; the other ranks start at the first pre-training)."""
        if self.jobs.parallel or self.config.devices > 1:
            for name in self.config.datasets:
                load_tu_graphs(self.config, name, self.sources[name],
                               self.fingerprints[name]["sha256"])

    def identity(self, cell: Cell) -> dict[str, Any]:
        return super().identity(cell) | devices_identity(self.config.devices,
                                                         self.config.strategy)

    def compute(self, cell: Cell) -> dict[str, Any] | None:
        cfg = self.config
        if cell.dataset not in self._loaded:
            self._loaded.clear()  # one dataset in memory at a time
            self._loaded[cell.dataset] = load_tu_graphs(
                cfg, cell.dataset, self.sources[cell.dataset],
                self.fingerprints[cell.dataset]["sha256"])
        graphs, dim, info = self._loaded[cell.dataset]
        log_dir = Path(cfg.output_dir) / "logs" / cell.dataset / cell.method / f"seed{cell.seed}"
        with rank_logger(cfg.logger, log_dir) as logger:
            record = run_one(cfg, cell, graphs, dim, logger=logger)
        return record | {"info": info} if record is not None else None

    def report_spec(self) -> dict[str, Any]:
        cfg = self.config

        def details(grid: GridRun) -> dict[str, Any]:
            infos = {c.dataset: r.get("info") for c, r in grid.records.items()}
            return {"datasets": {n: {"info": infos.get(n), "paper_table4": PAPER_TABLE4.get(n)}
                                 for n in cfg.datasets}}

        header = (f"# GraphCL on TU datasets: SVM accuracy (%)\n\nSeeds {cfg.seeds}; settings in "
                  "results.json. Mean ± population std over seeds; differences are paired over "
                  "seeds with a 95% t-interval; the paper columns are Huang et al. 2023 (MACL), "
                  "Table 4.\n\n")
        return {"baseline": "dcl" if "dcl" in cfg.losses else cfg.losses[0],
                "labels": {"dcl": "GraphCL (dcl)"},
                "header": header, "details": details, "drop": ["step_stats"],
                "extra": paper_columns(PAPER_TABLE4, {"dcl": "paper GraphCL",
                                                      "macl": "paper GraphCL w/ MACL"})}

    def draw(self, grid: GridRun, axes) -> None:
        """Alignment of every loss and the temperature over pre-training steps, first seed."""
        seed = min(c.seed for c in grid.records)
        draw_pretraining_curves(axes, {f"{c.dataset}/{c.method}": r.get("step_stats", {})
                                       for c, r in grid.records.items() if c.seed == seed})
        axes[0].set(title=f"seed {seed}")


RECIPE = TURecipe
