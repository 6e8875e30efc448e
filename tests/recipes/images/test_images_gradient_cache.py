"""``adaptcl images --mini-batch-size``: trains with gradient caching, is part of a run's identity
(the ResNet's BatchNorm normalises per chunk) only where it caches, resumes after a kill as the
uninterrupted run, and the bad sizes are one line before any file."""

from __future__ import annotations

import json
import warnings

import pytest

pytest.importorskip("lightly")
pytest.importorskip("pytorch_lightning")

from adaptcl import cli  # noqa: E402
from adaptcl.recipes.engine import Cell  # noqa: E402
from adaptcl.recipes.images import train  # noqa: E402
from adaptcl.recipes.images.config import ImagesConfig  # noqa: E402
from adaptcl.recipes.images.data import load_splits  # noqa: E402
from tests.recipes._cli import one_line_error  # noqa: E402
from tests.recipes._lightning_kill import killed_once  # noqa: E402
from tests.recipes.images.test_images_resume_rng import TINY as RESUME_TINY  # noqa: E402

TINY = ["--train-limit", "64", "--test-limit", "32", "--epochs", "1", "--batch-size", "32",
        "--width", "0.0625", "--hidden-dim", "16", "--output-dim", "8", "--linear-epochs", "0",
        "--knn-every", "0", "--no-progress", "--no-plot", "--device", "cpu", "--threads", "1",
        "--losses", "macl", "--seeds", "0"]


def _run(shared_data, out, *extra) -> dict:
    assert cli.main(["images", "--data-root", str(shared_data), "--output-dir", str(out),
                     *TINY, *extra]) == 0
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow  # four tiny runs (two reuse)
def test_cached_runs_train_and_enter_the_identity_only_where_they_cache(shared_data, tmp_path):
    out = tmp_path / "run"
    plain = _run(shared_data, out)["runs"][0]
    # a mini-batch of the whole batch caches nothing: the uncached run's cell, reused
    whole = _run(shared_data, out, "--mini-batch-size", "32")
    assert len(whole["reused"]) == 1 and whole["runs"][0]["losses"] == plain["losses"]
    cached = _run(shared_data, out, "--mini-batch-size", "8")
    assert len(cached["computed"]) == 1 and not cached["reused"]  # BatchNorm per chunk
    run = cached["runs"][0]
    assert run["optimisation_steps"] == 2 and run["step_seconds"] > 0
    assert run["losses"][0] != plain["losses"][0]  # the chunk's statistics, not the batch's
    assert "Seconds per training step" in (out / "results.md").read_text()
    assert len(_run(shared_data, out, "--mini-batch-size", "8")["reused"]) == 1


RESUME = {**RESUME_TINY, "mini_batch_size": 8}  # the resume test's run, cached
CELL = Cell((("dataset", "cifar10"), ("loss", "macl")), seed=0)


@pytest.mark.slow
def test_a_cached_run_killed_after_an_epoch_resumes_as_the_uninterrupted_run(
        shared_data, tmp_path, monkeypatch):
    """The chunks' BatchNorm statistics travel in the checkpoint; every step's loss and the
    scores equal the uninterrupted cached run's, bit for bit."""
    cfg = ImagesConfig(data_root=str(shared_data), output_dir=str(tmp_path), losses=["macl"],
                       **RESUME)
    splits = load_splits(shared_data, cfg)
    whole = train.train_and_score(cfg, splits, CELL, tmp_path / "whole", tmp_path / "logs0")
    killed_once(monkeypatch, train, "lightning_trainer", lambda: train.train_and_score(
        cfg, splits, CELL, tmp_path / "resumed", tmp_path / "logs1"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed = train.train_and_score(cfg, splits, CELL, tmp_path / "resumed",
                                        tmp_path / "logs2")
    assert resumed["resumed_from"]["start_epoch"] == 1
    assert resumed["history"] == whole["history"]
    assert resumed["online_knn"] == whole["online_knn"]
    assert resumed["metrics"] == whole["metrics"]


@pytest.mark.parametrize(("argv", "expected"), [
    (["--mini-batch-size", "100"], "mini_batch_size (100) must divide batch_size (128) into "
                                   "chunks of one size, e.g. 64 or 128"),
    (["--mini-batch-size", "256"], "mini_batch_size (256) must be at most batch_size (128)"),
    (["--mini-batch-size", "-8"], "mini_batch_size must be a positive number, got -8"),
    (["--mini-batch-size", "8", "16"], "--mini-batch-size takes one value"),
    (["--batch-size", "64", "--mini-batch-size", "48"], "mini_batch_size (48) must divide "
                                                        "batch_size (64)"),
])
def test_bad_mini_batch_sizes_are_one_line_before_any_file(shared_data, tmp_path, capsys, argv,
                                                           expected):
    out = tmp_path / "out"
    one_line_error(capsys, ["images", "--data-root", str(shared_data), "--output-dir",
                             str(out), *argv], expected)
    assert not out.exists()
