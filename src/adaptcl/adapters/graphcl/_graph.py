"""Checks and look-ups on one torch-geometric graph, shared by the GraphCL modules (private to
this package)."""

from __future__ import annotations

from adaptcl.adapters import require

require("torch_geometric", "graph")

import torch  # noqa: E402
from torch import Tensor  # noqa: E402
from torch_geometric.data import Data, HeteroData  # noqa: E402
from torch_geometric.transforms import BaseTransform  # noqa: E402


def _check_ratio(ratio: float, name: str = "ratio") -> float:
    ratio = float(ratio)
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {ratio}")
    return ratio


def _check_min_nodes(min_nodes: int) -> int:
    if min_nodes < 1:
        raise ValueError(f"min_nodes must be >= 1, got {min_nodes}")
    return int(min_nodes)


def _num_nodes(data: Data) -> int:
    n = data.num_nodes
    return 0 if n is None else int(n)


def _data_device(data: Data) -> torch.device:
    """The device of the graph: that of ``edge_index``, else ``x``, else any tensor, else CPU."""
    for key in ("edge_index", "x"):
        value = data[key] if key in data else None
        if isinstance(value, Tensor):
            return value.device
    for _, value in data:
        if isinstance(value, Tensor):
            return value.device
    return torch.device("cpu")


def _require_homogeneous(transform: BaseTransform, data: object) -> None:
    if isinstance(data, HeteroData):
        raise TypeError(
            f"{transform.__class__.__name__} works on homogeneous graphs (Data or Batch), got "
            "HeteroData; convert with data.to_homogeneous() (node_type/edge_type stay aligned "
            "as node- and edge-level attributes) or apply it to each node/edge type yourself")
