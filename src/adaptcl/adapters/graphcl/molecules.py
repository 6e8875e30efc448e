"""Molecules as torch-geometric graphs: OGB featurisation, MoleculeNet CSVs, scaffold split.

* :func:`smiles_to_data` / :func:`featurise_smiles` -- SMILES to
  :class:`~torch_geometric.data.Data` with OGB's featurisation (``ogb.utils.smiles2graph``, RDKit):
  ``x`` [n, 9] and ``edge_attr`` [E, 3] as integer categories (what
  :class:`~adaptcl.adapters.graphcl.MolGINEncoder`'s ``AtomEncoder``/``BondEncoder`` read),
  ``edge_index`` [2, E] with both directions of every bond. SMILES that RDKit rejects, or that
  give a molecule without atoms, are skipped and counted, never fatal.
* :class:`MoleculeDataset` -- an in-memory list of graphs with SMILES, task names and the
  invalid-row bookkeeping; :func:`load_moleculenet` and :func:`load_smiles_dataset` build it
  and keep a processed cache on disk, keyed by the source file's sha256, the columns read, the
  row limit and :data:`FEATURISER_VERSION` (plus the installed ogb and RDKit versions), so a
  changed file or featuriser never reuses a stale cache.
* :data:`MOLECULENET` -- the eight classification sets of MoleculeNet (Wu et al., "MoleculeNet:
  a benchmark for molecular machine learning", Chem. Sci. 2018) in the layout redistributed by
  Hu et al. 2020, columns read *by name* (the chemprop copies of MUV and ToxCast do not follow
  torch-geometric's fixed column layout). Labels are ``y`` [1, T] float with ``NaN`` for a
  missing label; :func:`label_mask` gives the mask.
* :func:`scaffold_split` -- the deterministic Bemis-Murcko scaffold split of Hu et al.,
  "Strategies for Pre-training Graph Neural Networks" (ICLR 2020), used by GraphCL (You et al.,
  NeurIPS 2020) for transfer learning: scaffolds from
  ``MurckoScaffold.MurckoScaffoldSmiles(includeChirality=True)``, scaffold sets sorted by size
  (largest first), ties broken exactly as Hu et al.'s ``splitters.py`` does
  (``sorted(key=(len(set), set[0]), reverse=True)``: among equal sizes the set whose first
  molecule comes later goes first), then greedily filled into train (80 %), valid (10 %) and
  test (10 %).

Example::

    from torch_geometric.loader import DataLoader
    from adaptcl.adapters.graphcl.molecules import load_moleculenet, scaffold_split

    ds = load_moleculenet("bbbp", data_root="/path/to/data", cache_dir="/tmp/cache")
    train, valid, test = scaffold_split(ds.smiles)
    loader = DataLoader(ds.subset(train), batch_size=32, shuffle=True)
    print(ds.num_tasks, ds.num_invalid, len(train), len(valid), len(test))
"""

from __future__ import annotations

import copy
import csv
import gzip
import hashlib
import io
import json
import math
import os
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from adaptcl.adapters import require
from adaptcl.io import atomic_write

require("torch_geometric", "graph")

import torch  # noqa: E402
from torch import Tensor  # noqa: E402
from torch_geometric.data import Data  # noqa: E402

__all__ = [
    "FEATURISER_VERSION",
    "MOLECULENET",
    "MoleculeNetSpec",
    "MoleculeDataset",
    "smiles_to_data",
    "featurise_smiles",
    "read_smiles_file",
    "read_moleculenet_csv",
    "load_moleculenet",
    "load_smiles_dataset",
    "label_mask",
    "murcko_scaffold",
    "scaffold_split",
]

# Bump when the graphs produced from a SMILES change (invalidates every processed cache).
FEATURISER_VERSION = "ogb-smiles2graph/1"


# --------------------------------------------------------------------------- featurisation


def _ogb_smiles2graph():
    require("ogb", "graph")
    require("rdkit", "graph")
    from ogb.utils import smiles2graph

    return smiles2graph


