"""``torchrun --nproc-per-node 2 -m adaptcl simcse``: two gloo processes train one model together,
the loss gathers every rank's in-batch negatives, and rank 0 alone writes the result.

That the gathered loss equals the single-process loss of the whole batch is
tests/adapters/sentence_transformers/test_distributed.py's job; here the recipe must switch the
gathering on, split the data between the ranks and write once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sentence_transformers")

REPO = Path(__file__).resolve().parents[3]


def _torchrun_simcse(model, shared_data, out, cwd, device="cpu"):
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--standalone", "-m", "adaptcl", "simcse", "--model", str(model),
         "--losses", "macl", "--data-root", str(shared_data), "--max-sentences", "32",
         "--batch-size", "4", "--max-seq-length", "16", "--logging-steps", "1",
         "--eval-steps", "4", "--no-sts", "--no-baseline", "--no-progress", "--device", device,
         "--output-dir", str(out)],
        capture_output=True, text=True, timeout=600, cwd=cwd,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}",
             "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})


@pytest.mark.slow
def test_two_processes_train_gather_and_write_one_result(shared_data, tmp_path):
    from tests.adapters._tiny_models import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", "bert")
    out = tmp_path / "out"
    done = _torchrun_simcse(model, shared_data, out, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("results: ") == 1  # rank 0 alone reports
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert run["processes"] == 2
    assert run["loss_config"]["gather_across_devices"] is True
    assert run["optimisation_steps"] == 32 // (4 * 2)  # each rank a batch of 4 per step
    assert (out / "models" / "wiki" / "macl" / "seed42" / "final" / "modules.json").is_file()
    assert len(list((out / "runs").rglob("seed42.json"))) == 1

    # killed after training, before its record was stored: both ranks resume from the
    # checkpoint rank 0 found (one rank training on alone would wait for the other forever)
    (out / "runs" / "wiki" / "macl" / "seed42.json").unlink()
    again = _torchrun_simcse(model, shared_data, out, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    checkpoint = out / "models" / "wiki" / "macl" / "seed42" / "checkpoints" / "checkpoint-4"
    assert again.stderr.count(f"adaptcl: wiki/macl/seed42 resumes from {checkpoint}\n") == 1
    (rerun,) = json.loads((out / "results.json").read_text())["runs"]
    assert rerun["metrics"] == run["metrics"] and rerun["optimisation_steps"] == 4


@pytest.mark.slow
def test_device_auto_on_a_cpu_machine_trains_as_two_processes(shared_data, tmp_path):
    """``--device auto`` is the device it resolves to, under torchrun too: on a machine without
    a GPU, transformers was not told ``use_cpu``, trained one process on every sentence (rank 1
    died in ``_determine_best_metric``) and rank 0 stored it as ``processes: 2``."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("auto resolves to the CPU only on a machine without CUDA")
    from tests.adapters._tiny_models import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", "bert")
    out = tmp_path / "out"
    done = _torchrun_simcse(model, shared_data, out, tmp_path, device="auto")
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert run["processes"] == 2 and run["optimisation_steps"] == 32 // (4 * 2)
