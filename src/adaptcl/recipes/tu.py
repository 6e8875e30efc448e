"""``adaptcl tu``: GraphCL pre-training on TU datasets, SVM evaluation, every loss in one table.

The unsupervised TU protocol of GraphCL (You et al., "Graph Contrastive Learning with
Augmentations", NeurIPS 2020), used by MACL (Huang et al., "Model-Aware Contrastive Learning:
Towards Escaping the Dilemmas", ICML 2023, Sec. 6.3, Table 4, App. B.5):

* data: ``torch_geometric.datasets.TUDataset`` read from ``<data-root>/tu/<NAME>/raw`` (or
  ``<data-root>/<NAME>/raw``); the raw folder is copied to a writable ``--work-dir`` first,
  because ``TUDataset`` writes ``processed/`` next to ``raw/``. Node labels are the features
  (``use_node_attr=False``, as GraphCL). Datasets without node features (IMDB-BINARY,
  REDDIT-BINARY) get ``x = ones(n, 1)`` (``--node-features constant``, GraphCL's choice) or a
  one-hot degree capped at ``--max-degree`` (``degree``);
* model: 3-layer, 32-wide GIN, sum pooling of every layer concatenated (96-dim), 2-layer
  projection head, Xavier init; Adam lr 0.01, batch 128, 20 epochs;
* views: the first view is the un-augmented graph (GraphCL's TU code), the second a
  GraphCL augmentation. ``--aug auto`` follows GraphCL's rule of thumb: ``random2`` (node
  dropping or subgraph) for the molecule / bioinformatics sets (MUTAG, PROTEINS, NCI1, DD...),
  ``random4`` (+ edge perturbation and attribute masking) for the social ones (IMDB, REDDIT,
  COLLAB); ratio 0.2 (the paper's default);
* loss: ``graphcl`` (DCL, cross-view, tau 0.2), ``macl`` (tau0 0.2, alpha 0.5, A0 0, no
  reweighting), ``infonce``;
* evaluation: embeddings of the un-augmented graphs (encoder output, no head, ``eval()``
  mode) after the last epoch, RBF SVC, stratified 10-fold CV with an inner 5-fold grid over
  C in {1e-3, ..., 1e3}; mean +- std (population) of the accuracies over seeds 0-4.

Reproduction switches: ``--graphcl-exact`` uses GraphCL's own code paths: ratios 0.1 (0.2 for
the subgraph), removal-only edge perturbation, one-hop subgraph and unseeded CV splits.
The default instead fixes the CV splits (``--cv-seed 0``: every loss and seed is evaluated on
the same folds) and uses the paper's augmentations; ``--classifier linear`` and
``--standardize`` are further options of the evaluation.

Resume: every finished (dataset, loss, seed) is written atomically to
``<out-dir>/runs/<config-hash>/<DATASET>/<loss>/seed<k>.json`` and skipped on rerun; the
config hash covers every setting that changes a result, so a changed setting never reuses a
stale run. ``results.json``, ``results.md`` and ``macl_temperature_alignment.png`` are
rewritten from all finished runs at the end.

Example::

    adaptcl tu --data-root /path/to/data --datasets MUTAG PROTEINS --losses graphcl macl \\
        --seeds 0 1 2 3 4 --out-dir results/tu
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptcl.recipes._common import (
    markdown_table,
    mean_std,
    read_json,
    resolve_data_root,
    save_figure_atomic,
    seed_everything,
    write_json_atomic,
    write_text_atomic,
)

SOCIAL_DATASETS = ("IMDB-BINARY", "IMDB-MULTI", "REDDIT-BINARY", "REDDIT-MULTI-5K", "COLLAB")

# Huang et al. 2023 (MACL), Table 4: accuracy % (mean, std) of GraphCL and GraphCL w/ MACL.
PAPER_TABLE4: dict[str, dict[str, tuple[float, float]]] = {
    "NCI1": {"graphcl": (77.87, 0.41), "macl": (78.41, 0.47)},
    "PROTEINS": {"graphcl": (74.39, 0.45), "macl": (74.47, 0.85)},
    "MUTAG": {"graphcl": (86.80, 1.34), "macl": (89.04, 0.98)},
    "REDDIT-BINARY": {"graphcl": (89.53, 0.84), "macl": (90.59, 0.36)},
    "DD": {"graphcl": (78.62, 0.40), "macl": (78.80, 0.66)},
    "IMDB-BINARY": {"graphcl": (71.14, 0.44), "macl": (71.42, 1.05)},
}

# settings that change a result (they enter the config hash); the rest is bookkeeping
_RESULT_FIELDS = (
    "epochs", "batch_size", "lr", "hidden", "layers", "temperature", "alpha", "a0", "aug",
    "aug_ratio", "subgraph_ratio", "graphcl_quirks", "first_view", "node_features",
    "max_degree", "folds", "inner_folds", "c_grid", "classifier", "standardize", "cv_seed",
)


@dataclass
class TUConfig:
    """Settings of a ``tu`` run; defaults are GraphCL's TU setting with fixed CV seeds."""

    datasets: list[str] = field(default_factory=lambda: ["MUTAG"])
    losses: list[str] = field(default_factory=lambda: ["graphcl", "macl"])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    data_root: str | None = None
    out_dir: str = "results/tu"
    work_dir: str | None = None  # default <out_dir>/data
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
    threads: int = 1
    progress: bool = True
    plot: bool = True

    def __post_init__(self) -> None:
        from adaptcl.recipes.graph_eval import CLASSIFIERS

        if self.first_view not in ("identity", "augmented"):
            raise ValueError(f"first_view must be 'identity' or 'augmented', got {self.first_view!r}")
        if self.node_features not in ("constant", "degree"):
            raise ValueError(f"node_features must be 'constant' or 'degree', got {self.node_features!r}")
        if self.classifier not in CLASSIFIERS:
            raise ValueError(f"classifier must be one of {CLASSIFIERS}, got {self.classifier!r}")
        for name in ("epochs", "batch_size", "hidden", "layers", "folds", "inner_folds"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not self.datasets or not self.losses or not self.seeds:
            raise ValueError("datasets, losses and seeds must not be empty")

    @classmethod
    def graphcl_exact(cls, **overrides: Any) -> TUConfig:
        """GraphCL's own code paths: ratios 0.1 / subgraph 0.2, quirks on, unseeded CV."""
        params: dict[str, Any] = {"aug_ratio": 0.1, "subgraph_ratio": 0.2,
                                  "graphcl_quirks": True, "cv_seed": None,
                                  "first_view": "identity", "node_features": "constant"}
        params.update(overrides)
        return cls(**params)

    def result_key(self) -> str:
        """Short hash of every setting that changes a (dataset, loss, seed) result."""
        payload = {name: getattr(self, name) for name in _RESULT_FIELDS}
        blob = json.dumps(payload, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


# ---------------------------------------------------------------------------------- data


def _raw_source(data_root: Path, name: str) -> Path:
    for candidate in (data_root / "tu" / name / "raw", data_root / name / "raw"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"no TU raw folder for {name!r} under {str(data_root)!r} "
        f"(looked for tu/{name}/raw and {name}/raw)")


def prepare_tu_root(data_root: Path, name: str, work_dir: Path) -> Path:
    """Copy ``<data_root>/[tu/]<name>/raw`` to ``<work_dir>/<name>/raw`` (once); return work_dir.

    The source is never written to: ``TUDataset`` creates ``processed/`` in the copy.
    """
    source = _raw_source(data_root, name)
    target = work_dir / name / "raw"
    marker = work_dir / name / ".copied"
    if not marker.exists():
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, target)
        for path in target.iterdir():  # the shared copy is read-only; the work copy need not be
            path.chmod(0o644)
        target.chmod(0o755)
        marker.write_text(str(source) + "\n")
    return work_dir


def load_tu_graphs(cfg: TUConfig, name: str) -> tuple[list, int, dict[str, Any]]:
    """Load a TU dataset as a list of ``Data`` with node features; return (graphs, dim, info)."""
    from adaptcl.adapters import require

    require("torch_geometric", "graph")
    from torch_geometric.datasets import TUDataset

    from adaptcl.adapters.graphcl import CappedOneHotDegree, ConstantFeatures

    data_root = resolve_data_root(cfg.data_root)
    work_dir = Path(cfg.work_dir) if cfg.work_dir else Path(cfg.out_dir) / "data"
    root = prepare_tu_root(data_root, name, work_dir)
    dataset = TUDataset(str(root), name=name)
    has_x = dataset.num_features > 0
    if has_x:
        feature = None
        feature_desc = f"node labels ({dataset.num_features}-dim one-hot)"
    elif cfg.node_features == "constant":
        feature = ConstantFeatures()
        feature_desc = "constant x = 1 (GraphCL)"
    else:
        feature = CappedOneHotDegree(cfg.max_degree)
        feature_desc = f"one-hot degree capped at {cfg.max_degree}"
    graphs = []
    for i in range(len(dataset)):
        g = dataset[i]
        graphs.append(feature(g) if feature is not None else g)
    dim = int(graphs[0].x.size(1))
    info = {
        "num_graphs": len(graphs),
        "num_features": dim,
        "features": feature_desc,
        "avg_nodes": sum(int(g.num_nodes) for g in graphs) / len(graphs),
        "num_classes": int(dataset.num_classes),
    }
    return graphs, dim, info


def resolve_aug(cfg: TUConfig, name: str) -> str:
    if cfg.aug != "auto":
        return cfg.aug
    return "random4" if name.upper() in SOCIAL_DATASETS else "random2"


def build_views(cfg: TUConfig, name: str, generator):
    """The two view transforms of a run (first view identity unless ``first_view='augmented'``)."""
    from adaptcl.adapters.graphcl import (
        AttrMask,
        EdgePerturb,
        Identity,
        NodeDrop,
        RandomChoice,
        Subgraph,
    )

    aug = resolve_aug(cfg, name)
    r = cfg.aug_ratio
    rs = cfg.subgraph_ratio if cfg.subgraph_ratio is not None else r
    quirks = cfg.graphcl_quirks

    def make(kind: str):
        if kind == "dnodes":
            return NodeDrop(r, generator=generator)
        if kind == "pedges":
            return EdgePerturb(r, add_edges=not quirks, undirected=not quirks,
                               generator=generator)
        if kind == "mask_nodes":
            return AttrMask(r, mode="gaussian", generator=generator)
        if kind == "subgraph":
            return Subgraph(rs, one_hop=quirks, generator=generator)
        raise ValueError(f"unknown augmentation {kind!r}")

    pools = {"random2": ("dnodes", "subgraph"), "random3": ("dnodes", "pedges", "subgraph"),
             "random4": ("dnodes", "pedges", "subgraph", "mask_nodes")}
    if aug == "none":
        view1 = Identity()
    elif aug in pools:
        view1 = RandomChoice([make(k) for k in pools[aug]], generator=generator)
    else:
        view1 = make(aug)
    view0 = Identity() if cfg.first_view == "identity" else view1
    return view0, view1, aug


# ------------------------------------------------------------------------------ training


def embed_graphs(model, graphs, batch_size: int = 256):
    """Encoder embeddings (no projection head) of ``graphs`` in ``eval()`` mode, and labels."""
    import torch
    from torch_geometric.loader import DataLoader

    model.eval()
    embs, labels = [], []
    with torch.no_grad():
        for batch in DataLoader(graphs, batch_size=batch_size, shuffle=False):
            embs.append(model.embed(batch))
            labels.append(batch.y.view(-1))
    return torch.cat(embs).numpy(), torch.cat(labels).numpy()


def run_one(cfg: TUConfig, name: str, loss_name: str, seed: int, graphs, in_dim: int,
            position: int = 1) -> dict[str, Any]:
    """Pre-train one model and evaluate it with the SVM protocol; return the run record."""
    import torch
    from torch_geometric.loader import DataLoader

    from adaptcl.adapters.graphcl import (
        GraphCL,
        TUGINEncoder,
        TwoViewDataset,
        graphcl_loss,
        train_epoch,
    )
    from adaptcl.recipes.graph_eval import svm_cv_accuracy

    seed_everything(seed)
    aug_gen = torch.Generator().manual_seed(10_000 + seed)
    loader_gen = torch.Generator().manual_seed(20_000 + seed)
    view0, view1, aug = build_views(cfg, name, aug_gen)
    extra = {"alpha": cfg.alpha, "a0": cfg.a0} if loss_name == "macl" else {}
    loss_fn = graphcl_loss(loss_name, temperature=cfg.temperature, **extra)
    model = GraphCL(TUGINEncoder(in_dim, cfg.hidden, cfg.layers), loss_fn=loss_fn)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    loader = DataLoader(TwoViewDataset(graphs, view0, view1), batch_size=cfg.batch_size,
                        shuffle=True, generator=loader_gen)

    history: dict[str, list[float]] = {}
    epoch_loss: list[float] = []
    t0 = time.perf_counter()
    epochs = range(cfg.epochs)
    if cfg.progress:
        from tqdm.auto import tqdm

        epochs = tqdm(epochs, desc=f"{name}/{loss_name}/seed{seed}", leave=False,
                      position=position, dynamic_ncols=True)
    for _ in epochs:
        epoch_loss.append(train_epoch(model, loader, optimizer, history,
                                      where=f"{name}/{loss_name}/seed{seed}"))
        if cfg.progress:
            epochs.set_postfix(loss=f"{epoch_loss[-1]:.3f}")
    train_seconds = time.perf_counter() - t0

    t1 = time.perf_counter()
    x, y = embed_graphs(model, graphs)
    evaluation = svm_cv_accuracy(x, y, folds=cfg.folds, inner_folds=cfg.inner_folds,
                                 c_grid=cfg.c_grid, classifier=cfg.classifier,
                                 cv_seed=cfg.cv_seed, standardize=cfg.standardize)
    eval_seconds = time.perf_counter() - t1
    return {
        "dataset": name, "loss": loss_name, "seed": seed, "aug": aug,
        "loss_module": repr(loss_fn),
        "accuracy": evaluation["accuracy"], "evaluation": evaluation,
        "epoch_loss": epoch_loss, "step_stats": history,
        "embedding_dim": int(x.shape[1]),
        "train_seconds": train_seconds, "eval_seconds": eval_seconds,
        "torch_threads": torch.get_num_threads(),
    }


# ------------------------------------------------------------------------------- results


def run_path(cfg: TUConfig, name: str, loss_name: str, seed: int) -> Path:
    return (Path(cfg.out_dir) / "runs" / cfg.result_key() / name / loss_name
            / f"seed{seed}.json")


def summarize(cfg: TUConfig, runs: dict[tuple[str, str, int], dict[str, Any]],
              infos: dict[str, Any]) -> dict[str, Any]:
    """Aggregate finished runs: mean +- std (%) per (dataset, loss), next to the paper's."""
    summary: dict[str, Any] = {}
    for name in cfg.datasets:
        per_loss = {}
        for loss_name in cfg.losses:
            accs = [runs[(name, loss_name, s)]["accuracy"] for s in cfg.seeds
                    if (name, loss_name, s) in runs]
            if not accs:
                continue
            mean, std = mean_std([100.0 * a for a in accs])
            secs = [runs[(name, loss_name, s)]["train_seconds"]
                    + runs[(name, loss_name, s)]["eval_seconds"] for s in cfg.seeds
                    if (name, loss_name, s) in runs]
            per_loss[loss_name] = {"mean": mean, "std": std, "n_seeds": len(accs),
                                   "accuracies": [100.0 * a for a in accs],
                                   "seconds_per_seed": sum(secs) / len(secs),
                                   "total_seconds": sum(secs)}
        summary[name] = {"info": infos.get(name), "losses": per_loss,
                         "paper_table4": PAPER_TABLE4.get(name)}
    return summary


def results_table(cfg: TUConfig, summary: dict[str, Any]) -> str:
    rows = []
    for name in cfg.datasets:
        entry = summary.get(name, {})
        row: dict[str, Any] = {"dataset": name}
        for loss_name in cfg.losses:
            stats = entry.get("losses", {}).get(loss_name)
            row[f"ours {loss_name}"] = (
                f"{stats['mean']:.2f} ± {stats['std']:.2f} (n={stats['n_seeds']})"
                if stats else "-")
        secs = [v["seconds_per_seed"] for v in entry.get("losses", {}).values()]
        row["s/run"] = f"{sum(secs) / len(secs):.0f}" if secs else "-"
        paper = PAPER_TABLE4.get(name)
        row["paper GraphCL"] = f"{paper['graphcl'][0]:.2f} ± {paper['graphcl'][1]:.2f}" if paper else "-"
        row["paper GraphCL w/ MACL"] = f"{paper['macl'][0]:.2f} ± {paper['macl'][1]:.2f}" if paper else "-"
        rows.append(row)
    return markdown_table(rows)


def plot_stats(cfg: TUConfig, runs: dict[tuple[str, str, int], dict[str, Any]],
               path: Path) -> Path | None:
    """Alignment (every loss) and MACL's temperature over pre-training steps, first seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seed = cfg.seeds[0]
    names = [n for n in cfg.datasets if any((n, ln, seed) in runs for ln in cfg.losses)]
    if not names:
        return None
    fig, axes = plt.subplots(2, len(names), figsize=(4 * len(names), 6), squeeze=False)
    for j, name in enumerate(names):
        for loss_name in cfg.losses:
            run = runs.get((name, loss_name, seed))
            if run is None:
                continue
            stats = run["step_stats"]
            if "alignment" in stats:
                axes[0][j].plot(stats["alignment"], label=loss_name, lw=1)
            if "temperature" in stats:
                axes[1][j].plot(stats["temperature"], label=loss_name, lw=1)
        axes[0][j].set_title(f"{name} (seed {seed})")
        axes[0][j].set_ylabel("alignment A (mean positive cosine)")
        axes[1][j].set_ylabel("temperature")
        axes[1][j].set_xlabel("pre-training step")
        for ax in (axes[0][j], axes[1][j]):
            if ax.lines:
                ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure_atomic(fig, path)


def run_tu(cfg: TUConfig) -> dict[str, Any]:
    """Run every (dataset, loss, seed) not finished yet, then write the result files.

    Returns the result dict (also written to ``<out_dir>/results.json``) with ``computed``
    and ``skipped`` lists of ``[dataset, loss, seed]``.
    """
    import torch

    torch.set_num_threads(max(1, int(cfg.threads)))
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    key = cfg.result_key()
    write_json_atomic(out_dir / "runs" / key / "config.json", dataclasses.asdict(cfg))

    jobs = [(n, ln, s) for n in cfg.datasets for ln in cfg.losses for s in cfg.seeds]
    runs: dict[tuple[str, str, int], dict[str, Any]] = {}
    infos: dict[str, Any] = {}
    computed, skipped = [], []
    todo = []
    for job in jobs:
        path = run_path(cfg, *job)
        if path.exists():
            runs[job] = read_json(path)
            skipped.append(list(job))
        else:
            todo.append(job)

    bar = None
    if cfg.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(jobs), initial=len(skipped), desc="tu runs", position=0,
                   dynamic_ncols=True)
    loaded: dict[str, tuple[list, int]] = {}
    t_start = time.perf_counter()
    for name, loss_name, seed in todo:
        if name not in loaded:
            loaded.clear()  # keep one dataset in memory at a time
            graphs, dim, info = load_tu_graphs(cfg, name)
            loaded[name] = (graphs, dim)
            infos[name] = info
        graphs, dim = loaded[name]
        if bar is not None:
            bar.set_postfix_str(f"{name}/{loss_name}/seed{seed}")
        record = run_one(cfg, name, loss_name, seed, graphs, dim)
        record["config_key"] = key
        write_json_atomic(run_path(cfg, name, loss_name, seed), record)
        runs[(name, loss_name, seed)] = record
        computed.append([name, loss_name, seed])
        _write_results(cfg, jobs, runs, infos, computed, skipped, t_start)  # partial table
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    result = _write_results(cfg, jobs, runs, infos, computed, skipped, t_start)
    if cfg.plot and runs:
        plot = plot_stats(cfg, runs, out_dir / "macl_temperature_alignment.png")
        result["plot"] = str(plot) if plot else None
    return result


def _write_results(cfg: TUConfig, jobs: list, runs: dict, infos: dict, computed: list,
                   skipped: list, t_start: float) -> dict[str, Any]:
    """(Re)write results.json and results.md from every finished run, atomically."""
    out_dir = Path(cfg.out_dir)
    key = cfg.result_key()
    for name in cfg.datasets:  # dataset facts for the table even when every run was skipped
        info_path = out_dir / "runs" / key / name / "info.json"
        if name in infos:
            if not info_path.exists():
                write_json_atomic(info_path, infos[name])
        elif info_path.exists():
            infos[name] = read_json(info_path)
    summary = summarize(cfg, runs, infos)
    table = results_table(cfg, summary)
    result = {
        "recipe": "tu",
        "config": dataclasses.asdict(cfg),
        "config_key": key,
        "complete": all(j in runs for j in jobs),
        "summary": summary,
        "runs": [runs[j] | {"step_stats": None} for j in jobs if j in runs],
        "computed": list(computed),
        "skipped": list(skipped),
        "wall_seconds_this_call": time.perf_counter() - t_start,
        "table_markdown": table,
    }
    write_json_atomic(out_dir / "results.json", result)
    write_text_atomic(out_dir / "results.md", _markdown_report(cfg, table))
    return result


def _markdown_report(cfg: TUConfig, table: str) -> str:
    lines = [
        "# GraphCL on TU datasets: SVM accuracy (%)",
        "",
        f"Seeds {cfg.seeds}, {cfg.epochs} epochs, batch {cfg.batch_size}, lr {cfg.lr}, "
        f"GIN {cfg.layers}x{cfg.hidden}, tau {cfg.temperature}, MACL alpha {cfg.alpha} "
        f"A0 {cfg.a0}; aug {cfg.aug} (ratio {cfg.aug_ratio}), first view {cfg.first_view}, "
        f"GraphCL quirks {cfg.graphcl_quirks}; {cfg.classifier} with {cfg.folds}-fold CV "
        f"(inner {cfg.inner_folds}-fold grid over C), CV seed {cfg.cv_seed}, "
        f"standardize {cfg.standardize}. Mean ± population std over seeds; the paper columns "
        "are Huang et al. 2023 (MACL), Table 4.",
        "",
        table,
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = TUConfig()
    parser.add_argument("--data-root", default=None,
                        help="folder holding tu/<NAME>/raw (or <NAME>/raw); default $ADAPTCL_DATA")
    parser.add_argument("--datasets", nargs="+", default=d.datasets)
    parser.add_argument("--losses", nargs="+", default=d.losses,
                        choices=["graphcl", "dcl", "infonce", "macl"])
    parser.add_argument("--seeds", nargs="+", type=int, default=d.seeds)
    parser.add_argument("--out-dir", default=d.out_dir)
    parser.add_argument("--work-dir", default=None,
                        help="writable copy of the raw data + processed/ (default <out-dir>/data)")
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--hidden", type=int, default=d.hidden)
    parser.add_argument("--layers", type=int, default=d.layers)
    parser.add_argument("--temperature", type=float, default=d.temperature,
                        help="tau (tau0 for MACL)")
    parser.add_argument("--alpha", type=float, default=d.alpha)
    parser.add_argument("--a0", type=float, default=d.a0)
    parser.add_argument("--aug", default=d.aug,
                        choices=["auto", "none", "dnodes", "pedges", "mask_nodes", "subgraph",
                                 "random2", "random3", "random4"])
    parser.add_argument("--aug-ratio", type=float, default=None,
                        help=f"augmentation ratio (default {d.aug_ratio}; 0.1 with --graphcl-exact)")
    parser.add_argument("--subgraph-ratio", type=float, default=None,
                        help="fraction of nodes the subgraph removes (default: --aug-ratio)")
    parser.add_argument("--first-view", choices=["identity", "augmented"], default=d.first_view)
    parser.add_argument("--graphcl-quirks", action="store_true",
                        help="removal-only edge perturbation and one-hop subgraph")
    parser.add_argument("--graphcl-exact", action="store_true",
                        help="GraphCL's code paths: ratios 0.1/0.2, quirks, unseeded CV")
    parser.add_argument("--node-features", choices=["constant", "degree"],
                        default=d.node_features)
    parser.add_argument("--max-degree", type=int, default=d.max_degree)
    parser.add_argument("--folds", type=int, default=d.folds)
    parser.add_argument("--inner-folds", type=int, default=d.inner_folds)
    parser.add_argument("--classifier", choices=["svc", "linear"], default=d.classifier)
    parser.add_argument("--standardize", action="store_true")
    parser.add_argument("--cv-seed", default=str(d.cv_seed),
                        help="seed of the CV splits, or 'none' for GraphCL's unseeded splits")
    parser.add_argument("--threads", type=int, default=d.threads,
                        help="torch threads (default 1)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--no-plot", action="store_true")


def config_from_args(args: argparse.Namespace) -> TUConfig:
    cv_seed = None if str(args.cv_seed).lower() == "none" else int(args.cv_seed)
    params: dict[str, Any] = {
        "datasets": args.datasets, "losses": args.losses, "seeds": args.seeds,
        "data_root": args.data_root, "out_dir": args.out_dir, "work_dir": args.work_dir,
        "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
        "hidden": args.hidden, "layers": args.layers, "temperature": args.temperature,
        "alpha": args.alpha, "a0": args.a0, "aug": args.aug,
        "first_view": args.first_view, "node_features": args.node_features,
        "max_degree": args.max_degree, "folds": args.folds, "inner_folds": args.inner_folds,
        "classifier": args.classifier, "standardize": args.standardize,
        "threads": args.threads, "progress": not args.no_progress, "plot": not args.no_plot,
    }
    if args.aug_ratio is not None:
        params["aug_ratio"] = args.aug_ratio
    if args.subgraph_ratio is not None:
        params["subgraph_ratio"] = args.subgraph_ratio
    if args.graphcl_exact:
        if str(args.cv_seed) != str(TUConfig().cv_seed):
            params["cv_seed"] = cv_seed
        return TUConfig.graphcl_exact(**params)
    params["cv_seed"] = cv_seed
    params["graphcl_quirks"] = args.graphcl_quirks
    return TUConfig(**params)


def main(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    result = run_tu(cfg)
    print(result["table_markdown"])
    print(f"results: {Path(cfg.out_dir) / 'results.json'}  table: "
          f"{Path(cfg.out_dir) / 'results.md'}")
    return 0