class _QuietRDKit:
    """Silence RDKit's parse warnings while featurising (invalid SMILES are counted instead)."""

    def __enter__(self):
        from rdkit import rdBase

        self._block = rdBase.BlockLogs()
        return self

    def __exit__(self, *exc) -> None:
        del self._block


def smiles_to_data(smiles: str, y: Tensor | None = None) -> Data | None:
    """One SMILES to a ``Data`` with OGB features, or ``None`` if RDKit rejects it.

    ``x`` int64 [n, 9], ``edge_index`` int64 [2, E], ``edge_attr`` int64 [E, 3] (OGB's
    ``atom_to_feature_vector`` / ``bond_to_feature_vector``); ``y`` is attached as given.
    A molecule with no atom (e.g. an empty SMILES) also gives ``None``.
    """
    smiles2graph = _ogb_smiles2graph()
    with _QuietRDKit():
        return _to_data(smiles2graph, smiles, y)


def _to_data(smiles2graph, smiles: str, y: Tensor | None) -> Data | None:
    if not isinstance(smiles, str) or not smiles.strip():
        return None
    try:
        graph = smiles2graph(smiles.strip())
    except Exception:  # RDKit returns None for invalid SMILES and smiles2graph then fails
        return None
    if graph["num_nodes"] == 0:
        return None
    data = Data(x=torch.from_numpy(graph["node_feat"]).long(),
                edge_index=torch.from_numpy(graph["edge_index"]).long(),
                edge_attr=torch.from_numpy(graph["edge_feat"]).long())
    data.num_nodes = int(graph["num_nodes"])
    if y is not None:
        data.y = y
    return data


def featurise_smiles(smiles: Sequence[str], labels: Tensor | None = None,
                     progress: bool = False) -> tuple[list[Data], list[int]]:
    """Featurise many SMILES; return (graphs of the valid ones, indices of the invalid ones).

    ``labels`` [len(smiles), T] (optional) gives graph ``i`` the label row ``labels[i:i+1]``.
    """
    smiles2graph = _ogb_smiles2graph()
    if labels is not None and labels.size(0) != len(smiles):
        raise ValueError(f"{len(smiles)} SMILES but {labels.size(0)} label rows")
    graphs: list[Data] = []
    invalid: list[int] = []
    iterator: Iterable[int] = range(len(smiles))
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc="featurise", leave=False, dynamic_ncols=True)
    with _QuietRDKit():
        for i in iterator:
            y = labels[i:i + 1].clone() if labels is not None else None
            data = _to_data(smiles2graph, smiles[i], y)
            if data is None:
                invalid.append(i)
            else:
                graphs.append(data)
    return graphs, invalid


# ------------------------------------------------------------------------------ CSV input


def _open_text(path: Path):
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def read_smiles_file(path: str | os.PathLike, column: str | None = None,
                     limit: int | None = None) -> list[str]:
    """SMILES from a text/CSV file (``.gz`` allowed), in file order, at most ``limit``.

    With ``column`` the first line is a header that must hold it; without, a first line with a
    column called ``smiles`` (any case) is a header and that column is read, otherwise every
    line is one SMILES (its first comma- or whitespace-separated field).
    """
    path = Path(path)
    out: list[str] = []
    with _open_text(path) as handle:
        reader = csv.reader(handle)
        first = next(reader, None)
        if first is None:
            return out
        names = [c.strip() for c in first]
        idx = None
        if column:
            if column not in names:
                raise KeyError(f"column {column!r} not in the header of {str(path)!r}: "
                               f"{names[:10]}")
            idx = names.index(column)
        else:
            lowered = [c.lower() for c in names]
            if "smiles" in lowered:
                idx = lowered.index("smiles")
        rows: Iterable[list[str]] = reader
        if idx is None:  # no header: the first line is data
            idx = 0
            rows = _chain([first], reader)
        for row in rows:
            if limit is not None and len(out) >= limit:
                break
            if not row:
                continue
            field = row[idx].strip() if idx < len(row) else ""
            if idx == 0 and " " in field:
                field = field.split()[0]
            if field:
                out.append(field)
    return out


