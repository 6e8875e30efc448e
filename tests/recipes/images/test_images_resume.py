"""The images recipe survives being killed: rerunning it resumes from ``last.ckpt``.

Each test starts the recipe in a subprocess on a tiny configuration, SIGKILLs it as soon as a
checkpoint of the run under test exists, checks that the result files hold only the finished
runs (marked partial), reruns the recipe in-process to completion and checks that the rerun
resumed (not restarted) the interrupted run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightly")
pytest.importorskip("pytorch_lightning")

from adaptcl.recipes.images import train  # noqa: E402
from adaptcl.recipes.images.config import ImagesConfig  # noqa: E402
from adaptcl.recipes.images.recipe import ImagesRecipe  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[3]

TINY = dict(train_limit=256, test_limit=100, epochs=3, batch_size=64, width=0.0625,
            hidden_dim=32, output_dim=16, queue_size=128, linear_epochs=2, knn_every=1,
            progress=False, device="cpu", threads=1, num_workers=0)


def _config(shared_data, out_dir: Path, **kwargs) -> ImagesConfig:
    return ImagesConfig(data_root=str(shared_data), output_dir=str(out_dir), **TINY, **kwargs)


def _run_until_checkpoint(config: ImagesConfig, cell_dir: Path, timeout: float = 240.0) -> Path:
    """Start the recipe in a subprocess, SIGKILL it once a ``last.ckpt`` exists under
    ``cell_dir`` (``checkpoints/<data>/<loss>/seed0``); return that checkpoint's folder."""
    fields = dataclasses.asdict(config)
    script = textwrap.dedent(f"""
        from adaptcl.recipes.images.config import ImagesConfig
        from adaptcl.recipes.images.recipe import ImagesRecipe
        ImagesRecipe(ImagesConfig(**{fields!r})).run()
    """)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO_ROOT / "src"))
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=str(REPO_ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    try:
        while not (found := list(cell_dir.glob("*/last.ckpt"))):
            if proc.poll() is not None:
                out = proc.stdout.read().decode(errors="replace")
                pytest.fail(f"the recipe exited ({proc.returncode}) before last.ckpt:\n{out}")
            if time.monotonic() > deadline:
                pytest.fail(f"no last.ckpt under {cell_dir} after {timeout:.0f}s")
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    return found[0].parent


def _load_ckpt(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def _assert_resumed(run: dict, ckpt: dict, epochs: int, steps_per_epoch: int) -> None:
    resumed = run["resumed_from"]
    assert resumed is not None, "the rerun trained from scratch instead of resuming"
    assert resumed["checkpoint_epoch"] == ckpt["epoch"]
    assert resumed["checkpoint_global_step"] == ckpt["global_step"]
    # training restarted at the epoch after the checkpoint, with the checkpoint's step count
    assert resumed["start_global_step"] == ckpt["global_step"]
    assert resumed["start_epoch"] == ckpt["global_step"] // steps_per_epoch
    # killed after the first checkpoint (normally during epoch 2; a starved poller could in
    # principle see the last epoch's checkpoint, then the rerun only evaluates)
    assert 1 <= resumed["start_epoch"] <= epochs
    # history: the checkpoint's steps plus only the steps after it, each exactly once
    assert [int(h["step"]) for h in run["history"]] == list(range(epochs * steps_per_epoch))
    saved = ckpt["adaptcl_history"]["history"]
    assert run["history"][:len(saved)] == saved
    assert {int(h["epoch"]) for h in run["history"][len(saved):]} == set(
        range(resumed["start_epoch"], epochs))
    assert [int(h["epoch"]) for h in run["online_knn"]] == list(range(epochs))


@pytest.mark.slow
def test_killed_simclr_run_resumes_and_skips_finished_runs(shared_data, tmp_path, monkeypatch):
    config = _config(shared_data, tmp_path, losses=["infonce", "macl"])
    runs = tmp_path / "runs" / "cifar10"
    final = tmp_path / "results.json"

    # kill during the second loss: the first (loss, seed) is finished and persisted, and the
    # result files (rewritten after every finished run) are marked partial
    open_dir = _run_until_checkpoint(config, tmp_path / "checkpoints" / "cifar10" / "macl" / "seed0")
    partial = json.loads(final.read_text())
    macl_cell = {"dataset": "cifar10", "loss": "macl", "seed": 0}
    assert partial["partial"] and partial["missing"] == [macl_cell]
    assert (tmp_path / "results.md").read_text().startswith("> **PARTIAL**")
    assert (runs / "infonce" / "seed0.json").is_file() and not (runs / "macl" / "seed0.json").exists()
    done_record = json.loads((runs / "infonce" / "seed0.json").read_text())["record"]
    ckpt = _load_ckpt(open_dir / "last.ckpt")

    fitted = []
    original = train.lightning_trainer

    def counting_trainer(*args, **kwargs):
        trainer = original(*args, **kwargs)
        fitted.append(kwargs.get("ckpt_dir"))
        return trainer

    monkeypatch.setattr(train, "lightning_trainer", counting_trainer)
    result = ImagesRecipe(config).run()

    assert fitted == [open_dir]  # the finished run was skipped, not retrained
    saved = json.loads(final.read_text())
    assert [r["cell"]["loss"] for r in saved["runs"]] == ["infonce", "macl"]
    infonce, macl = saved["runs"]
    assert saved["reused"] == [{"dataset": "cifar10", "loss": "infonce", "seed": 0}]
    assert saved["computed"] == [macl_cell]
    assert infonce["train_seconds"] == done_record["train_seconds"]
    assert infonce["metrics"] == done_record["metrics"]
    _assert_resumed(macl, ckpt, epochs=3, steps_per_epoch=256 // 64)
    # training time adds up over the killed and the resumed invocation
    before_kill = ckpt["callbacks"][next(k for k in ckpt["callbacks"] if "TrainingClock" in k)]
    assert macl["train_seconds"] > sum(before_kill["epoch_seconds"]) > 0
    assert saved["total_train_seconds"] == pytest.approx(infonce["train_seconds"]
                                                         + macl["train_seconds"])
    for run in saved["runs"]:
        assert 0.0 <= run["metrics"]["knn_top1"] <= 1.0
        assert 0.0 <= run["metrics"]["linear_top1"] <= 1.0
        assert run["optimisation_steps"] == 3 * (256 // 64)
    assert all(h["temperature"] > 0 for h in macl["history"])
    assert result["runs"][1]["resumed_from"] == macl["resumed_from"]
    table = (tmp_path / "results.md").read_text()
    assert "infonce" in table and "macl − infonce" in table
    assert (tmp_path / "images_temperature.png").stat().st_size > 0


@pytest.mark.slow
def test_killed_ascl_moco_run_resumes_with_its_queue(shared_data, tmp_path, monkeypatch):
    config = _config(shared_data, tmp_path, method="ascl-moco", losses=["ascl"])
    run_dir = _run_until_checkpoint(config, tmp_path / "checkpoints" / "cifar10" / "ascl" / "seed0")
    assert not (tmp_path / "results.json").exists()
    ckpt = _load_ckpt(run_dir / "last.ckpt")
    saved_queue = ckpt["state_dict"]["model.criterion.memory_bank.bank"]
    saved_ptr = ckpt["state_dict"]["model.criterion.memory_bank.bank_ptr"]

    import pytorch_lightning as pl

    seen = {}

    class QueueAtStart(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            seen["queue"] = pl_module.model.queue.detach().clone()
            seen["ptr"] = pl_module.model.criterion.memory_bank.bank_ptr.detach().clone()

    original = train.lightning_trainer

    def trainer_with_probe(*args, **kwargs):
        trainer = original(*args, **kwargs)
        trainer.callbacks.append(QueueAtStart())
        return trainer

    monkeypatch.setattr(train, "lightning_trainer", trainer_with_probe)
    ImagesRecipe(config).run()

    # training resumed with the checkpoint's queue (and pointer), which held the keys of the
    # steps before the kill
    assert torch.equal(seen["queue"], saved_queue) and torch.equal(seen["ptr"], saved_ptr)
    assert int(saved_ptr) == (ckpt["global_step"] * 64) % 128
    saved = json.loads((tmp_path / "results.json").read_text())
    (run,) = saved["runs"]
    _assert_resumed(run, ckpt, epochs=3, steps_per_epoch=256 // 64)
    assert 0.0 <= run["metrics"]["knn_top1"] <= 1.0
    assert all(0.0 <= h["confidence"] <= 1.0 for h in run["history"])
