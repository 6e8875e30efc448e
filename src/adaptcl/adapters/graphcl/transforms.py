"""GraphCL graph augmentations as torch-geometric transforms.

The four augmentations of GraphCL (You et al., "Graph Contrastive Learning with Augmentations",
NeurIPS 2020) -- node dropping, edge perturbation, attribute masking and subgraph sampling --
plus a uniform random choice among them (GraphCL's ``random2/3/4``), written as
:class:`torch_geometric.transforms.BaseTransform` subclasses so they compose with ``T.Compose``
and can be passed as ``transform=`` to a dataset.

Where they apply
    Every transform works on one graph (a :class:`~torch_geometric.data.Data`). Applied to a
    :class:`~torch_geometric.data.Batch` it splits the batch into its graphs, augments each
    one and collates them again, so ``batch``/``ptr`` stay consistent and every graph keeps
    its own ratio. The cheaper and recommended place is per graph before collation, e.g. with
    :class:`TwoViewDataset` (which returns the two views of each graph, collated by the
    torch-geometric ``DataLoader`` into two ``Batch`` objects).

Randomness
    Each transform takes an optional ``torch.Generator``; without one it draws from torch's
    global RNG (so ``torch.manual_seed`` makes a run reproducible). There is no other state.

Guarantees (tested)
    Edge indices stay within ``[0, num_nodes)``, node-level attributes (``x``, ``pos``, ...)
    and edge-level attributes (``edge_attr``) keep matching lengths, and a graph never loses
    its last node: node dropping and subgraph sampling keep at least ``min_nodes`` (default 1).

GraphCL's own code (``unsupervised_TU/aug.py``) differs from the paper in ways that can be
switched on here: edge perturbation there only removes edges (``add_edges=False``), its
subgraph grows from the seed's one-hop neighbourhood only (``one_hop=True``) and its first view
is the un-augmented graph (use :class:`Identity` as the first view). Its ratios are 10 % for
node dropping, edge perturbation and masking and 20 % for the subgraph. Two further quirks of
that file are *not* reproduced because they are bugs: ``drop_nodes`` and ``subgraph`` zero the
adjacency of the nodes meant to be *kept*, so the TU code actually keeps the dropped 10 % of
nodes and removes the sampled subgraph.

Example::

    import torch
    import torch_geometric.transforms as T
    from adaptcl.adapters.graphcl import NodeDrop, Subgraph, RandomChoice

    g = torch.Generator().manual_seed(0)
    aug = RandomChoice([NodeDrop(0.2, generator=g), Subgraph(0.2, generator=g)], generator=g)
    view = T.Compose([aug])(data)      # data: torch_geometric.data.Data
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from adaptcl.adapters import require

require("torch_geometric", "graph")

import torch  # noqa: E402
from torch import Tensor  # noqa: E402
from torch_geometric.data import Batch, Data  # noqa: E402
from torch_geometric.transforms import BaseTransform  # noqa: E402

__all__ = [
    "GraphAugmentation",
    "Identity",
    "NodeDrop",
    "EdgePerturb",
    "AttrMask",
    "Subgraph",
    "RandomChoice",
    "ConstantFeatures",
    "CappedOneHotDegree",
    "TwoViewDataset",
    "graphcl_augmentation",
]


def _check_ratio(ratio: float, name: str = "ratio") -> float:
    ratio = float(ratio)
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {ratio}")
    return ratio


def _num_nodes(data: Data) -> int:
    n = data.num_nodes
    return 0 if n is None else int(n)


class GraphAugmentation(BaseTransform):
    """Base class: draws from ``generator`` (or torch's global RNG) and handles ``Batch`` input.

    Subclasses implement :meth:`augment` for one ``Data``.
    """

    def __init__(self, generator: torch.Generator | None = None) -> None:
        self.generator = generator

    # -- random helpers (all on CPU, through the optional generator) --------------------------
    def _randperm(self, n: int) -> Tensor:
        return torch.randperm(n, generator=self.generator)

    def _randint(self, high: int, size: tuple[int, ...]) -> Tensor:
        return torch.randint(high, size, generator=self.generator)

    def forward(self, data: Data) -> Data:
        if isinstance(data, Batch):
            graphs = [self.augment(copy.copy(g)) for g in data.to_data_list()]
            return Batch.from_data_list(graphs)
        return self.augment(copy.copy(data))  # never touch the caller's Data, even via forward()

    def augment(self, data: Data) -> Data:  # pragma: no cover - abstract
        raise NotImplementedError


class Identity(GraphAugmentation):
    """No augmentation (GraphCL's un-augmented first view in its TU code)."""

    def augment(self, data: Data) -> Data:
        return data


class NodeDrop(GraphAugmentation):
    """Drop ``floor(ratio * n)`` nodes uniformly at random together with their edges.

    Kept nodes are relabelled ``0..n'-1``; node- and edge-level attributes are sliced with them
    (``Data.subgraph``). At least ``min_nodes`` nodes are kept (never an empty graph).
    """

    def __init__(self, ratio: float = 0.2, min_nodes: int = 1,
                 generator: torch.Generator | None = None) -> None:
        super().__init__(generator)
        self.ratio = _check_ratio(ratio)
        if min_nodes < 1:
            raise ValueError(f"min_nodes must be >= 1, got {min_nodes}")
        self.min_nodes = int(min_nodes)

    def augment(self, data: Data) -> Data:
        n = _num_nodes(data)
        n_drop = min(int(n * self.ratio), max(n - self.min_nodes, 0))
        if n_drop <= 0:
            return data
        keep = self._randperm(n)[n_drop:].sort().values
        return data.subgraph(keep)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(ratio={self.ratio})"


class EdgePerturb(GraphAugmentation):
    """Remove ``floor(ratio * m)`` edges and, if ``add_edges``, add as many random ones.

    ``undirected=True`` (default) treats ``(u, v)``/``(v, u)`` as one edge, so a symmetric
    graph stays symmetric and ``m`` counts undirected edges; ``undirected=False`` perturbs
    the stored directed entries independently, as GraphCL's code does. Added edges join two
    distinct nodes drawn uniformly (duplicates of existing edges are possible, as in GraphCL);
    their ``edge_attr`` rows are copied from uniformly drawn existing edges (zeros when the
    graph had no edge). GraphCL's TU code removes edges only: ``add_edges=False``.
    """

    def __init__(self, ratio: float = 0.2, add_edges: bool = True, undirected: bool = True,
                 generator: torch.Generator | None = None) -> None:
        super().__init__(generator)
        self.ratio = _check_ratio(ratio)
        self.add_edges = bool(add_edges)
        self.undirected = bool(undirected)

    def augment(self, data: Data) -> Data:
        edge_index = data.edge_index
        if edge_index is None:
            return data
        n = _num_nodes(data)
        m_stored = edge_index.size(1)
        edge_attr = data.edge_attr if "edge_attr" in data else None
        if self.undirected:
            row, col = edge_index
            lo, hi = torch.minimum(row, col), torch.maximum(row, col)
            key = lo * max(n, 1) + hi
            unique_keys = torch.unique(key)
            n_perturb = int(unique_keys.numel() * self.ratio)
            dropped = unique_keys[self._randperm(unique_keys.numel())[:n_perturb]]
            keep_mask = ~torch.isin(key, dropped)
        else:
            n_perturb = int(m_stored * self.ratio)
            keep_mask = torch.ones(m_stored, dtype=torch.bool)
            keep_mask[self._randperm(m_stored)[:n_perturb]] = False
        if n_perturb == 0:
            return data
        new_index = edge_index[:, keep_mask]
        new_attr = edge_attr[keep_mask] if edge_attr is not None else None
        if self.add_edges and n >= 2:
            src = self._randint(n, (n_perturb,))
            # distinct endpoint: shift by 1..n-1 modulo n
            dst = (src + 1 + self._randint(n - 1, (n_perturb,))) % n
            added = torch.stack([src, dst]).to(edge_index.dtype)
            if edge_attr is not None:
                if m_stored > 0:
                    added_attr = edge_attr[self._randint(m_stored, (n_perturb,))]
                else:
                    added_attr = edge_attr.new_zeros((n_perturb,) + tuple(edge_attr.shape[1:]))
            if self.undirected:
                added = torch.cat([added, added.flip(0)], dim=1)
                if edge_attr is not None:
                    added_attr = torch.cat([added_attr, added_attr], dim=0)
            new_index = torch.cat([new_index, added], dim=1)
            if edge_attr is not None:
                new_attr = torch.cat([new_attr, added_attr], dim=0)
        data.edge_index = new_index
        if edge_attr is not None:
            data.edge_attr = new_attr
        return data

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(ratio={self.ratio}, add_edges={self.add_edges}, "
                f"undirected={self.undirected})")


class AttrMask(GraphAugmentation):
    """Mask the features ``x`` of ``floor(ratio * n)`` random nodes.

    ``mode="gaussian"`` replaces each masked row with N(``mean``, ``std``) noise (GraphCL's TU
    code: mean 0.5, std 0.5); ``mode="zero"`` sets it to 0; ``mode="value"`` writes ``value``
    (a scalar or one value per column, e.g. the mask-atom token of the molecule setting, which
    keeps integer features integer). Graphs without ``x`` are returned unchanged.
    """

    def __init__(self, ratio: float = 0.2, mode: str = "gaussian", mean: float = 0.5,
                 std: float = 0.5, value: float | Sequence[float] | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__(generator)
        self.ratio = _check_ratio(ratio)
        if mode not in ("gaussian", "zero", "value"):
            raise ValueError(f"mode must be 'gaussian', 'zero' or 'value', got {mode!r}")
        if mode == "value" and value is None:
            raise ValueError("mode='value' needs value=")
        self.mode, self.mean, self.std, self.value = mode, float(mean), float(std), value

    def augment(self, data: Data) -> Data:
        x = data.x if "x" in data else None
        if x is None:
            return data
        n = x.size(0)
        n_mask = int(n * self.ratio)
        if n_mask == 0:
            return data
        idx = self._randperm(n)[:n_mask]
        x = x.clone()
        if self.mode == "gaussian":
            noise = torch.randn((n_mask,) + tuple(x.shape[1:]), generator=self.generator)
            x[idx] = (noise * self.std + self.mean).to(x.dtype)
        elif self.mode == "zero":
            x[idx] = 0
        else:
            x[idx] = torch.as_tensor(self.value, dtype=x.dtype)
        data.x = x
        return data

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(ratio={self.ratio}, mode={self.mode!r})"


class Subgraph(GraphAugmentation):
    """Keep a connected subgraph of ``max(min_nodes, floor((1 - ratio) * n))`` nodes.

    Random-walk growth as in GraphCL: start from a uniformly drawn node and repeatedly add a
    uniformly drawn node of the frontier (neighbours of the nodes chosen so far, edges read in
    both directions). Growth stops early when the frontier is empty (the seed's component is
    exhausted), so the result is always connected. ``ratio`` is the fraction of nodes removed.
    ``one_hop=True`` reproduces GraphCL's TU code, whose frontier is never updated: only the
    seed's neighbours can join.
    """

    def __init__(self, ratio: float = 0.2, one_hop: bool = False, min_nodes: int = 1,
                 generator: torch.Generator | None = None) -> None:
        super().__init__(generator)
        self.ratio = _check_ratio(ratio)
        self.one_hop = bool(one_hop)
        if min_nodes < 1:
            raise ValueError(f"min_nodes must be >= 1, got {min_nodes}")
        self.min_nodes = int(min_nodes)

    def augment(self, data: Data) -> Data:
        n = _num_nodes(data)
        target = max(self.min_nodes, int(n * (1.0 - self.ratio)))
        if n == 0 or target >= n:
            return data
        edge_index = data.edge_index
        if edge_index is None:
            edge_index = torch.empty((2, 0), dtype=torch.long)
        # CSR adjacency, undirected view, in deterministic order
        both = torch.cat([edge_index, edge_index.flip(0)], dim=1)
        order = torch.argsort(both[0] * n + both[1])
        src, dst = both[0][order].tolist(), both[1][order].tolist()
        ptr = [0] * (n + 1)
        for s in src:
            ptr[s + 1] += 1
        for i in range(n):
            ptr[i + 1] += ptr[i]

        seed = int(self._randint(n, (1,)))
        chosen = [seed]
        in_set = {seed}
        frontier: list[int] = []
        in_frontier: set[int] = set()

        def extend(node: int) -> None:
            for j in range(ptr[node], ptr[node + 1]):
                v = dst[j]
                if v not in in_set and v not in in_frontier:
                    frontier.append(v)
                    in_frontier.add(v)

        extend(seed)
        while len(chosen) < target and frontier:
            k = int(self._randint(len(frontier), (1,)))
            v = frontier[k]
            frontier[k] = frontier[-1]
            frontier.pop()
            in_frontier.discard(v)
            chosen.append(v)
            in_set.add(v)
            if not self.one_hop:
                extend(v)
        keep = torch.tensor(sorted(chosen), dtype=torch.long)
        return data.subgraph(keep)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(ratio={self.ratio}, one_hop={self.one_hop})"


class RandomChoice(GraphAugmentation):
    """Apply one of ``transforms``, drawn uniformly per graph (GraphCL's ``random2/3/4``)."""

    def __init__(self, transforms: Sequence[BaseTransform],
                 generator: torch.Generator | None = None) -> None:
        super().__init__(generator)
        if len(transforms) == 0:
            raise ValueError("RandomChoice needs at least one transform")
        self.transforms = list(transforms)

    def augment(self, data: Data) -> Data:
        k = int(self._randint(len(self.transforms), (1,)))
        return self.transforms[k](data)

    def __repr__(self) -> str:
        inner = ", ".join(repr(t) for t in self.transforms)
        return f"{self.__class__.__name__}([{inner}])"


class ConstantFeatures(BaseTransform):
    """``x = ones(n, 1)`` for graphs without node features (GraphCL's choice for IMDB/REDDIT)."""

    def __init__(self, value: float = 1.0) -> None:
        self.value = float(value)

    def forward(self, data: Data) -> Data:
        data.x = torch.full((_num_nodes(data), 1), self.value)
        return data


class CappedOneHotDegree(BaseTransform):
    """One-hot in-degree with degrees above ``max_degree`` put in the last bucket.

    Unlike ``T.OneHotDegree`` it never fails on a degree larger than ``max_degree``; the
    feature dimension is ``max_degree + 1``. Any existing ``x`` is replaced.
    """

    def __init__(self, max_degree: int = 100) -> None:
        if max_degree < 0:
            raise ValueError(f"max_degree must be >= 0, got {max_degree}")
        self.max_degree = int(max_degree)

    def forward(self, data: Data) -> Data:
        n = _num_nodes(data)
        deg = torch.zeros(n, dtype=torch.long)
        if data.edge_index is not None and data.edge_index.numel() > 0:
            deg.scatter_add_(0, data.edge_index[1], torch.ones_like(data.edge_index[1]))
        deg = deg.clamp(max=self.max_degree)
        data.x = torch.nn.functional.one_hot(deg, self.max_degree + 1).float()
        return data

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(max_degree={self.max_degree})"


_AUG_NAMES = ("dnodes", "pedges", "mask_nodes", "subgraph")


def graphcl_augmentation(name: str, ratio: float = 0.2, *, graphcl_quirks: bool = False,
                         generator: torch.Generator | None = None) -> GraphAugmentation:
    """Build a GraphCL augmentation by its name in GraphCL's code.

    ``name``: ``none``, ``dnodes``, ``pedges``, ``mask_nodes``, ``subgraph``, ``random2``
    (node dropping or subgraph), ``random3`` (+ edge perturbation) or ``random4``
    (+ attribute masking). ``graphcl_quirks=True`` uses the behaviour of GraphCL's TU code:
    removal-only edge perturbation and one-hop subgraph (its ratios are 0.1 and, for the
    subgraph, 0.2: pass them through ``ratio``/separate transforms if wanted).
    """
    ratio = _check_ratio(ratio)

    def make(kind: str) -> GraphAugmentation:
        if kind == "dnodes":
            return NodeDrop(ratio, generator=generator)
        if kind == "pedges":
            return EdgePerturb(ratio, add_edges=not graphcl_quirks,
                               undirected=not graphcl_quirks, generator=generator)
        if kind == "mask_nodes":
            return AttrMask(ratio, mode="gaussian", generator=generator)
        if kind == "subgraph":
            return Subgraph(ratio, one_hop=graphcl_quirks, generator=generator)
        raise ValueError(f"unknown augmentation {kind!r}")

    if name == "none":
        return Identity(generator)
    if name in _AUG_NAMES:
        return make(name)
    pools = {"random2": ("dnodes", "subgraph"),
             "random3": ("dnodes", "pedges", "subgraph"),
             "random4": ("dnodes", "pedges", "subgraph", "mask_nodes")}
    if name in pools:
        return RandomChoice([make(k) for k in pools[name]], generator=generator)
    raise ValueError(
        f"unknown augmentation {name!r}; choose from none, {', '.join(_AUG_NAMES)}, "
        "random2, random3, random4")


class TwoViewDataset(torch.utils.data.Dataset):
    """Wrap a graph dataset so that item ``i`` is ``(view0(g_i), view1(g_i))``.

    The torch-geometric ``DataLoader`` collates the pairs into two ``Batch`` objects whose
    graph ``k`` comes from the same source graph, the layout a contrastive loss expects.
    GraphCL's TU code uses ``view0=Identity()``.

    Example::

        from torch_geometric.loader import DataLoader
        pairs = TwoViewDataset(dataset, Identity(), graphcl_augmentation("random2"))
        for b0, b1 in DataLoader(pairs, batch_size=128, shuffle=True):
            loss = model(b0, b1)
    """

    def __init__(self, dataset: Sequence[Data], view0: BaseTransform | None,
                 view1: BaseTransform | None) -> None:
        self.dataset = dataset
        self.view0 = view0 if view0 is not None else Identity()
        self.view1 = view1 if view1 is not None else Identity()

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, idx: int) -> tuple[Data, Data]:
        data = self.dataset[idx]
        return self.view0(data), self.view1(data)

