"""Randomness of seeded GraphCL transforms across DataLoader workers and epochs.

A transform built with ``generator=`` is copied into every DataLoader worker; replaying that
copy would give every worker, and every epoch, the same views. These tests pin what PyG and
torch users expect instead: distinct views across workers and epochs, reproduced by the seeds.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch_geometric")

import torch  # noqa: E402
from torch_geometric.data import Data  # noqa: E402
from torch_geometric.loader import DataLoader  # noqa: E402

from adaptcl.adapters.graphcl import (  # noqa: E402
    Identity,
    NodeDrop,
    RandomChoice,
    Subgraph,
    TwoViewDataset,
    worker_generator,
)

NUM_NODES = 24  # NodeDrop(0.5) then has C(24, 12) ~ 2.7e6 possible views: no chance repeats


def same_graph_dataset(copies: int = 8) -> list[Data]:
    """``copies`` copies of one path graph whose ``x`` holds the node ids."""
    ei = torch.tensor([[i, i + 1] for i in range(NUM_NODES - 1)]).t()
    ei = torch.cat([ei, ei.flip(0)], dim=1)
    graph = Data(x=torch.arange(NUM_NODES, dtype=torch.float).view(-1, 1), edge_index=ei)
    return [graph.clone() for _ in range(copies)]


def views_over_epochs(aug_seed: int, loader_seed: int, num_workers: int, epochs: int = 2,
                      persistent_workers: bool = False) -> list[tuple[int, ...]]:
    """The node ids kept in each second view, for every item of every epoch, in order."""
    aug = NodeDrop(0.5, generator=torch.Generator().manual_seed(aug_seed))
    pairs = TwoViewDataset(same_graph_dataset(), Identity(), aug)
    loader = DataLoader(pairs, batch_size=2, shuffle=False, num_workers=num_workers,
                        persistent_workers=persistent_workers,
                        generator=torch.Generator().manual_seed(loader_seed))
    views = []
    for _ in range(epochs):
        for _, view in loader:
            for graph in view.to_data_list():
                views.append(tuple(graph.x.view(-1).long().tolist()))
    return views


def test_seeded_transform_gives_distinct_views_across_two_workers_and_two_epochs():
    views = views_over_epochs(aug_seed=0, loader_seed=0, num_workers=2)
    assert len(views) == 16
    assert len(set(views)) == 16  # replaying the generator gave 4 distinct views among 8


def test_same_seeds_reproduce_the_views_of_a_multi_worker_loader():
    first = views_over_epochs(aug_seed=3, loader_seed=7, num_workers=2)
    assert views_over_epochs(aug_seed=3, loader_seed=7, num_workers=2) == first
    # either seed changes the views: the transform's generator still matters in workers
    assert views_over_epochs(aug_seed=4, loader_seed=7, num_workers=2) != first
    assert views_over_epochs(aug_seed=3, loader_seed=8, num_workers=2) != first


def test_persistent_workers_keep_drawing_new_views_each_epoch():
    views = views_over_epochs(aug_seed=0, loader_seed=0, num_workers=2, epochs=2,
                              persistent_workers=True)
    assert len(set(views)) == 16


def test_main_process_loader_advances_the_generator_across_epochs():
    views = views_over_epochs(aug_seed=0, loader_seed=0, num_workers=0)
    assert len(set(views)) == 16
    assert views_over_epochs(aug_seed=0, loader_seed=0, num_workers=0) == views


class _WorkerStreamProbe(torch.utils.data.Dataset):
    """Reports, per item, whether transforms sharing a generator share its worker stream."""

    def __init__(self) -> None:
        shared = torch.Generator().manual_seed(0)
        self.choice = RandomChoice([NodeDrop(0.5, generator=shared),
                                    Subgraph(0.5, generator=shared)], generator=shared)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, idx: int) -> torch.Tensor:
        streams = {id(worker_generator(t.generator))
                   for t in [self.choice, *self.choice.transforms]}
        own = worker_generator(self.choice.generator) is not self.choice.generator
        return torch.tensor([len(streams), int(own)])


def test_transforms_sharing_a_generator_share_one_stream_inside_a_worker():
    loader = torch.utils.data.DataLoader(_WorkerStreamProbe(), batch_size=1, num_workers=2)
    for row in loader:
        assert row.tolist() == [[1, 1]]  # one shared stream, and not the stored generator
