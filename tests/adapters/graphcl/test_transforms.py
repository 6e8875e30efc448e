"""GraphCL augmentations: ratios, valid indices, consistent attributes, never an empty graph."""

from __future__ import annotations

import pytest

pytest.importorskip("torch_geometric")

import torch  # noqa: E402
import torch_geometric.transforms as T  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch_geometric.data import Batch, Data, HeteroData  # noqa: E402
from torch_geometric.loader import DataLoader  # noqa: E402
from torch_geometric.utils import is_undirected  # noqa: E402

from adaptcl.adapters.graphcl import (  # noqa: E402
    AttrMask,
    CappedOneHotDegree,
    ConstantFeatures,
    EdgePerturb,
    Identity,
    NodeDrop,
    RandomChoice,
    Subgraph,
    TwoViewDataset,
    graphcl_augmentation,
)

# ------------------------------------------------------------------------------ helpers


@st.composite
def graphs(draw, min_nodes: int = 1, max_nodes: int = 30, undirected: bool = True):
    """Random graph; ``x[:, 0]`` holds the original node id so relabelling can be checked."""
    n = draw(st.integers(min_nodes, max_nodes))
    max_edges = n * (n - 1) // 2
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)),
                          max_size=min(max_edges, 60)))
    pairs = sorted({(min(u, v), max(u, v)) for u, v in pairs if u != v})
    if pairs:
        ei = torch.tensor(pairs, dtype=torch.long).t()
        if undirected:
            ei = torch.cat([ei, ei.flip(0)], dim=1)
    else:
        ei = torch.empty((2, 0), dtype=torch.long)
    x = torch.cat([torch.arange(n, dtype=torch.float).view(-1, 1), torch.rand(n, 2)], dim=1)
    # edge_attr encodes the original endpoints so we can check edges stay matched
    edge_attr = torch.stack([ei[0], ei[1]], dim=1).float() if ei.numel() else torch.empty((0, 2))
    return Data(x=x, edge_index=ei, edge_attr=edge_attr, num_nodes=n)


def assert_valid(data: Data) -> None:
    n = int(data.num_nodes)
    assert n >= 1, "an empty graph reached the encoder"
    assert data.x.size(0) == n
    ei = data.edge_index
    assert ei.dtype == torch.long and ei.dim() == 2 and ei.size(0) == 2
    if ei.numel():
        assert int(ei.min()) >= 0 and int(ei.max()) < n
    assert data.edge_attr.size(0) == ei.size(1)


def original_edges(data: Data) -> set[tuple[int, int]]:
    return {(int(u), int(v)) for u, v in data.edge_index.t().tolist()}


def mapped_edges(out: Data) -> set[tuple[int, int]]:
    ids = out.x[:, 0].long()
    return {(int(ids[u]), int(ids[v])) for u, v in out.edge_index.t().tolist()}


def is_connected(data: Data) -> bool:
    n = int(data.num_nodes)
    adj: dict[int, set[int]] = {i: set() for i in range(n)}
    for u, v in data.edge_index.t().tolist():
        adj[u].add(v)
        adj[v].add(u)
    seen, stack = {0}, [0]
    while stack:
        for w in adj[stack.pop()]:
            if w not in seen:
                seen.add(w)
                stack.append(w)
    return len(seen) == n


RATIOS = st.sampled_from([0.0, 0.1, 0.2, 0.5, 0.9])
SEEDS = st.integers(0, 2**31 - 1)

# ------------------------------------------------------------------------------ node drop


@settings(max_examples=60, deadline=None)
@given(graphs(), RATIOS, SEEDS)
def test_node_drop_ratio_and_induced_subgraph(data, ratio, seed):
    out = NodeDrop(ratio, generator=torch.Generator().manual_seed(seed))(data)
    assert_valid(out)
    n = int(data.num_nodes)
    assert out.num_nodes == n - min(int(n * ratio), n - 1)
    ids = out.x[:, 0].long().tolist()
    assert len(set(ids)) == len(ids)  # features follow their nodes, no duplicates
    kept = set(ids)
    expected = {(u, v) for u, v in original_edges(data) if u in kept and v in kept}
    assert mapped_edges(out) == expected  # exactly the induced subgraph
    # edge attributes follow their edges
    ids_t = out.x[:, 0].long()
    assert torch.equal(out.edge_attr[:, 0].long(), ids_t[out.edge_index[0]])
    assert torch.equal(out.edge_attr[:, 1].long(), ids_t[out.edge_index[1]])


