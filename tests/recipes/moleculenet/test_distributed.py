"""``moleculenet --devices 2 --strategy ddp`` on CPU: two gloo processes pre-train, rank 0
alone fine-tunes and writes."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_geometric")
pytest.importorskip("pytorch_lightning")
pytest.importorskip("ogb")


@pytest.mark.slow
def test_pretraining_on_two_gloo_processes_then_fine_tuning_on_rank_0(shared_data, tmp_path):
    """Lightning relaunches the command for rank 1; both ranks pre-train with the loss
    gathering across them, rank 0 alone fine-tunes and writes."""
    out = tmp_path / "out"
    src = Path(__file__).resolve().parents[3] / "src"
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
               PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    env.pop("LOCAL_RANK", None)
    command = [sys.executable, "-m", "adaptcl", "moleculenet", "--devices", "2", "--strategy",
               "ddp", "--device", "cpu", "--datasets", "bbbp", "--seeds", "0", "--inits", "macl",
               "--pretrain-molecules", "64", "--pretrain-epochs", "2", "--pretrain-batch-size",
               "16", "--finetune-epochs", "1", "--max-molecules", "200", "--emb-dim", "16",
               "--num-layers", "2", "--no-progress", "--no-plot", "--logger", "csv",
               "--output-dir", str(out), "--data-root", str(shared_data)]
    proc = subprocess.run(command, env=env, cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    said = proc.stdout + proc.stderr
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in said and "GLOBAL_RANK: 1, MEMBER: 2/2" in said
    # rank 1 runs as a child of rank 0: its failure after training would not change the exit code
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (encoder,) = (out / "pretrain").glob("macl-*.pt")
    checkpoint = torch.load(encoder, weights_only=True)
    assert (checkpoint["devices"], checkpoint["strategy"]) == (2, "ddp")
    assert "gather_distributed=True" in checkpoint["loss_module"]
    # 64 molecules / 2 ranks / 8 per rank: 4 steps an epoch, the loss on the gathered 16
    assert checkpoint["steps"] == 8 and len(checkpoint["step_stats"]["temperature"]) == 8
    assert len(checkpoint["epoch_loss"]) == 2 and all(map(math.isfinite, checkpoint["epoch_loss"]))
    assert not list((out / "pretrain").glob("*.lightning"))  # Lightning's checkpoints removed
    # Lightning's CSV logger, written by rank 0 alone: every step's loss of the pre-training
    (metrics,) = (out / "logs" / encoder.stem).rglob("metrics.csv")
    header, *rows = metrics.read_text().splitlines()
    column = header.split(",").index("train_loss")
    assert sum(1 for row in rows if row.split(",")[column]) == 8
    assert (out / "runs" / "bbbp" / "macl" / "seed0.json").is_file()
    assert "| BBBP |" in proc.stdout and proc.stdout.count("results: ") == 1  # rank 0 only
