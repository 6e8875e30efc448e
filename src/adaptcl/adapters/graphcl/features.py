"""Node features for graphs that have none, as torch-geometric transforms.

GraphCL's TU datasets without node attributes (IMDB-BINARY, the REDDIT sets) get a constant feature
(:class:`ConstantFeatures`) or a one-hot degree (:class:`CappedOneHotDegree`, which, unlike
``T.OneHotDegree``, never fails on a degree above its cap). Both write ``x`` on the graph's
device, in ``dtype`` (default ``torch.get_default_dtype()``), replacing any existing ``x``.

Reference: You et al., "Graph Contrastive Learning with Augmentations", NeurIPS 2020.
"""

from __future__ import annotations

from adaptcl.adapters import require

require("torch_geometric", "graph")

import torch  # noqa: E402
from torch_geometric.data import Data  # noqa: E402
from torch_geometric.transforms import BaseTransform  # noqa: E402
from torch_geometric.utils import degree, one_hot  # noqa: E402

from ._graph import _data_device, _num_nodes, _require_homogeneous  # noqa: E402

__all__ = ["CappedOneHotDegree", "ConstantFeatures"]


class ConstantFeatures(BaseTransform):
    """``x = full((n, 1), value)`` for graphs without node features (GraphCL: IMDB/REDDIT).

    ``x`` is made on the graph's device, in ``dtype`` (default ``torch.get_default_dtype()``);
    any existing ``x`` is replaced.

    >>> ConstantFeatures()
    ConstantFeatures(value=1.0)
    """

    def __init__(self, value: float = 1.0, dtype: torch.dtype | None = None) -> None:
        self.value = float(value)
        self.dtype = dtype

    def forward(self, data: Data) -> Data:
        _require_homogeneous(self, data)
        dtype = self.dtype if self.dtype is not None else torch.get_default_dtype()
        data.x = torch.full((_num_nodes(data), 1), self.value, dtype=dtype,
                            device=_data_device(data))
        return data

    def __repr__(self) -> str:
        dtype = f", dtype={self.dtype}" if self.dtype is not None else ""
        return f"{self.__class__.__name__}(value={self.value}{dtype})"


class CappedOneHotDegree(BaseTransform):
    """One-hot in-degree with degrees above ``max_degree`` put in the last bucket.

    Unlike ``T.OneHotDegree`` it never fails on a degree larger than ``max_degree``; the
    feature dimension is ``max_degree + 1``. Any existing ``x`` is replaced. Built on
    torch-geometric's ``degree`` and ``one_hot``, on the graph's device, in ``dtype``
    (default ``torch.get_default_dtype()``).

    >>> CappedOneHotDegree(max_degree=10)
    CappedOneHotDegree(max_degree=10)
    """

    def __init__(self, max_degree: int = 100, dtype: torch.dtype | None = None) -> None:
        if max_degree < 0:
            raise ValueError(f"max_degree must be >= 0, got {max_degree}")
        self.max_degree = int(max_degree)
        self.dtype = dtype

    def forward(self, data: Data) -> Data:
        _require_homogeneous(self, data)
        n = _num_nodes(data)
        edge_index = data.edge_index if "edge_index" in data else None
        if edge_index is None:
            edge_index = torch.empty((2, 0), dtype=torch.long, device=_data_device(data))
        deg = degree(edge_index[1], n, dtype=torch.long).clamp(max=self.max_degree)
        dtype = self.dtype if self.dtype is not None else torch.get_default_dtype()
        data.x = one_hot(deg, self.max_degree + 1, dtype=dtype)
        return data

    def __repr__(self) -> str:
        dtype = f", dtype={self.dtype}" if self.dtype is not None else ""
        return f"{self.__class__.__name__}(max_degree={self.max_degree}{dtype})"