def test_node_drop_never_empties_a_graph():
    single = Data(x=torch.ones(1, 3), edge_index=torch.empty((2, 0), dtype=torch.long),
                  edge_attr=torch.empty((0, 2)))
    for ratio in (0.5, 0.99):
        assert NodeDrop(ratio)(single).num_nodes == 1
    two = Data(x=torch.ones(2, 3), edge_index=torch.tensor([[0, 1], [1, 0]]),
               edge_attr=torch.zeros(2, 2))
    assert NodeDrop(0.99)(two).num_nodes == 1
    assert NodeDrop(0.99, min_nodes=2)(two).num_nodes == 2


# ------------------------------------------------------------------------- edge perturbation


@settings(max_examples=60, deadline=None)
@given(graphs(min_nodes=2), RATIOS, SEEDS)
def test_edge_perturb_undirected_keeps_symmetry_and_count(data, ratio, seed):
    out = EdgePerturb(ratio, generator=torch.Generator().manual_seed(seed))(data)
    assert_valid(out)
    assert out.num_nodes == data.num_nodes and torch.equal(out.x, data.x)
    assert is_undirected(out.edge_index, num_nodes=out.num_nodes)
    m_und = data.edge_index.size(1) // 2
    k = int(m_und * ratio)
    assert out.edge_index.size(1) == data.edge_index.size(1)  # k removed, k added
    # at least m_und - k of the original undirected edges survive
    kept = original_edges(data) & original_edges(out)
    assert len(kept) // 2 >= m_und - k
    assert (out.edge_index[0] != out.edge_index[1]).all()  # added edges join distinct nodes


@settings(max_examples=60, deadline=None)
@given(graphs(min_nodes=2, undirected=False), RATIOS, SEEDS)
def test_edge_perturb_removal_only_graphcl_quirk(data, ratio, seed):
    t = EdgePerturb(ratio, add_edges=False, undirected=False,
                    generator=torch.Generator().manual_seed(seed))
    out = t(data)
    assert_valid(out)
    m = data.edge_index.size(1)
    assert out.edge_index.size(1) == m - int(m * ratio)
    assert original_edges(out) <= original_edges(data)
    # attributes still match their edges (they encode the endpoints)
    assert torch.equal(out.edge_attr.long().t(), out.edge_index)


def test_edge_perturb_added_edges_get_attributes_of_existing_edges():
    n = 12
    ei = torch.tensor([[i, i + 1] for i in range(n - 1)]).t()
    ei = torch.cat([ei, ei.flip(0)], dim=1)
    attr = torch.full((ei.size(1), 3), 7.0)
    out = EdgePerturb(0.5, generator=torch.Generator().manual_seed(1))(
        Data(x=torch.zeros(n, 1), edge_index=ei, edge_attr=attr))
    assert out.edge_attr.shape == (out.edge_index.size(1), 3)
    assert (out.edge_attr == 7.0).all()


# ------------------------------------------------------------------------- attribute masking


@settings(max_examples=40, deadline=None)
@given(graphs(), RATIOS, SEEDS)
def test_attr_mask_ratio(data, ratio, seed):
    out = AttrMask(ratio, mode="value", value=-7.0,
                   generator=torch.Generator().manual_seed(seed))(data)
    assert_valid(out)
    n = int(data.num_nodes)
    masked = (out.x == -7.0).all(dim=1)
    assert int(masked.sum()) == int(n * ratio)
    assert torch.equal(out.x[~masked], data.x[~masked])
    assert torch.equal(out.edge_index, data.edge_index)
    assert not (data.x == -7.0).any()  # the input is not modified in place


def test_attr_mask_gaussian_and_zero_and_missing_x():
    data = Data(x=torch.ones(100, 4), edge_index=torch.empty((2, 0), dtype=torch.long))
    g = torch.Generator().manual_seed(0)
    out = AttrMask(0.5, generator=g)(data)
    changed = (out.x != 1.0).any(dim=1)
    assert int(changed.sum()) == 50
    assert abs(float(out.x[changed].mean()) - 0.5) < 0.2  # N(0.5, 0.5) noise
    assert int((AttrMask(0.3, mode="zero")(data).x == 0).all(dim=1).sum()) == 30
    no_x = Data(edge_index=torch.tensor([[0], [1]]), num_nodes=2)
    assert AttrMask(0.5)(no_x).x is None
    ints = Data(x=torch.zeros(10, 2, dtype=torch.long), edge_index=torch.empty((2, 0),
                                                                               dtype=torch.long))
    out = AttrMask(0.5, mode="value", value=[119, 0])(ints)
    assert out.x.dtype == torch.long and int((out.x[:, 0] == 119).sum()) == 5


