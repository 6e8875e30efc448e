"""The TU datasets of ``adaptcl tu``: found by name, copied to a writable folder (torch-geometric
writes ``processed/`` next to ``raw/``), loaded with node features."""

from __future__ import annotations

import collections
import contextlib
import io
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from adaptcl.recipes.engine.cells import RunLayout
from adaptcl.recipes.engine.files import load_or_rebuild
from adaptcl.recipes.tu.config import TUConfig


def find_raw(data_root: Path, name: str) -> tuple[str, Path]:
    """(canonical name, raw folder) of dataset ``name`` (case-insensitive) under ``data_root``."""
    for parent in (data_root / "tu", data_root):
        if parent.is_dir():
            for folder in sorted(parent.iterdir()):
                if folder.name.casefold() == name.casefold() and (folder / "raw").is_dir():
                    return folder.name, folder / "raw"
    raise FileNotFoundError(f"no TU raw folder for {name!r} under {str(data_root)!r} "
                            f"(looked for tu/{name}/raw and {name}/raw)")


def graph_label_counts(raw: Path, name: str) -> dict[str, int]:
    """Graphs per class, from the raw ``<name>_graph_labels.txt`` (read before any processing)."""
    path = raw / f"{name}_graph_labels.txt"
    if not path.is_file():
        raise FileNotFoundError(f"{str(raw)!r} has no {path.name} (a TU raw folder holds it)")
    return dict(collections.Counter(path.read_text().split()))


def check_folds(name: str, counts: dict[str, int], folds: int, inner_folds: int) -> None:
    """Refuse CV folds without a graph of every class, outer or inner (scikit-learn would only
    warn, and score folds without a class)."""
    smallest = min(counts.values(), default=0)
    if folds > smallest:
        raise ValueError(f"folds={folds} is more than {name} can stratify: its smallest class "
                         f"has {smallest} graphs ({sum(counts.values())} in all)")
    inner = smallest - -(-smallest // folds)  # the smallest class in an outer training part
    if inner_folds > inner:
        raise ValueError(f"inner_folds={inner_folds} is more than {name}'s outer training folds "
                         f"can stratify (the smallest class has {inner} graphs there)")


def prepare_tu_root(source: Path, name: str, work_dir: Path, fingerprint: str) -> Path:
    """Copy the raw folder to ``<work_dir>/<fingerprint>/<name>/raw`` (atomically, once): a
    changed source gets a fresh copy and ``processed/``, and the source is never written to."""
    root = work_dir / fingerprint[:16]
    target = root / name / "raw"
    if not target.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".raw."))
        try:  # file by file: a full disk is an OSError with its errno (copytree hides it)
            for path in source.iterdir():
                shutil.copyfile(path, tmp / path.name)  # ordinary permissions, not the source's
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone when replaced; a failed copy's rest
    return root


def load_tu_graphs(cfg: TUConfig, name: str, source: Path,
                   fingerprint: str) -> tuple[list[Any], int, dict[str, Any]]:
    """The dataset as a list of ``Data`` with node features; returns (graphs, dim, info)."""
    from torch_geometric.datasets import TUDataset

    from adaptcl.adapters.graphcl import CappedOneHotDegree, ConstantFeatures

    work_dir = Path(cfg.work_dir) if cfg.work_dir else RunLayout(cfg.output_dir).folder("data")
    root = prepare_tu_root(source, name, work_dir, fingerprint)

    def build() -> Any:  # TUDataset takes no ``log=``: its "Processing... Done!" goes to stderr
        with contextlib.nullcontext() if cfg.progress else contextlib.redirect_stderr(io.StringIO()):
            return TUDataset(str(root), name=name)

    dataset = load_or_rebuild(root / name / "processed", build, build,
                              what=f"processed {name} dataset")
    if dataset.num_features > 0:
        feature, desc = None, f"node labels ({dataset.num_features}-dim one-hot)"
    elif cfg.node_features == "constant":
        feature, desc = ConstantFeatures(), "constant x = 1 (GraphCL)"
    else:
        feature, desc = CappedOneHotDegree(cfg.max_degree), f"degree one-hot <= {cfg.max_degree}"
    graphs = [feature(g) if feature is not None else g for g in dataset]
    info = {"num_graphs": len(graphs), "num_features": int(graphs[0].x.size(1)),
            "features": desc, "num_classes": int(dataset.num_classes),
            "avg_nodes": sum(int(g.num_nodes) for g in graphs) / len(graphs)}
    return graphs, info["num_features"], info
