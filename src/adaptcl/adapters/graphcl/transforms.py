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
    global RNG, so ``torch.manual_seed`` makes a run reproducible and torch's DataLoader
    workers (each seeded ``base_seed + worker_id``, ``base_seed`` drawn per epoch from the
    loader's ``generator=`` or the global RNG) get their own stream, as with any PyG transform.
    A stored generator is used as it is in the main process (``num_workers=0``: one stream,
    advancing across epochs). Inside a DataLoader worker the copy of it that the worker holds
    is never replayed: the transform draws from a stream seeded by the generator's seed mixed
    with that worker's seed, so views differ across workers and epochs, change with either
    seed, and are reproduced by the same two seeds. Transforms that share a generator share
    that stream in a worker too. No ``worker_init_fn`` is needed.

Devices and dtypes
    Every tensor a transform writes follows the data: random draws, masks and index vectors
    are made on the data's device (a CPU ``generator`` draws on the CPU and the draw is moved
    to the data's device), new features take the data's dtype (or ``dtype=``, default
    ``torch.get_default_dtype()``). Two choices are made on the host by design:
    :class:`RandomChoice`'s pick (Python control flow) and :class:`Subgraph`'s random walk
    (a sequential walk; the edge list is copied to the CPU once per graph).

Guarantees (tested)
    Edge indices stay within ``[0, num_nodes)``; every node-level attribute (``x``, ``pos``,
    ...) and every edge-level attribute (``edge_attr``, ``edge_weight``, ``edge_type``, any
    tensor whose concatenation dimension has the edge count, classified by
    ``Data.is_node_attr``/``Data.is_edge_attr`` as torch-geometric does) stays aligned with
    its nodes and edges; node dropping and subgraph sampling never lose the last node (at least
    ``min_nodes``, default 1). Only homogeneous graphs: a ``HeteroData`` raises a ``TypeError``.

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
from typing import Literal, get_args

from adaptcl.adapters import require

require("torch_geometric", "graph")

import torch  # noqa: E402
from torch import Tensor  # noqa: E402
from torch_geometric.data import Batch, Data  # noqa: E402
from torch_geometric.transforms import BaseTransform  # noqa: E402
from torch_geometric.utils import select  # noqa: E402

from ._graph import (  # noqa: E402
    _check_min_nodes,
    _check_ratio,
    _data_device,
    _num_nodes,
    _require_homogeneous,
)

__all__ = [
    "GraphAugmentation",
    "Identity",
    "NodeDrop",
    "EdgePerturb",
    "AttrMask",
    "Subgraph",
    "RandomChoice",
    "TwoViewDataset",
    "graphcl_augmentation",
    "worker_generator",
    "MaskMode",
    "MASK_MODES",
]

#: what :class:`AttrMask` writes into the masked rows: GraphCL's Gaussian noise, zeros, or a value
MaskMode = Literal["gaussian", "zero", "value"]
#: the same choices as a tuple, checked at construction
MASK_MODES: tuple[MaskMode, ...] = get_args(MaskMode)


# -- randomness inside DataLoader workers ------------------------------------------------------

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _mix_seeds(a: int, b: int) -> int:
    """A well-spread 63-bit seed from two seeds (nearby worker seeds give unrelated streams)."""
    return _splitmix64(_splitmix64(a & _MASK64) ^ (b & _MASK64)) >> 1


# id(stored generator) -> (that generator, the worker's seed, the stream derived for it).
# Keyed by the generator, not the transform, so transforms sharing a generator keep sharing one
# stream inside a worker, as they do in the main process.
_worker_streams: dict[int, tuple[torch.Generator, int, torch.Generator]] = {}


def worker_generator(generator: torch.Generator | None) -> torch.Generator | None:
    """The generator to draw from now: ``generator`` itself, or its stream for this worker.

    In the main process (or with ``generator=None``) this returns ``generator`` unchanged.
    Inside a DataLoader worker it returns a generator seeded by ``generator.initial_seed()``
    mixed with the worker's seed (``torch.utils.data.get_worker_info().seed``, which torch
    draws anew each epoch unless workers persist), created once per worker and epoch. So the
    copy of ``generator`` every worker receives is never replayed, and a run is reproduced by
    the same generator seed and the same loader seed. Custom transforms can call it too.

    >>> g = torch.Generator().manual_seed(0)
    >>> worker_generator(g) is g  # main process: the generator itself
    True
    """
    if generator is None:
        return None
    info = torch.utils.data.get_worker_info()
    if info is None:
        return generator
    entry = _worker_streams.get(id(generator))
    if entry is None or entry[0] is not generator or entry[1] != info.seed:
        stream = torch.Generator(device=generator.device)
        stream.manual_seed(_mix_seeds(info.seed, generator.initial_seed()))
        entry = (generator, info.seed, stream)
        _worker_streams[id(generator)] = entry
    return entry[2]


class GraphAugmentation(BaseTransform):
    """Base class: draws from ``generator`` (or torch's global RNG) and handles ``Batch`` input.

    Subclasses implement :meth:`augment` for one ``Data``. Draws go through the ``_rand*``
    helpers, which make them on the data's device and use :func:`worker_generator` so a stored
    generator is never replayed across DataLoader workers.
    """

    def __init__(self, generator: torch.Generator | None = None) -> None:
        self.generator = generator

    # -- random helpers: on `device`, through the (per-worker) generator ---------------------
    def _draw(self, sample, *args, device: torch.device | None = None, **kwargs) -> Tensor:
        """``sample(*args, **kwargs)`` (a torch sampler) on ``device`` (default CPU).

        Without a generator it samples on ``device`` from that device's default generator;
        with one it samples on the generator's device and moves the draw to ``device``.
        """
        gen = worker_generator(self.generator)
        if gen is None:
            return sample(*args, device=device, **kwargs)
        return sample(*args, generator=gen, device=gen.device, **kwargs).to(device)

    def _randperm(self, n: int, device: torch.device | None = None) -> Tensor:
        return self._draw(torch.randperm, n, device=device)

    def _randint(self, high: int, size: tuple[int, ...],
                 device: torch.device | None = None) -> Tensor:
        return self._draw(torch.randint, high, size, device=device)

    def _host_randint(self, high: int) -> int:
        """A draw that steers Python control flow: made on the host, so no device sync."""
        gen = worker_generator(self.generator)
        device = gen.device if gen is not None else torch.device("cpu")
        return int(torch.randint(high, (1,), generator=gen, device=device))

    def forward(self, data: Data) -> Data:
        _require_homogeneous(self, data)
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

    Kept nodes are relabelled ``0..n'-1``; ``Data.subgraph`` slices every node- and edge-level
    attribute with them. At least ``min_nodes`` nodes are kept (never an empty graph). The
    count is exact, as in GraphCL; ``torch_geometric.utils.dropout_node`` would drop each node
    with probability ``ratio`` instead.

    >>> NodeDrop(0.1)
    NodeDrop(ratio=0.1, min_nodes=1)
    """

    def __init__(self, ratio: float = 0.2, min_nodes: int = 1,
                 generator: torch.Generator | None = None) -> None:
        super().__init__(generator)
        self.ratio = _check_ratio(ratio)
        self.min_nodes = _check_min_nodes(min_nodes)

    def augment(self, data: Data) -> Data:
        n = _num_nodes(data)
        n_drop = min(int(n * self.ratio), max(n - self.min_nodes, 0))
        if n_drop <= 0:
            return data
        keep = self._randperm(n, _data_device(data))[n_drop:].sort().values
        return data.subgraph(keep)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(ratio={self.ratio}, min_nodes={self.min_nodes})"


class EdgePerturb(GraphAugmentation):
    """Remove ``floor(ratio * m)`` edges and, if ``add_edges``, add as many random ones.

    ``undirected=True`` (default) treats ``(u, v)``/``(v, u)`` as one edge, so a symmetric
    graph stays symmetric and ``m`` counts undirected edges; ``undirected=False`` perturbs
    the stored directed entries independently, as GraphCL's code does. Removal goes through
    ``Data.edge_subgraph``, so every edge-level attribute (``edge_attr``, ``edge_weight``,
    ``edge_type``, ...) keeps matching its edges. Added edges join two distinct nodes drawn
    uniformly (duplicates of existing edges are possible, as in GraphCL); each copies all its
    edge-level attributes from one uniformly drawn existing edge (both directions of an
    undirected edge get the same). GraphCL's TU code removes edges only: ``add_edges=False``.
    The count is exact, as in GraphCL; ``torch_geometric.utils.dropout_edge`` would drop each
    edge with probability ``ratio`` instead.

    >>> EdgePerturb(0.1, add_edges=False)
    EdgePerturb(ratio=0.1, add_edges=False, undirected=True)
    """

    def __init__(self, ratio: float = 0.2, add_edges: bool = True, undirected: bool = True,
                 generator: torch.Generator | None = None) -> None:
        super().__init__(generator)
        self.ratio = _check_ratio(ratio)
        self.add_edges = bool(add_edges)
        self.undirected = bool(undirected)

    def augment(self, data: Data) -> Data:
        edge_index = data.edge_index if "edge_index" in data else None
        if edge_index is None:
            return data
        device = edge_index.device
        n = _num_nodes(data)
        m_stored = edge_index.size(1)
        # the permutation is drawn even when nothing is perturbed, so seeded runs draw the
        # same stream as earlier versions and reproduce their views
        if self.undirected:
            row, col = edge_index
            key = torch.minimum(row, col) * max(n, 1) + torch.maximum(row, col)
            unique_keys = torch.unique(key)
            n_perturb = int(unique_keys.numel() * self.ratio)
            order = self._randperm(unique_keys.numel(), device)
            if n_perturb == 0:
                return data
            keep = ~torch.isin(key, unique_keys[order[:n_perturb]])
        else:
            n_perturb = int(m_stored * self.ratio)
            order = self._randperm(m_stored, device)
            if n_perturb == 0:
                return data
            # an index (not a mask): its length is known, so no sync and it runs on `meta`
            keep = order[n_perturb:].sort().values
        edge_keys = [k for k, _ in data if k != "edge_index" and data.is_edge_attr(k)]
        out = data.edge_subgraph(keep)
        if not self.add_edges or n < 2:
            return out
        src = self._randint(n, (n_perturb,), device)
        dst = (src + 1 + self._randint(n - 1, (n_perturb,), device)) % n  # distinct endpoint
        added = torch.stack([src, dst]).to(edge_index.dtype)
        # the existing edge whose attributes each new edge copies (m_stored > 0 here)
        source = self._randint(m_stored, (n_perturb,), device) if edge_keys else None
        if self.undirected:
            added = torch.cat([added, added.flip(0)], dim=1)
            source = torch.cat([source, source]) if source is not None else None
        out.edge_index = torch.cat([out.edge_index, added], dim=1)
        for k in edge_keys:
            value = data[k]
            dim = data.__cat_dim__(k, value)
            copied = select(value, source, dim=dim)
            out[k] = (torch.cat([out[k], copied], dim=dim) if isinstance(value, Tensor)
                      else list(out[k]) + list(copied))
        return out

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(ratio={self.ratio}, add_edges={self.add_edges}, "
                f"undirected={self.undirected})")


class AttrMask(GraphAugmentation):
    """Mask the features ``x`` of ``floor(ratio * n)`` random nodes.

    ``mode="gaussian"`` replaces each masked row with N(``mean``, ``std``) noise (GraphCL's TU
    code: mean 0.5, std 0.5), drawn in ``x``'s dtype when it is floating; ``mode="zero"`` sets
    it to 0; ``mode="value"`` writes ``value`` (a scalar or one value per column, e.g. the
    mask-atom token of the molecule setting, which keeps integer features integer). Graphs
    without ``x`` are returned unchanged. Whole rows, an exact count: GraphCL's masking, which
    ``torch_geometric.utils.mask_feature`` (Bernoulli, zero fill) does not express.

    >>> AttrMask(0.1)
    AttrMask(ratio=0.1, mode='gaussian', mean=0.5, std=0.5)
    """

    def __init__(self, ratio: float = 0.2, mode: MaskMode = "gaussian", mean: float = 0.5,
                 std: float = 0.5, value: float | Sequence[float] | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__(generator)
        self.ratio = _check_ratio(ratio)
        if mode not in MASK_MODES:
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
        idx = self._randperm(n, x.device)[:n_mask]
        x = x.clone()
        if self.mode == "gaussian":
            dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
            noise = self._draw(torch.randn, (n_mask,) + tuple(x.shape[1:]), device=x.device,
                               dtype=dtype)
            x[idx] = (noise * self.std + self.mean).to(x.dtype)
        elif self.mode == "zero":
            x[idx] = 0
        else:
            x[idx] = torch.as_tensor(self.value, dtype=x.dtype, device=x.device)
        data.x = x
        return data

    def __repr__(self) -> str:
        detail = {"gaussian": f", mean={self.mean}, std={self.std}", "zero": "",
                  "value": f", value={self.value!r}"}[self.mode]
        return f"{self.__class__.__name__}(ratio={self.ratio}, mode={self.mode!r}{detail})"


class Subgraph(GraphAugmentation):
    """Keep a connected subgraph of ``max(min_nodes, floor((1 - ratio) * n))`` nodes.

    Random-walk growth as in GraphCL: start from a uniformly drawn node and repeatedly add a
    uniformly drawn node of the frontier (neighbours of the nodes chosen so far, edges read in
    both directions). Growth stops early when the frontier is empty (the seed's component is
    exhausted), so the result is always connected. ``ratio`` is the fraction of nodes removed.
    ``one_hop=True`` reproduces GraphCL's TU code, whose frontier is never updated: only the
    seed's neighbours can join. The walk is sequential, so it runs on the host (one copy of the
    edge list to the CPU per graph); ``Data.subgraph`` then slices every node- and edge-level
    attribute on the data's device.

    >>> Subgraph(0.2, one_hop=True)
    Subgraph(ratio=0.2, one_hop=True, min_nodes=1)
    """

    def __init__(self, ratio: float = 0.2, one_hop: bool = False, min_nodes: int = 1,
                 generator: torch.Generator | None = None) -> None:
        super().__init__(generator)
        self.ratio = _check_ratio(ratio)
        self.one_hop = bool(one_hop)
        self.min_nodes = _check_min_nodes(min_nodes)

    def augment(self, data: Data) -> Data:
        n = _num_nodes(data)
        target = max(self.min_nodes, int(n * (1.0 - self.ratio)))
        if n == 0 or target >= n:
            return data
        edge_index = data.edge_index if "edge_index" in data else None
        if edge_index is None:
            edge_index = torch.empty((2, 0), dtype=torch.long)
        # CSR adjacency of the undirected view, on the host, in deterministic order
        both = torch.cat([edge_index, edge_index.flip(0)], dim=1).cpu()
        order = torch.argsort(both[0] * n + both[1])
        dst = both[1][order].tolist()
        ptr = [0] + torch.bincount(both[0], minlength=n).cumsum(0).tolist()

        seed = self._host_randint(n)
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
            k = self._host_randint(len(frontier))
            v = frontier[k]
            frontier[k] = frontier[-1]
            frontier.pop()
            in_frontier.discard(v)
            chosen.append(v)
            in_set.add(v)
            if not self.one_hop:
                extend(v)
        keep = torch.tensor(sorted(chosen), dtype=torch.long, device=_data_device(data))
        return data.subgraph(keep)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(ratio={self.ratio}, one_hop={self.one_hop}, "
                f"min_nodes={self.min_nodes})")


class RandomChoice(GraphAugmentation):
    """Apply one of ``transforms``, drawn uniformly per graph (GraphCL's ``random2/3/4``).

    The pick is drawn on the host (it chooses which Python code runs), from ``generator``.

    >>> RandomChoice([NodeDrop(0.1), Identity()])
    RandomChoice([NodeDrop(ratio=0.1, min_nodes=1), Identity()])
    """

    def __init__(self, transforms: Sequence[BaseTransform],
                 generator: torch.Generator | None = None) -> None:
        super().__init__(generator)
        if len(transforms) == 0:
            raise ValueError("RandomChoice needs at least one transform")
        self.transforms = list(transforms)

    def augment(self, data: Data) -> Data:
        return self.transforms[self._host_randint(len(self.transforms))](data)

    def __repr__(self) -> str:
        inner = ", ".join(repr(t) for t in self.transforms)
        return f"{self.__class__.__name__}([{inner}])"


_AUG_NAMES = ("dnodes", "pedges", "mask_nodes", "subgraph")


def graphcl_augmentation(name: str, ratio: float = 0.2, *, graphcl_quirks: bool = False,
                         generator: torch.Generator | None = None,
                         subgraph_ratio: float | None = None) -> GraphAugmentation:
    """Build a GraphCL augmentation by its name in GraphCL's code.

    ``name``: ``none``, ``dnodes``, ``pedges``, ``mask_nodes``, ``subgraph``, ``random2``
    (node dropping or subgraph), ``random3`` (+ edge perturbation) or ``random4``
    (+ attribute masking). ``graphcl_quirks=True`` uses the behaviour of GraphCL's TU code:
    removal-only edge perturbation and one-hop subgraph (its ratios are 0.1 and, for the
    subgraph, 0.2: pass them through ``ratio`` and ``subgraph_ratio``).
    ``subgraph_ratio`` is the fraction the subgraph removes, alone or inside a ``random*``
    pool (default: ``ratio``).
    """
    ratio = _check_ratio(ratio)
    sub_ratio = ratio if subgraph_ratio is None else _check_ratio(subgraph_ratio)

    def make(kind: str) -> GraphAugmentation:
        if kind == "dnodes":
            return NodeDrop(ratio, generator=generator)
        if kind == "pedges":
            return EdgePerturb(ratio, add_edges=not graphcl_quirks,
                               undirected=not graphcl_quirks, generator=generator)
        if kind == "mask_nodes":
            return AttrMask(ratio, mode="gaussian", generator=generator)
        if kind == "subgraph":
            return Subgraph(sub_ratio, one_hop=graphcl_quirks, generator=generator)
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

    Seeded transforms are safe with worker processes: each worker draws its own views, new
    each epoch, reproduced by the augmentation's and the loader's seeds (see *Randomness*).

    Example::

        from torch_geometric.loader import DataLoader
        aug = graphcl_augmentation("random2", generator=torch.Generator().manual_seed(0))
        pairs = TwoViewDataset(dataset, Identity(), aug)
        loader = DataLoader(pairs, batch_size=128, shuffle=True, num_workers=2,
                            generator=torch.Generator().manual_seed(1))
        for b0, b1 in loader:
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