# ---------------------------------------------------------------------------------- subgraph


@settings(max_examples=60, deadline=None)
@given(graphs(), RATIOS, SEEDS)
def test_subgraph_is_connected_induced_and_within_ratio(data, ratio, seed):
    out = Subgraph(ratio, generator=torch.Generator().manual_seed(seed))(data)
    assert_valid(out)
    n = int(data.num_nodes)
    target = max(1, int(n * (1 - ratio)))
    kept = set(out.x[:, 0].long().tolist())
    assert mapped_edges(out) == {(u, v) for u, v in original_edges(data)
                                 if u in kept and v in kept}
    if target >= n:  # nothing to remove: the graph is returned as it is
        assert out.num_nodes == n
    else:
        assert 1 <= out.num_nodes <= target
        assert is_connected(out)  # grown by a walk from one seed node


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 40), RATIOS, SEEDS)
def test_subgraph_hits_target_on_connected_graph(n, ratio, seed):
    ei = torch.tensor([[i, i + 1] for i in range(n - 1)]).t()  # a path: connected
    ei = torch.cat([ei, ei.flip(0)], dim=1)
    data = Data(x=torch.arange(n).float().view(-1, 1), edge_index=ei)
    out = Subgraph(ratio, generator=torch.Generator().manual_seed(seed))(data)
    assert out.num_nodes == min(n, max(1, int(n * (1 - ratio))))


def test_subgraph_one_hop_quirk_stays_in_seed_neighbourhood():
    n = 30
    ei = torch.tensor([[i, i + 1] for i in range(n - 1)]).t()
    ei = torch.cat([ei, ei.flip(0)], dim=1)
    data = Data(x=torch.arange(n).float().view(-1, 1), edge_index=ei)
    for seed in range(20):
        out = Subgraph(0.2, one_hop=True, generator=torch.Generator().manual_seed(seed))(data)
        ids = sorted(out.x[:, 0].long().tolist())
        assert len(ids) <= 3 and ids[-1] - ids[0] <= 2  # seed plus at most its two neighbours


def test_subgraph_single_node_and_edgeless():
    data = Data(x=torch.ones(5, 1), edge_index=torch.empty((2, 0), dtype=torch.long))
    out = Subgraph(0.5)(data)
    assert out.num_nodes == 1 and out.edge_index.size(1) == 0


# ------------------------------------------------------------------ batches, RNG, composition


@settings(max_examples=25, deadline=None)
@given(st.lists(graphs(), min_size=1, max_size=6), SEEDS)
def test_batch_input_keeps_batch_vector_consistent(data_list, seed):
    batch = Batch.from_data_list(data_list)
    g = torch.Generator().manual_seed(seed)
    for t in (NodeDrop(0.5, generator=g), Subgraph(0.5, generator=g),
              EdgePerturb(0.3, generator=g), AttrMask(0.3, generator=g),
              graphcl_augmentation("random4", 0.3, generator=g)):
        out = t(batch)
        assert isinstance(out, Batch)
        assert out.num_graphs == len(data_list)
        assert out.batch.size(0) == out.x.size(0) == out.num_nodes
        counts = torch.bincount(out.batch, minlength=len(data_list))
        assert (counts >= 1).all()  # no graph of the batch becomes empty
        assert torch.equal(out.ptr[1:] - out.ptr[:-1], counts)
        # every edge stays inside its own graph
        assert torch.equal(out.batch[out.edge_index[0]], out.batch[out.edge_index[1]])
        assert out.edge_attr.size(0) == out.edge_index.size(1)


