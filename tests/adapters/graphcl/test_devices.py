"""GraphCL transforms create every tensor on the data's device and in the data's dtype.

On this CPU machine device mistakes are caught with the ``meta`` device: a transform that
creates a CPU tensor (or calls ``.item()``/``.tolist()`` on the data) either fails there or
leaves a CPU tensor in its output, which :func:`assert_all_on` reports. The ``device`` fixture
runs the same checks on CUDA where it exists.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch_geometric")

import torch  # noqa: E402
from torch_geometric.data import Data  # noqa: E402

from adaptcl.adapters.graphcl import (  # noqa: E402
    AttrMask,
    CappedOneHotDegree,
    ConstantFeatures,
    EdgePerturb,
    Identity,
    NodeDrop,
    RandomChoice,
    Subgraph,
    graphcl_augmentation,
)

META = torch.device("meta")


def assert_all_on(data: Data, device: torch.device) -> None:
    for key, value in data:
        if isinstance(value, torch.Tensor):
            assert value.device.type == device.type, f"{key} is on {value.device}, not {device}"


def small_graph(device: torch.device, dtype: torch.dtype = torch.float64) -> Data:
    gen = torch.Generator().manual_seed(0)
    n, m = 12, 30
    return Data(x=torch.rand(n, 3, generator=gen, dtype=dtype),
                edge_index=torch.randint(0, n, (2, m), generator=gen),
                edge_weight=torch.rand(m, generator=gen, dtype=dtype),
                edge_type=torch.randint(0, 3, (m,), generator=gen)).to(device)


def every_augmentation(generator: torch.Generator | None):
    return [NodeDrop(0.3, generator=generator), Subgraph(0.3, generator=generator),
            EdgePerturb(0.3, generator=generator),
            EdgePerturb(0.3, undirected=False, generator=generator),
            AttrMask(0.3, generator=generator), AttrMask(0.3, mode="zero", generator=generator),
            AttrMask(0.3, mode="value", value=[1.0, 2.0, 3.0], generator=generator),
            graphcl_augmentation("random4", 0.3, generator=generator)]


@pytest.mark.parametrize("seeded", [False, True], ids=["global_rng", "cpu_generator"])
def test_augmentations_keep_every_tensor_on_the_data_device_and_dtype(device, seeded):
    data = small_graph(device)
    for aug in every_augmentation(torch.Generator().manual_seed(1) if seeded else None):
        out = aug(data)
        assert_all_on(out, device)
        assert out.x.dtype == torch.float64 and out.edge_weight.dtype == torch.float64, aug
        assert out.edge_index.dtype == torch.long and out.edge_type.dtype == torch.long, aug


def test_feature_transforms_follow_device_and_dtype(device):
    data = Data(edge_index=torch.tensor([[0, 0, 0, 1], [1, 2, 3, 0]], device=device),
                num_nodes=5)
    const = ConstantFeatures(2.0, dtype=torch.float64)(data).x
    assert const.device.type == device.type and const.dtype == torch.float64
    assert torch.equal(const.cpu(), torch.full((5, 1), 2.0, dtype=torch.float64))
    assert ConstantFeatures()(data).x.dtype == torch.get_default_dtype()
    deg = CappedOneHotDegree(max_degree=1, dtype=torch.bfloat16)(data).x
    assert deg.device.type == device.type and deg.dtype == torch.bfloat16
    assert deg.float().argmax(1).tolist() == [1, 1, 1, 1, 0]  # in-degree 1 (capped), or 0


# ---------------------------------------------------------------------------- meta device

META_READY = [
    ConstantFeatures(), CappedOneHotDegree(4), AttrMask(0.3), AttrMask(0.3, mode="zero"),
    AttrMask(0.3, mode="value", value=7.0), EdgePerturb(0.3, undirected=False),
    EdgePerturb(0.3, undirected=False, add_edges=False), Identity(),
    RandomChoice([AttrMask(0.3), EdgePerturb(0.3, undirected=False)]),
]


@pytest.mark.parametrize("transform", META_READY, ids=repr)
def test_transforms_run_on_meta_tensors_and_create_nothing_on_the_cpu(transform):
    out = transform(small_graph(META, dtype=torch.float32))
    assert_all_on(out, META)
    assert out.edge_weight.size(0) == out.edge_type.size(0) == out.edge_index.size(1)


def test_seeded_transforms_move_their_cpu_draws_to_the_meta_device():
    gen = torch.Generator().manual_seed(0)
    for transform in (AttrMask(0.3, generator=gen), EdgePerturb(0.3, undirected=False,
                                                                generator=gen)):
        assert_all_on(transform(small_graph(META)), META)


class _ConstantFeaturesOnCPU(ConstantFeatures):
    """A purpose-made regression: builds ``x`` without the data's device."""

    def forward(self, data: Data) -> Data:
        data.x = torch.ones(data.num_nodes, 1)
        return data


def test_meta_check_catches_a_transform_that_creates_a_cpu_tensor():
    data = Data(edge_index=torch.empty((2, 0), dtype=torch.long, device=META), num_nodes=3)
    assert_all_on(ConstantFeatures()(data), META)
    with pytest.raises(AssertionError, match="x is on cpu"):
        assert_all_on(_ConstantFeaturesOnCPU()(data), META)
