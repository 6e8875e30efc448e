"""The graph recipes' one training path (``recipes.common.graph_training.fit_graphs``) in one
process: what the two-process tests of ``tu`` and ``moleculenet`` cannot interrupt cheaply."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_geometric")
pytest.importorskip("pytorch_lightning")

from adaptcl.adapters.graphcl import (  # noqa: E402
    GraphCL,
    TUGINEncoder,
    TwoViewDataset,
    graphcl_augmentation,
)
from adaptcl.recipes.common.graph_training import fit_graphs  # noqa: E402
from tests.adapters.graphcl._graphs import random_graphs  # noqa: E402


def _pretrain(epochs: int, checkpoint_dir):
    """A GraphCL pre-training whose augmentations draw from a generator the checkpoint keeps."""
    torch.manual_seed(0)
    model = GraphCL(TUGINEncoder(4, 8, 2), loss_fn="macl")
    graphs = random_graphs(16)
    augment = torch.Generator()

    def pairs(rank: int) -> TwoViewDataset:
        augment.manual_seed(rank)
        aug = graphcl_augmentation("dnodes", 0.2, generator=augment)
        return TwoViewDataset(graphs, aug, aug)

    run = fit_graphs(model, pairs, epochs=epochs, batch_size=8, lr=0.01, device="cpu",
                     precision="32", shuffle_seed=1, where="pre-training macl",
                     checkpoint_dir=checkpoint_dir, generators={"augment": augment})
    return run, model


def test_a_run_stopped_after_an_epoch_resumes_from_lightnings_last_checkpoint(tmp_path, capsys):
    first, _ = _pretrain(1, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "last.ckpt").is_file() and first.steps == 2
    capsys.readouterr()
    resumed, model = _pretrain(2, tmp_path / "ckpt")
    assert (f"adaptcl: pre-training macl resumes from {tmp_path / 'ckpt' / 'last.ckpt'}"
            in capsys.readouterr().err)
    # the first epoch is the checkpoint's (history, epoch loss and time), the second is new
    assert resumed.steps == 4 and len(resumed.step_stats["temperature"]) == 4
    assert resumed.step_stats["loss"][:2] == first.step_stats["loss"]
    assert resumed.epoch_loss[0] == first.epoch_loss[0] and len(resumed.epoch_loss) == 2
    assert resumed.epoch_seconds[0] == first.epoch_seconds[0]
    # and the second epoch is the uninterrupted run's: weights, optimiser, data order and the
    # augmentation stream (``generators=``) all come back from the checkpoint
    uninterrupted, reference = _pretrain(2, None)
    assert resumed.step_stats == uninterrupted.step_stats
    assert resumed.epoch_loss == uninterrupted.epoch_loss
    for (name, value), expected in zip(model.state_dict().items(),
                                       reference.state_dict().values(), strict=True):
        assert torch.equal(value, expected), name