def test_generator_is_reproducible_and_leaves_global_rng_alone():
    data = Data(x=torch.rand(40, 3), edge_index=torch.randint(0, 40, (2, 120)),
                edge_attr=torch.rand(120, 2))
    state = torch.get_rng_state()
    for make in (lambda g: NodeDrop(0.3, generator=g), lambda g: Subgraph(0.3, generator=g),
                 lambda g: EdgePerturb(0.3, generator=g), lambda g: AttrMask(0.3, generator=g),
                 lambda g: graphcl_augmentation("random4", generator=g)):
        a = make(torch.Generator().manual_seed(5))(data)
        b = make(torch.Generator().manual_seed(5))(data)
        assert torch.equal(a.x, b.x) and torch.equal(a.edge_index, b.edge_index)
    assert torch.equal(state, torch.get_rng_state())
    # without a generator, torch.manual_seed makes the global draw reproducible
    torch.manual_seed(3)
    a = NodeDrop(0.3)(data)
    torch.manual_seed(3)
    b = NodeDrop(0.3)(data)
    assert torch.equal(a.x, b.x)


def test_compose_random_choice_and_names():
    data = Data(x=torch.rand(20, 2), edge_index=torch.randint(0, 20, (2, 50)),
                edge_attr=torch.rand(50, 1))
    out = T.Compose([NodeDrop(0.2), AttrMask(0.2), EdgePerturb(0.2)])(data)
    assert_valid(out)
    assert out.num_nodes == 16
    g = torch.Generator().manual_seed(0)
    choice = RandomChoice([NodeDrop(0.5, generator=g), Identity()], generator=g)
    sizes = {int(choice(data).num_nodes) for _ in range(50)}
    assert sizes == {10, 20}
    for name in ("none", "dnodes", "pedges", "mask_nodes", "subgraph", "random2", "random3",
                 "random4"):
        assert_valid(graphcl_augmentation(name, 0.2)(data))
    quirky = graphcl_augmentation("random3", graphcl_quirks=True)
    assert quirky.transforms[1].add_edges is False and quirky.transforms[2].one_hop is True
    with pytest.raises(ValueError):
        graphcl_augmentation("random9")
    with pytest.raises(ValueError):
        NodeDrop(1.0)
    with pytest.raises(ValueError):
        Subgraph(-0.1)
    with pytest.raises(ValueError):
        AttrMask(0.1, mode="value")


def test_feature_transforms_for_featureless_graphs():
    ei = torch.tensor([[0, 0, 0, 1, 2, 3], [1, 2, 3, 0, 0, 0]])
    data = Data(edge_index=ei, num_nodes=5)
    x = ConstantFeatures()(data).x
    assert x.shape == (5, 1) and (x == 1).all()
    deg = CappedOneHotDegree(max_degree=2)(data).x
    assert deg.shape == (5, 3)
    assert deg.argmax(1).tolist() == [2, 1, 1, 1, 0]  # degree 3 capped into the last bucket
    assert (deg.sum(1) == 1).all()


def test_two_view_dataset_collates_into_paired_batches():
    gen = torch.Generator().manual_seed(0)
    data_list = [Data(x=torch.rand(n, 3), edge_index=torch.randint(0, n, (2, 2 * n)),
                      edge_attr=torch.rand(2 * n, 1)) for n in range(3, 13)]
    pairs = TwoViewDataset(data_list, Identity(), graphcl_augmentation("random2", generator=gen))
    b0, b1 = next(iter(DataLoader(pairs, batch_size=4)))
    assert isinstance(b0, Batch) and isinstance(b1, Batch)
    assert b0.num_graphs == b1.num_graphs == 4
    assert b0.num_nodes == sum(d.num_nodes for d in data_list[:4])  # first view untouched
    assert b1.num_nodes < b0.num_nodes


# ------------------------------------------------------------------ HeteroData, repr, docs


ALL_TRANSFORMS = [NodeDrop(0.1), EdgePerturb(0.1), AttrMask(0.1), Subgraph(0.2), Identity(),
                  RandomChoice([NodeDrop(0.1), Subgraph(0.2)]), ConstantFeatures(),
                  CappedOneHotDegree(5)]


@pytest.mark.parametrize("transform", ALL_TRANSFORMS, ids=lambda t: type(t).__name__)
def test_hetero_data_input_raises_a_clear_type_error(transform):
    hetero = HeteroData()
    hetero["atom"].x = torch.rand(4, 3)
    hetero["atom", "bond", "atom"].edge_index = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(TypeError, match=rf"{type(transform).__name__} works on homogeneous "
                                        r"graphs .*HeteroData.*to_homogeneous\(\)"):
        transform(hetero)


