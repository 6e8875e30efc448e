"""GIN encoders of GraphCL's two settings.

* :class:`TUGINEncoder` -- the encoder of GraphCL's unsupervised TU setting (You et al., 2020,
  code from InfoGraph, Sun et al., 2020): ``num_layers`` x ``GINConv`` (MLP
  ``Linear-ReLU-Linear``), each followed by ReLU then BatchNorm; every layer's node
  embeddings are sum-pooled and the pooled vectors are concatenated, so 3 layers x 32 hidden
  give a 96-dim graph embedding.
* :class:`MolGINEncoder` -- the 5-layer, 300-dim GIN of Hu et al., "Strategies for Pre-training
  Graph Neural Networks" (ICLR 2020), used by GraphCL's transfer-learning setting, here on OGB
  molecular features (``ogb.utils.smiles2graph``): ``AtomEncoder``/``BondEncoder`` embeddings and
  a GIN layer with edge features, ``h' = MLP((1 + eps) h_i + sum_j ReLU(h_j + e_ji))`` with
  ``MLP = Linear(300, 600)-BatchNorm-ReLU-Linear(600, 300)`` (the OGB form of Hu et al.'s
  layer; Hu et al.'s own code adds self-loops with a special bond type instead of ``eps``),
  BatchNorm after each layer, ReLU on all but the last, dropout, then a readout.

Both take a ``Data``/``Batch`` and return ``[num_graphs, out_dim]``; ``return_nodes=True`` also
returns the node embeddings.

Example::

    enc = TUGINEncoder(in_channels=dataset.num_features)   # 3 x 32 -> 96
    g = enc(batch)                                           # [batch.num_graphs, 96]
"""

from __future__ import annotations

from adaptcl.adapters import require

require("torch_geometric", "graph")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from torch_geometric.nn import (  # noqa: E402
    GINConv,
    GINEConv,
    global_add_pool,
    global_max_pool,
    global_mean_pool,
)

__all__ = ["TUGINEncoder", "MolGINEncoder"]


def _batch_vector(data) -> tuple[Tensor, int]:
    batch = getattr(data, "batch", None)
    n = int(data.num_nodes)
    if batch is None:
        return torch.zeros(n, dtype=torch.long, device=data.edge_index.device), 1
    num_graphs = int(getattr(data, "num_graphs", int(batch.max()) + 1 if n else 0))
    return batch, num_graphs


class TUGINEncoder(nn.Module):
    """GIN of GraphCL's unsupervised TU setting: sum pooling of every layer, concatenated.

    Args:
        in_channels: node feature dimension (1 for graphs without ``x``: ones are used, as
            GraphCL does).
        hidden_channels: width of each GIN layer (32 in GraphCL).
        num_layers: number of GIN layers (3 in GraphCL); ``out_dim = hidden * num_layers``.

    The layers run in float32 even inside ``torch.autocast`` (bf16 sums lose the gradient:
    ``tests/adapters/graphcl/test_mixed_precision.py``).
    """

    def __init__(self, in_channels: int, hidden_channels: int = 32, num_layers: int = 3) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.in_channels = int(in_channels)
        self.hidden_channels = int(hidden_channels)
        self.num_layers = int(num_layers)
        self.out_dim = self.hidden_channels * self.num_layers
        self.convs = nn.ModuleList()
        self.bns = nn.ModuleList()
        for i in range(num_layers):
            d_in = self.in_channels if i == 0 else self.hidden_channels
            mlp = nn.Sequential(nn.Linear(d_in, hidden_channels), nn.ReLU(),
                                nn.Linear(hidden_channels, hidden_channels))
            self.convs.append(GINConv(mlp))
            self.bns.append(nn.BatchNorm1d(hidden_channels))

    def forward(self, data, return_nodes: bool = False):
        batch, num_graphs = _batch_vector(data)
        x = getattr(data, "x", None)
        if x is None:
            x = torch.ones((int(data.num_nodes), 1), device=batch.device)
        x = x.float()
        xs = []
        # Always float32, autocast or not: under bf16 the GIN's neighbourhood sums keep 8 bits of
        # mantissa and the gradient drifts 40-100 % from float32's (2.4 % in float32). At 3 x 32
        # the float32 layers cost next to nothing next to the loss.
        with torch.autocast(device_type=x.device.type, enabled=False):
            for conv, bn in zip(self.convs, self.bns, strict=True):
                x = bn(F.relu(conv(x, data.edge_index)))
                xs.append(x)
        pooled = torch.cat([global_add_pool(h, batch, size=num_graphs) for h in xs], dim=1)
        if return_nodes:
            return pooled, torch.cat(xs, dim=1)
        return pooled


