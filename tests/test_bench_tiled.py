"""Smoke test of ``benchmarks/bench_tiled.py``: tiled vs materialised MACL in fresh processes.

``--smoke`` (a batch of 256 against one materialised matrix, a 2,048 batch on the tiled path
alone) in a subprocess, as a user runs it. It checks what the docs quote from this script: the
two paths give the same loss, the tiled step keeps less memory alive than the materialised one,
and the JSON says which machine and code produced the numbers. Times at this size are noise.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "benchmarks" / "bench_tiled.py"


@pytest.mark.slow
def test_bench_tiled_smoke_reports_equal_losses_less_memory_and_its_environment(tmp_path):
    out = tmp_path / "nested" / "tiled.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--threads", "1", "--json",
                           str(out)], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())

    (row,) = result["comparison"]
    assert (row["batch"], row["tile"]) == (256, 128)
    assert row["loss_difference"] < 1e-4
    assert 0 < row["tiled_peak"] < row["materialised_peak"]
    assert result["huge"]["materialised_bytes_one_copy"] == (2 * 2048) ** 2 * 4
    assert result["huge"]["loss"] > 0

    env = result["environment"]
    assert env["adaptcl"] and env["torch"] and env["python"] and env["device"] == "cpu"
    assert "git_commit" in env and "timestamp" in env and env["cpu_count"] >= 1
    assert "time ratio = tiled / materialised" in proc.stdout
