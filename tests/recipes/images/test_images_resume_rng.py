"""A run of ``adaptcl images`` killed after an epoch and resumed from that epoch's checkpoint is
the uninterrupted run, bit for bit: the loader's order and the augmentations draw from random
states that travel in the checkpoint (:class:`~adaptcl.adapters.lightning.trainer.RandomStates`).

The kill is simulated in-process: a callback raises at the start of epoch ``k`` (after epoch
``k - 1``'s checkpoint was written, before anything of epoch ``k`` ran), then the same cell is
trained again in the same checkpoint folder, as the recipe's rerun does (a new process starts
from the same seeds; the resume restores the rest). Loader without workers, as on the CPU.
"""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("lightly")
pytest.importorskip("pytorch_lightning")

from adaptcl.recipes.engine import Cell  # noqa: E402
from adaptcl.recipes.images import train  # noqa: E402
from adaptcl.recipes.images.config import ImagesConfig  # noqa: E402
from adaptcl.recipes.images.data import load_splits  # noqa: E402
from tests.recipes._lightning_kill import killed_once  # noqa: E402

TINY = dict(train_limit=96, test_limit=64, epochs=3, batch_size=32, width=0.0625,
            hidden_dim=16, output_dim=8, linear_epochs=0, knn_every=1,
            progress=False, device="cpu", threads=1, num_workers=0)
CELL = Cell((("dataset", "cifar10"), ("loss", "macl")), seed=0)


@pytest.mark.slow
def test_a_run_resumed_after_an_epoch_is_the_uninterrupted_run(shared_data, tmp_path,
                                                               monkeypatch):
    cfg = ImagesConfig(data_root=str(shared_data), output_dir=str(tmp_path), losses=["macl"],
                       **TINY)
    splits = load_splits(shared_data, cfg)
    whole = train.train_and_score(cfg, splits, CELL, tmp_path / "whole", tmp_path / "logs0")

    killed_once(monkeypatch, train, "lightning_trainer", lambda: train.train_and_score(
        cfg, splits, CELL, tmp_path / "resumed", tmp_path / "logs1"))
    assert (tmp_path / "resumed" / "last.ckpt").is_file()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = train.train_and_score(cfg, splits, CELL, tmp_path / "resumed",
                                        tmp_path / "logs2")

    assert resumed["resumed_from"]["start_epoch"] == 1  # resumed, not trained again
    steps = 3 * (96 // 32)
    assert [int(h["step"]) for h in resumed["history"]] == list(range(steps))
    # every step's loss and statistics, the online kNN of every epoch and the final scores
    assert resumed["losses"] == whole["losses"]
    assert resumed["history"] == whole["history"]
    assert resumed["online_knn"] == whole["online_knn"]
    assert resumed["metrics"] == whole["metrics"]
    # the folder of the run's own checkpoints is no news on a resume
    assert not [w for w in caught if "exists and is not empty" in str(w.message)]