class MolGINEncoder(nn.Module):
    """5-layer, 300-dim GIN with OGB atom/bond encoders (Hu et al., 2020).

    Args:
        num_layers: GIN layers (5). emb_dim: width (300). drop_ratio: dropout after each
        layer (0 for GraphCL pre-training, 0.5 for fine-tuning). jk: ``last``, ``sum`` or
        ``concat`` (``out_dim = num_layers * emb_dim``). pooling: ``mean`` (Hu et al.),
        ``sum``, ``max`` or ``none`` (return node embeddings as the first output).

    Input: a ``Data``/``Batch`` with integer ``x`` [N, 9] and ``edge_attr`` [E, 3] as produced by
    ``ogb.utils.smiles2graph``.
    """

    def __init__(self, num_layers: int = 5, emb_dim: int = 300, drop_ratio: float = 0.0,
                 jk: str = "last", pooling: str = "mean") -> None:
        super().__init__()
        require("ogb", "graph")
        from ogb.graphproppred.mol_encoder import AtomEncoder, BondEncoder

        if num_layers < 2:
            raise ValueError("MolGINEncoder needs at least 2 layers (as Hu et al.)")
        if jk not in ("last", "sum", "concat"):
            raise ValueError(f"jk must be 'last', 'sum' or 'concat', got {jk!r}")
        if pooling not in ("mean", "sum", "max", "none"):
            raise ValueError(f"pooling must be mean/sum/max/none, got {pooling!r}")
        self.num_layers, self.emb_dim = int(num_layers), int(emb_dim)
        self.drop_ratio, self.jk, self.pooling = float(drop_ratio), jk, pooling
        self.out_dim = emb_dim * num_layers if jk == "concat" else emb_dim
        self.atom_encoder = AtomEncoder(emb_dim)
        self.bond_encoders = nn.ModuleList()
        self.convs = nn.ModuleList()
        self.bns = nn.ModuleList()
        for _ in range(num_layers):
            mlp = nn.Sequential(nn.Linear(emb_dim, 2 * emb_dim), nn.BatchNorm1d(2 * emb_dim),
                                nn.ReLU(), nn.Linear(2 * emb_dim, emb_dim))
            self.bond_encoders.append(BondEncoder(emb_dim))
            self.convs.append(GINEConv(mlp, train_eps=True))
            self.bns.append(nn.BatchNorm1d(emb_dim))

    def node_embeddings(self, data) -> Tensor:
        h = self.atom_encoder(data.x.long())
        hs = []
        for layer in range(self.num_layers):
            e = self.bond_encoders[layer](data.edge_attr.long())
            h = self.bns[layer](self.convs[layer](h, data.edge_index, e))
            if layer < self.num_layers - 1:
                h = F.relu(h)
            h = F.dropout(h, self.drop_ratio, training=self.training)
            hs.append(h)
        if self.jk == "last":
            return hs[-1]
        if self.jk == "sum":
            return torch.stack(hs).sum(0)
        return torch.cat(hs, dim=1)

    def forward(self, data, return_nodes: bool = False):
        nodes = self.node_embeddings(data)
        if self.pooling == "none":
            return (nodes, nodes) if return_nodes else nodes
        batch, num_graphs = _batch_vector(data)
        pool = {"mean": global_mean_pool, "sum": global_add_pool, "max": global_max_pool}
        pooled = pool[self.pooling](nodes, batch, size=num_graphs)
        return (pooled, nodes) if return_nodes else pooled
