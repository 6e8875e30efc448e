"""A run of ``adaptcl clip`` killed after an epoch and resumed from that epoch's checkpoint is the
uninterrupted run, bit for bit: the loader's order draws from random states that travel in the
checkpoint (:class:`~adaptcl.adapters.lightning.trainer.RandomStates`), as in ``images``.

The kill is simulated in-process: a callback raises at the start of epoch ``k`` (after epoch
``k - 1``'s checkpoint was written, before anything of epoch ``k`` ran), then the same cell is
trained again in the same checkpoint folder, as the recipe's rerun does (a new process starts
from the same seeds; the resume restores the rest). Loader without workers, as on the CPU.
"""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("open_clip")
pytest.importorskip("pytorch_lightning")

from adaptcl.recipes.clip import train  # noqa: E402
from adaptcl.recipes.clip.config import ClipConfig  # noqa: E402
from adaptcl.recipes.clip.data import CaptionTokens, load_clip_data, templates_of  # noqa: E402
from adaptcl.recipes.engine import Cell  # noqa: E402
from tests.recipes._lightning_kill import killed_once  # noqa: E402

TINY = dict(train_limit=64, test_limit=40, retrieval_limit=20, batch_size=32, epochs=3,
            warmup_steps=1, patch_size=16, vision_width=32, text_width=32, head_width=16,
            vision_layers=1, text_layers=1, embed_dim=16, templates=3, context_length=12,
            threads=1, device="cpu", progress=False, num_workers=0)
CELL = Cell((("dataset", "cifar10"), ("loss", "macl")), seed=0)


@pytest.mark.slow
def test_a_run_resumed_after_an_epoch_is_the_uninterrupted_run(shared_data, tmp_path,
                                                               monkeypatch):
    cfg = ClipConfig(data_root=str(shared_data), output_dir=str(tmp_path), losses=["macl"],
                     targets=["pairs"], **TINY)
    data = load_clip_data(shared_data, cfg)
    tokens = CaptionTokens(data.classnames, templates_of(cfg), cfg.context_length)
    whole = train.train_and_score(cfg, data, tokens, CELL, tmp_path / "whole", tmp_path / "l0")

    killed_once(monkeypatch, train, "build_trainer", lambda: train.train_and_score(
        cfg, data, tokens, CELL, tmp_path / "resumed", tmp_path / "l1"))
    assert (tmp_path / "resumed" / "last.ckpt").is_file()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = train.train_and_score(cfg, data, tokens, CELL, tmp_path / "resumed",
                                        tmp_path / "l2")

    assert resumed["resumed_from"]["start_epoch"] == 1  # resumed, not trained again
    steps = 3 * (64 // 32)
    assert [int(h["step"]) for h in resumed["history"]] == list(range(steps))
    # every step's loss, temperatures and statistics, and the final scores
    assert resumed["losses"] == whole["losses"]
    assert resumed["history"] == whole["history"]
    assert resumed["final_temperature"] == whole["final_temperature"]
    assert resumed["metrics"] == whole["metrics"]
    # the folder of the run's own checkpoints is no news on a resume
    assert not [w for w in caught if "exists and is not empty" in str(w.message)]
