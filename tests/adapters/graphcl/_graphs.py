"""Small random undirected graphs (5-11 nodes, 4 features) for the training tests, the same for a
given count every time."""

from __future__ import annotations

import torch
from torch_geometric.data import Data


def random_graphs(num_graphs: int) -> list[Data]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(num_graphs):
        n = int(torch.randint(5, 12, (1,), generator=gen))
        ei = torch.randint(0, n, (2, 2 * n), generator=gen)
        out.append(Data(x=torch.rand(n, 4, generator=gen),
                        edge_index=torch.cat([ei, ei.flip(0)], dim=1)))
    return out