def _chain(*iterables):
    for it in iterables:
        yield from it


@dataclass(frozen=True)
class MoleculeNetSpec:
    """Where a MoleculeNet set lives and which columns hold its SMILES and tasks.

    ``tasks=None`` means every column except ``smiles_column`` and ``exclude``.
    """

    name: str
    filename: str
    smiles_column: str
    tasks: tuple[str, ...] | None
    exclude: tuple[str, ...] = ()

    def path(self, data_root: str | os.PathLike) -> Path:
        root = Path(data_root)
        for candidate in (root / "moleculenet" / self.name / "raw" / self.filename,
                          root / self.name / "raw" / self.filename):
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(
            f"no {self.filename} for {self.name!r} under {str(root)!r} (looked for "
            f"moleculenet/{self.name}/raw/{self.filename} and {self.name}/raw/{self.filename})")


_TOX21 = ("NR-AR", "NR-AR-LBD", "NR-AhR", "NR-Aromatase", "NR-ER", "NR-ER-LBD",
          "NR-PPAR-gamma", "SR-ARE", "SR-ATAD5", "SR-HSE", "SR-MMP", "SR-p53")
_MUV = ("MUV-466", "MUV-548", "MUV-600", "MUV-644", "MUV-652", "MUV-689", "MUV-692",
        "MUV-712", "MUV-713", "MUV-733", "MUV-737", "MUV-810", "MUV-832", "MUV-846",
        "MUV-852", "MUV-858", "MUV-859")

#: The eight MoleculeNet classification sets of Hu et al. 2020 / GraphCL / MACL Table 5, with
#: the task columns of Hu et al.'s loaders (``chem/loader.py``).
MOLECULENET: dict[str, MoleculeNetSpec] = {
    "bbbp": MoleculeNetSpec("bbbp", "BBBP.csv", "smiles", ("p_np",)),
    "tox21": MoleculeNetSpec("tox21", "tox21.csv", "smiles", _TOX21),
    "toxcast": MoleculeNetSpec("toxcast", "toxcast.csv.gz", "smiles", None),
    "sider": MoleculeNetSpec("sider", "sider.csv", "smiles", None),
    "clintox": MoleculeNetSpec("clintox", "clintox.csv", "smiles", ("FDA_APPROVED", "CT_TOX")),
    "muv": MoleculeNetSpec("muv", "muv.csv.gz", "smiles", _MUV),
    "hiv": MoleculeNetSpec("hiv", "HIV.csv", "smiles", ("HIV_active",)),
    "bace": MoleculeNetSpec("bace", "bace.csv", "mol", ("Class",)),
}


def _spec(name: str) -> MoleculeNetSpec:
    key = name.lower()
    if key not in MOLECULENET:
        raise ValueError(f"unknown MoleculeNet set {name!r}; choose from {', '.join(MOLECULENET)}")
    return MOLECULENET[key]


def _parse_label(value: str, where: str) -> float:
    """A binary label: 0, 1, or NaN for a missing one; ``where`` names file, line and column."""
    value = value.strip()
    if value == "" or value.lower() in ("nan", "na"):
        return math.nan
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"label {value!r} at {where} is not a number (0, 1 or empty)") from None
    if number not in (0.0, 1.0):
        raise ValueError(f"label {value!r} at {where} is not 0, 1 or empty")
    return number


