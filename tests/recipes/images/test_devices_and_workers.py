"""The images recipe on a GPU, checked on the CPU: evaluation on the run's device (not the CPU
Lightning's teardown leaves the module on), loader workers chosen for CUDA, the time per epoch
in the results, and a SIGTERM with loader workers alive that stays one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("lightly")
pytest.importorskip("pytorch_lightning")

from adaptcl.recipes.engine import Cell, torch_env  # noqa: E402
from adaptcl.recipes.images import train  # noqa: E402
from adaptcl.recipes.images.config import ImagesConfig  # noqa: E402
from adaptcl.recipes.images.data import load_splits  # noqa: E402
from adaptcl.recipes.images.recipe import epoch_times  # noqa: E402
from tests.recipes._process import env_with_src  # noqa: E402

TINY = dict(train_limit=128, test_limit=64, batch_size=64, width=0.0625, hidden_dim=32,
            output_dim=16, linear_epochs=0, knn_every=0, progress=False, threads=1)


@pytest.mark.slow
def test_evaluation_runs_on_the_configured_device_not_where_teardown_left_the_module(
        shared_data, tmp_path, monkeypatch):
    """``--device`` resolved to ``meta`` (standing for CUDA: Lightning trains on the CPU
    accelerator for any name but ``cuda``): after ``fit`` the module is on the CPU, and the
    evaluation is handed the configured device and the backbone, never ``module.device``."""
    cfg = ImagesConfig(data_root=str(shared_data), output_dir=str(tmp_path), epochs=1,
                       losses=["infonce"], **TINY)
    monkeypatch.setattr(train, "resolve_device", lambda device: "meta")
    seen = {}

    def evaluate(backbone, bank, test, num_classes, *, device, cfg, seed, where):
        seen.update(device=device, backbone=next(backbone.parameters()).device.type)
        return {"knn_top1": 0.5}

    monkeypatch.setattr(train, "evaluate_backbone", evaluate)
    cell = Cell((("dataset", "cifar10"), ("loss", "infonce")), seed=0)
    record = train.train_and_score(cfg, load_splits(shared_data, cfg), cell, tmp_path / "ckpt",
                                   tmp_path / "logs")
    assert seen == {"device": "meta", "backbone": "cpu"}  # trained, torn down, then evaluated
    assert record["metrics"] == {"knn_top1": 0.5}
    assert len(record["epoch_seconds"]) == 1 and record["epoch_seconds"][0] > 0
    assert record["train_seconds"] == sum(record["epoch_seconds"])
    assert record["loader_workers"] == 0


def test_loader_workers_default_to_none_on_the_cpu_and_to_the_cpus_on_cuda(shared_data,
                                                                           monkeypatch):
    cfg = ImagesConfig(data_root=str(shared_data), **TINY)
    assert cfg.num_workers is None
    splits = load_splits(shared_data, cfg)
    for loader in train.loaders(cfg, splits, seed=0):  # the CPU: as before, in the process
        assert (loader.num_workers, loader.pin_memory, loader.persistent_workers) == (0, False, False)

    monkeypatch.setattr(train, "resolve_device", lambda device: "cuda")
    monkeypatch.setattr(torch_env.os, "sched_getaffinity", lambda pid: set(range(13)), raising=False)
    for loader in train.loaders(ImagesConfig(data_root=str(shared_data), device="cuda", **TINY),
                                splits, seed=0):
        assert (loader.num_workers, loader.pin_memory, loader.persistent_workers) == (12, True, True)
    explicit = ImagesConfig(data_root=str(shared_data), device="cuda", num_workers=0, **TINY)
    for loader in train.loaders(explicit, splits, seed=0):  # given: kept, memory still pinned
        assert (loader.num_workers, loader.pin_memory, loader.persistent_workers) == (0, True, False)


def test_the_table_notes_the_seconds_per_epoch_of_each_loss():
    def cell(loss, seed):
        return Cell((("dataset", "cifar10"), ("loss", loss)), seed=seed)

    records = {cell("infonce", 0): {"epoch_seconds": [1.0, 3.0], "loader_workers": 4},
               cell("infonce", 1): {"epoch_seconds": [2.0], "loader_workers": 4},
               cell("macl", 0): {"epoch_seconds": [5.0], "loader_workers": 4},
               cell("amcl", 0): {"train_seconds": 9.0}}  # stored before epochs were timed
    assert epoch_times(records) == ("Seconds per training epoch (mean over epochs and seeds): "
                                    "infonce 2, macl 5; DataLoader workers: 4.\n\n")
    assert epoch_times({cell("amcl", 0): {}}) == ""


@pytest.mark.slow
def test_sigterm_with_loader_workers_is_one_line_and_exit_143(shared_data, tmp_path):
    """``timeout``, ``kill -- -PGID`` or a scheduler sends SIGTERM to the whole process group:
    the DataLoader workers die of it too, and the run still stops with one line and 143."""
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "adaptcl", "images", "--data-root", str(shared_data),
            "--losses", "infonce", "--seeds", "0", "--epochs", "100", "--train-limit", "128",
            "--test-limit", "64", "--batch-size", "64", "--width", "0.0625", "--hidden-dim",
            "32", "--output-dim", "16", "--linear-epochs", "0", "--knn-every", "0",
            "--threads", "1", "--num-workers", "2", "--no-progress", "--output-dir", str(out)]
    proc = subprocess.Popen(argv, env=env_with_src(OMP_NUM_THREADS="1"), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    try:  # one epoch done: the (persistent) workers are alive in the second
        while not list(out.glob("checkpoints/**/last.ckpt")):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "no epoch finished in 240 s"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 143, err
    assert err.strip().splitlines() == [
        f"adaptcl images: terminated (SIGTERM); finished runs are kept under {out}/runs: rerun "
        "the same command to resume"]
