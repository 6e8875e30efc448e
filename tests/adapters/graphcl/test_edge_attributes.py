"""GraphCL augmentations keep every node- and edge-level attribute aligned with its graph.

Graphs here carry ``edge_weight`` (for ``GCNConv``), ``edge_type`` (for ``RGCNConv``), a
multi-column ``edge_attr`` and a per-edge tensor whose name says nothing (``bond_length``);
every per-edge value encodes its edge's original endpoints, so a value that drifts to another
edge is caught, not only a length mismatch.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch_geometric")

import torch  # noqa: E402
from torch_geometric.data import Batch, Data  # noqa: E402
from torch_geometric.nn import GCNConv, RGCNConv  # noqa: E402

from adaptcl.adapters.graphcl import EdgePerturb, NodeDrop, Subgraph  # noqa: E402

NUM_NODES = 20
NUM_RELATIONS = 3


def endpoint_code(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A symmetric, unique code of an undirected edge from its original endpoints."""
    return (torch.minimum(u, v) * NUM_NODES + torch.maximum(u, v) + 1).float()


def relational_graph(seed: int) -> Data:
    gen = torch.Generator().manual_seed(seed)
    n = NUM_NODES
    pairs = {(int(a), int(b)) for a, b in torch.randint(0, n, (40, 2), generator=gen).tolist()
             if a != b}
    pairs = sorted({(min(a, b), max(a, b)) for a, b in pairs})
    und = torch.tensor(pairs).t()
    ei = torch.cat([und, und.flip(0)], dim=1)
    u, v = ei
    code = endpoint_code(u, v)
    return Data(
        x=torch.cat([torch.arange(n, dtype=torch.float).view(-1, 1), torch.rand(n, 2,
                                                                                generator=gen)], 1),
        node_mark=torch.arange(n) * 10,  # a node-level attribute besides x
        edge_index=ei,
        edge_weight=code,
        edge_type=(u + v) % NUM_RELATIONS,
        edge_attr=torch.stack([code, -code], dim=1),
        bond_length=code * 0.5,  # per-edge, found by its length like torch-geometric does
        num_nodes=n,
    )


def assert_edges_carry_their_attributes(out: Data, first: int = 0, last: int | None = None):
    """Edges ``first:last`` carry exactly the attributes of their original endpoints."""
    ids = out.x[:, 0].long()
    u, v = ids[out.edge_index[0, first:last]], ids[out.edge_index[1, first:last]]
    code = endpoint_code(u, v)
    assert torch.equal(out.edge_weight[first:last], code)
    assert torch.equal(out.edge_type[first:last], (u + v) % NUM_RELATIONS)
    assert torch.equal(out.edge_attr[first:last], torch.stack([code, -code], dim=1))
    assert torch.equal(out.bond_length[first:last], code * 0.5)


def assert_lengths_match(out: Data) -> None:
    m = out.edge_index.size(1)
    for key in ("edge_weight", "edge_type", "edge_attr", "bond_length"):
        assert out[key].size(0) == m, key
    assert out.node_mark.size(0) == out.x.size(0) == out.num_nodes


def edge_records(data: Data) -> list[tuple[float, ...]]:
    """(edge_weight, edge_type, bond_length) of each edge, in order."""
    cols = [data.edge_weight, data.edge_type.float(), data.bond_length]
    return [tuple(row) for row in torch.stack(cols, dim=1).tolist()]


def run_convs(out: Data, edge_type: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """GCNConv on ``edge_weight`` and RGCNConv on ``edge_type`` (or the one given), seeded."""
    torch.manual_seed(0)
    gcn = GCNConv(3, 4)
    rgcn = RGCNConv(3, 4, num_relations=NUM_RELATIONS)
    types = out.edge_type if edge_type is None else edge_type
    return gcn(out.x, out.edge_index, out.edge_weight), rgcn(out.x, out.edge_index, types)


@pytest.mark.parametrize("make", [lambda g: NodeDrop(0.4, generator=g),
                                  lambda g: Subgraph(0.4, generator=g)],
                         ids=["NodeDrop", "Subgraph"])
def test_node_drop_and_subgraph_keep_edge_weight_and_edge_type_with_their_edges(make):
    for seed in range(5):
        data = relational_graph(seed)
        out = make(torch.Generator().manual_seed(seed))(data)
        assert out.num_nodes < data.num_nodes
        assert_lengths_match(out)
        assert_edges_carry_their_attributes(out)
        assert torch.equal(out.node_mark, out.x[:, 0].long() * 10)  # node attributes follow
        h_gcn, h_rgcn = run_convs(out)
        assert h_gcn.shape == h_rgcn.shape == (out.num_nodes, 4)
        # RGCN on the kept types equals RGCN on types recomputed from the endpoints
        ids = out.x[:, 0].long()
        recomputed = (ids[out.edge_index[0]] + ids[out.edge_index[1]]) % NUM_RELATIONS
        assert torch.equal(h_rgcn, run_convs(out, edge_type=recomputed)[1])


@pytest.mark.parametrize("undirected", [True, False])
def test_edge_perturb_keeps_every_per_edge_attribute_aligned_for_gcn_and_rgcn(undirected):
    for seed in range(5):
        data = relational_graph(seed)
        out = EdgePerturb(0.3, undirected=undirected,
                          generator=torch.Generator().manual_seed(seed))(data)
        m = data.edge_index.size(1)
        n_changed = int((m // 2 if undirected else m) * 0.3) * (2 if undirected else 1)
        assert n_changed > 0 and out.edge_index.size(1) == m
        assert_lengths_match(out)
        assert torch.equal(out.x, data.x) and torch.equal(out.node_mark, data.node_mark)
        # kept edges come first and still carry their own attributes ...
        assert_edges_carry_their_attributes(out, last=m - n_changed)
        # ... added edges copy all attributes together from one existing edge
        originals = set(edge_records(data))
        added = edge_records(out)[m - n_changed:]
        assert set(added) <= originals
        assert torch.equal(out.edge_attr[:, 0], out.edge_weight)
        if undirected:  # both directions of an added edge get the same attributes
            half = n_changed // 2
            assert added[:half] == added[half:]
        h_gcn, h_rgcn = run_convs(out)
        assert h_gcn.shape == h_rgcn.shape == (NUM_NODES, 4)
        assert torch.isfinite(h_gcn).all() and torch.isfinite(h_rgcn).all()


def test_removal_only_edge_perturb_gives_the_edge_subgraph_of_kept_edges():
    data = relational_graph(0)
    out = EdgePerturb(0.5, add_edges=False, generator=torch.Generator().manual_seed(1))(data)
    assert out.edge_index.size(1) < data.edge_index.size(1)
    assert_lengths_match(out)
    assert_edges_carry_their_attributes(out)


def test_batched_relational_graphs_stay_aligned_under_every_augmentation():
    batch = Batch.from_data_list([relational_graph(s) for s in range(4)])
    g = torch.Generator().manual_seed(0)
    for t in (NodeDrop(0.3, generator=g), Subgraph(0.3, generator=g),
              EdgePerturb(0.3, add_edges=False, generator=g)):
        out = t(batch)
        assert out.num_graphs == 4
        for graph in out.to_data_list():
            assert_lengths_match(graph)
            assert_edges_carry_their_attributes(graph)
        h_gcn, h_rgcn = run_convs(out)
        assert h_gcn.shape == h_rgcn.shape == (out.num_nodes, 4)