def read_moleculenet_csv(name: str, data_root: str | os.PathLike,
                         limit: int | None = None) -> tuple[list[str], Tensor, list[str]]:
    """Read a MoleculeNet CSV by column name: (SMILES, labels [N, T] with NaN, task names)."""
    spec = _spec(name)
    path = spec.path(data_root)
    with _open_text(path) as handle:
        reader = csv.reader(handle)
        header = [c.strip() for c in next(reader)]
        if spec.smiles_column not in header:
            raise KeyError(f"{str(path)!r} has no column {spec.smiles_column!r}")
        if spec.tasks is None:
            tasks = [c for c in header if c != spec.smiles_column and c not in spec.exclude]
        else:
            missing = [t for t in spec.tasks if t not in header]
            if missing:
                raise KeyError(f"{str(path)!r} lacks task columns {missing}")
            tasks = list(spec.tasks)
        s_idx = header.index(spec.smiles_column)
        t_idx = [header.index(t) for t in tasks]
        smiles: list[str] = []
        rows: list[list[float]] = []
        for line_no, row in enumerate(reader, start=2):
            if limit is not None and len(smiles) >= limit:
                break
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise ValueError(f"{str(path)!r} line {line_no}: {len(row)} fields, "
                                 f"header has {len(header)}")
            smiles.append(row[s_idx].strip())
            rows.append([_parse_label(row[j], f"{path}:{line_no}, column {header[j]!r}")
                         for j in t_idx])
    labels = torch.tensor(rows, dtype=torch.float32).reshape(len(rows), len(tasks))
    return smiles, labels, tasks


def label_mask(y: Tensor) -> Tensor:
    """``True`` where a label is present (labels are ``NaN`` where missing)."""
    return ~torch.isnan(y)


# ---------------------------------------------------------------------------- the dataset


class MoleculeDataset(torch.utils.data.Dataset):
    """In-memory molecular graphs with their SMILES, task names and invalid-row counts.

    ``graphs[i]`` came from ``smiles[i]``, which was row ``rows[i]`` of the source;
    ``invalid_rows`` are the source rows RDKit rejected. Works with torch-geometric's
    ``DataLoader`` directly; :meth:`subset` keeps the bookkeeping. Indexing returns a shallow
    copy, so a transform that reassigns ``x``/``edge_index`` never alters the stored graph.
    """

    def __init__(self, graphs: list[Data], smiles: list[str], rows: list[int],
                 task_names: list[str], invalid_rows: list[int], name: str = "",
                 source: str = "") -> None:
        if not (len(graphs) == len(smiles) == len(rows)):
            raise ValueError("graphs, smiles and rows must have the same length")
        self.graphs, self.smiles, self.rows = graphs, smiles, rows
        self.task_names, self.invalid_rows = list(task_names), list(invalid_rows)
        self.name, self.source = name, source

    def __len__(self) -> int:
        return len(self.graphs)

    def __getitem__(self, idx: int) -> Data:
        # a shallow copy: transforms that assign new attributes (edge perturbation, attribute
        # masking) must not change the stored graph; the tensors themselves are shared
        return copy.copy(self.graphs[idx])

    @property
    def num_tasks(self) -> int:
        return len(self.task_names)

    @property
    def num_invalid(self) -> int:
        return len(self.invalid_rows)

    def labels(self) -> Tensor:
        """[N, T] labels (``NaN`` = missing) of every graph."""
        if not self.task_names:
            raise ValueError(f"{self.name or 'this dataset'} has no labels")
        return torch.cat([g.y for g in self.graphs], dim=0)

    def subset(self, indices: Sequence[int]) -> MoleculeDataset:
        idx = [int(i) for i in indices]
        return MoleculeDataset([self.graphs[i] for i in idx], [self.smiles[i] for i in idx],
                               [self.rows[i] for i in idx], self.task_names,
                               self.invalid_rows, self.name, self.source)

    def info(self) -> dict:
        """Counts for result files: molecules, invalid rows, tasks, mean atoms/bonds."""
        n = len(self.graphs)
        out = {"name": self.name, "source": self.source, "num_molecules": n,
               "num_invalid": self.num_invalid, "num_tasks": self.num_tasks,
               "avg_atoms": sum(int(g.num_nodes) for g in self.graphs) / max(n, 1),
               "avg_bonds": sum(int(g.edge_index.size(1)) for g in self.graphs) / max(2 * n, 1)}
        if self.task_names:
            y = self.labels()
            mask = label_mask(y)
            out["label_coverage"] = float(mask.float().mean())
            out["positive_rate"] = float(torch.nan_to_num(y, 0.0).sum() / mask.sum().clamp(min=1))
        return out

    # -- processed cache (tensors and strings only: loads with weights_only=True) ----------
    def _to_state(self) -> dict:
        g = self.graphs
        state = {
            "x": torch.cat([d.x for d in g]) if g else torch.empty(0, 9, dtype=torch.long),
            "edge_index": (torch.cat([d.edge_index for d in g], dim=1) if g
                           else torch.empty(2, 0, dtype=torch.long)),
            "edge_attr": (torch.cat([d.edge_attr for d in g]) if g
                          else torch.empty(0, 3, dtype=torch.long)),
            "num_nodes": torch.tensor([int(d.num_nodes) for d in g], dtype=torch.long),
            "num_edges": torch.tensor([int(d.edge_index.size(1)) for d in g], dtype=torch.long),
            "smiles": list(self.smiles), "rows": list(self.rows),
            "task_names": list(self.task_names), "invalid_rows": list(self.invalid_rows),
            "name": self.name, "source": self.source,
        }
        if self.task_names:
            state["y"] = self.labels()
        return state

    @classmethod
    def _from_state(cls, state: dict) -> MoleculeDataset:
        nn_, ne = state["num_nodes"].tolist(), state["num_edges"].tolist()
        xs = torch.split(state["x"], nn_)
        es = torch.split(state["edge_index"], ne, dim=1)
        eas = torch.split(state["edge_attr"], ne)
        y = state.get("y")
        graphs = []
        for i in range(len(nn_)):
            d = Data(x=xs[i], edge_index=es[i], edge_attr=eas[i])
            d.num_nodes = nn_[i]
            if y is not None:
                d.y = y[i:i + 1]
            graphs.append(d)
        return cls(graphs, list(state["smiles"]), list(state["rows"]),
                   list(state["task_names"]), list(state["invalid_rows"]), state["name"],
                   state["source"])

    def save(self, path: str | os.PathLike) -> Path:
        """Write the processed dataset atomically (temporary file + ``os.replace``)."""
        state = self._to_state()
        return atomic_write(path, lambda handle: torch.save(state, handle))

    @classmethod
    def load(cls, path: str | os.PathLike) -> MoleculeDataset:
        return cls._from_state(torch.load(path, weights_only=True))