def test_every_transform_has_an_informative_repr_like_pyg():
    gen = torch.Generator().manual_seed(0)
    assert repr(ConstantFeatures()) == "ConstantFeatures(value=1.0)"
    assert repr(ConstantFeatures(0.5, dtype=torch.float64)) == (
        "ConstantFeatures(value=0.5, dtype=torch.float64)")
    assert repr(CappedOneHotDegree(7)) == "CappedOneHotDegree(max_degree=7)"
    assert repr(NodeDrop(0.1, min_nodes=2, generator=gen)) == "NodeDrop(ratio=0.1, min_nodes=2)"
    assert repr(EdgePerturb(0.1, add_edges=False, undirected=False)) == (
        "EdgePerturb(ratio=0.1, add_edges=False, undirected=False)")
    assert repr(AttrMask(0.2)) == "AttrMask(ratio=0.2, mode='gaussian', mean=0.5, std=0.5)"
    assert repr(AttrMask(0.2, mode="value", value=[119, 0])) == (
        "AttrMask(ratio=0.2, mode='value', value=[119, 0])")
    assert repr(Subgraph(0.2, one_hop=True)) == "Subgraph(ratio=0.2, one_hop=True, min_nodes=1)"
    assert repr(Identity()) == "Identity()"
    assert repr(graphcl_augmentation("random2", 0.1)) == (
        "RandomChoice([NodeDrop(ratio=0.1, min_nodes=1), "
        "Subgraph(ratio=0.1, one_hop=False, min_nodes=1)])")
    # T.Compose shows ours the way it shows its own transforms
    assert repr(T.Compose([ConstantFeatures(), NodeDrop(0.1)])) == (
        "Compose([\n  ConstantFeatures(value=1.0),\n  NodeDrop(ratio=0.1, min_nodes=1)\n])")


def test_transforms_module_docstring_examples_run():
    import doctest

    import adaptcl.adapters.graphcl.features as features
    import adaptcl.adapters.graphcl.transforms as transforms

    results = [doctest.testmod(m, optionflags=doctest.ELLIPSIS) for m in (transforms, features)]
    assert results[0].attempted >= 6 and results[1].attempted >= 2
    assert sum(r.failed for r in results) == 0


def test_seeded_views_match_the_previous_release_exactly():
    """Seeded main-process runs draw the same stream as before the device/worker changes, so
    published results reproduce (these views were recorded with the previous version)."""
    n = 10
    ei = torch.tensor([[i, (i + 1) % n] for i in range(n)] + [[0, 5], [2, 7]]).t()
    data = Data(x=torch.arange(n, dtype=torch.float).view(-1, 1),
                edge_index=torch.cat([ei, ei.flip(0)], dim=1))

    def view(name: str) -> Data:
        return graphcl_augmentation(name, 0.3, generator=torch.Generator().manual_seed(0))(data)

    assert view("dnodes").x.view(-1).tolist() == [0, 2, 3, 5, 6, 8, 9]
    assert view("subgraph").x.view(-1).tolist() == [0, 3, 4, 5, 6, 8, 9]
    perturbed = view("pedges").edge_index
    assert perturbed.size(1) == 24 and {tuple(sorted(e)) for e in perturbed.t().tolist()} == {
        (0, 5), (0, 9), (1, 2), (2, 3), (3, 4), (4, 5), (6, 7), (6, 8), (6, 9), (7, 8), (8, 9)}
    masked = view("mask_nodes").x.view(-1)
    assert torch.allclose(masked, torch.tensor([0.0, 0.6245, 2.0, 3.0, 0.8236, 5.0, 6.0, 0.3323,
                                                8.0, 9.0]), atol=1e-4)


def test_subgraph_ratio_applies_to_the_subgraph_inside_a_random_pool_only():
    pool = graphcl_augmentation("random2", 0.1, subgraph_ratio=0.2, graphcl_quirks=True)
    drop, sub = pool.transforms
    assert (type(drop).__name__, drop.ratio) == ("NodeDrop", 0.1)
    assert (type(sub).__name__, sub.ratio, sub.one_hop) == ("Subgraph", 0.2, True)
    assert graphcl_augmentation("subgraph", 0.1).ratio == 0.1  # default: ratio
    with pytest.raises(ValueError):
        graphcl_augmentation("random2", 0.1, subgraph_ratio=1.5)