# --------------------------------------------------------------------------------- caching


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _featuriser_fingerprint() -> dict:
    import ogb
    from rdkit import rdBase

    return {"featuriser": FEATURISER_VERSION, "ogb": ogb.__version__,
            "rdkit": rdBase.rdkitVersion}


def cache_key(path: Path, **extra) -> str:
    """Hash of the source file's content, the featuriser and any reading options."""
    payload = {"sha256": _sha256(path), **_featuriser_fingerprint(), **extra}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _cached(cache_dir, stem: str, key: str, build) -> MoleculeDataset:
    """``build()``'s dataset, saved as ``<cache_dir>/<stem>-<key>.pt`` and reused from there.

    A cache file that cannot be read back (truncated by a kill or a full disk, or otherwise
    corrupt) is named in a ``RuntimeWarning``, deleted and rebuilt: never fatal, never reused.
    """
    if cache_dir is None:
        return build()
    path = Path(cache_dir) / f"{stem}-{key}.pt"
    if path.is_file():
        try:
            return MoleculeDataset.load(path)
        except Exception as err:  # any unreadable cache is rebuilt
            warnings.warn(f"featurisation cache {str(path)!r} is corrupt or truncated "
                          f"({type(err).__name__}: {str(err)[:200]}); rebuilding it",
                          RuntimeWarning, stacklevel=3)
            path.unlink(missing_ok=True)
    dataset = build()
    dataset.save(path)
    return dataset


def load_moleculenet(name: str, data_root: str | os.PathLike,
                     cache_dir: str | os.PathLike | None = None, limit: int | None = None,
                     progress: bool = False) -> MoleculeDataset:
    """A MoleculeNet set as a :class:`MoleculeDataset` (first ``limit`` rows if given).

    With ``cache_dir`` the processed graphs are saved there as ``<name>-<key>.pt`` and
    reused while the CSV, the reading options and the featuriser are unchanged.
    """
    spec = _spec(name)
    path = spec.path(data_root)

    def build() -> MoleculeDataset:
        smiles, labels, tasks = read_moleculenet_csv(spec.name, data_root, limit=limit)
        graphs, invalid = featurise_smiles(smiles, labels, progress=progress)
        bad = set(invalid)
        rows = [i for i in range(len(smiles)) if i not in bad]
        return MoleculeDataset(graphs, [smiles[i] for i in rows], rows, tasks, invalid,
                               spec.name, str(path))

    key = cache_key(path, limit=limit, smiles_column=spec.smiles_column, tasks=spec.tasks,
                    exclude=spec.exclude)
    return _cached(cache_dir, spec.name, key, build)


def load_smiles_dataset(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                        limit: int | None = None, column: str | None = None,
                        progress: bool = False) -> MoleculeDataset:
    """Unlabelled molecules for pre-training from a SMILES file (first ``limit`` SMILES)."""
    path = Path(path)

    def build() -> MoleculeDataset:
        smiles = read_smiles_file(path, column=column, limit=limit)
        graphs, invalid = featurise_smiles(smiles, progress=progress)
        bad = set(invalid)
        rows = [i for i in range(len(smiles)) if i not in bad]
        return MoleculeDataset(graphs, [smiles[i] for i in rows], rows, [], invalid,
                               path.name, str(path))

    stem = path.name.split(".")[0] or "smiles"
    return _cached(cache_dir, f"smiles-{stem}", cache_key(path, limit=limit, column=column),
                   build)


# ---------------------------------------------------------------------------- scaffold split


def murcko_scaffold(smiles: str, include_chirality: bool = True) -> str:
    """Bemis-Murcko scaffold SMILES (``""`` for acyclic molecules), as Hu et al."""
    require("rdkit", "graph")
    from rdkit.Chem.Scaffolds import MurckoScaffold

    with _QuietRDKit():
        return MurckoScaffold.MurckoScaffoldSmiles(smiles=smiles,
                                                   includeChirality=include_chirality)


def scaffold_split(smiles: Sequence[str], frac_train: float = 0.8, frac_valid: float = 0.1,
                   frac_test: float = 0.1, include_chirality: bool = True,
                   ) -> tuple[list[int], list[int], list[int]]:
    """Deterministic scaffold split of Hu et al. 2020 (``chem/splitters.py``); indices.

    Molecules sharing a scaffold always land in the same part. Scaffold sets are visited from
    the largest to the smallest (ties: larger first index first, Hu et al.'s
    ``reverse=True`` sort) and each goes to train if it fits under ``frac_train * N``, else to
    valid if train + valid stays under ``(frac_train + frac_valid) * N``, else to test.
    """
    if not math.isclose(frac_train + frac_valid + frac_test, 1.0, abs_tol=1e-9):
        raise ValueError("frac_train + frac_valid + frac_test must be 1")
    scaffolds: dict[str, list[int]] = {}
    for i, s in enumerate(smiles):
        scaffolds.setdefault(murcko_scaffold(s, include_chirality), []).append(i)
    sets = sorted((sorted(v) for v in scaffolds.values()), key=lambda v: (len(v), v[0]),
                  reverse=True)
    n = len(smiles)
    train_cutoff = frac_train * n
    valid_cutoff = (frac_train + frac_valid) * n
    train: list[int] = []
    valid: list[int] = []
    test: list[int] = []
    for group in sets:
        if len(train) + len(group) > train_cutoff:
            if len(train) + len(valid) + len(group) > valid_cutoff:
                test.extend(group)
            else:
                valid.extend(group)
        else:
            train.extend(group)
    return sorted(train), sorted(valid), sorted(test)
