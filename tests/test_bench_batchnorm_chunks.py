"""``benchmarks/bench_batchnorm_chunks.py`` (issue 54 item 3): the gradient cosine between a cached
``batch_norm="chunk"`` step and the whole-batch step, measured on real CIFAR-10 images, and the
running statistics' momentum updates per step, as docs/large_batches.md publishes them.

``--smoke`` checks the script end to end (batch 32, chunks 8 and 16, one seed, two training
steps); the figures themselves come from the command the docs quote."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.recipes._process import env_with_src

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "benchmarks" / "bench_batchnorm_chunks.py"
DOCS = REPO_ROOT / "docs" / "large_batches.md"


@pytest.mark.slow  # a small CNN on 32 CIFAR-10 images, a few steps
def test_smoke_measures_the_cosine_and_the_running_statistics_updates(shared_data, tmp_path):
    out = tmp_path / "bn.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--threads", "1", "--data-root",
         str(shared_data), "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=REPO_ROOT, env=env_with_src(),
        check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines()
            if re.match(r"\| (initialisation|after 2 steps) \|", line)]
    assert len(rows) == 6, proc.stdout  # two stages x (reference, chunks 8 and 16)
    result = json.loads(out.read_text())
    assert result["environment"]["torch"] and result["batch"] == 32
    by_size = {(r["stage"], r["mini_batch_size"]): r for r in result["summary"]}
    for stage in ("initialisation", "after 2 steps"):
        # one momentum update per chunk and view (two views), against one per view uncached
        assert by_size[(stage, 8)]["running_stat_updates"] == [2 * 32 // 8]
        assert by_size[(stage, 16)]["running_stat_updates"] == [2 * 32 // 16]
        assert by_size[(stage, None)]["running_stat_updates"] == [2]
        for size in (8, 16):
            assert -1 <= by_size[(stage, size)]["cosine_mean"] < 1 - 1e-6  # another gradient
    distances = [r["relative_distance"] for r in result["rows"] if r["mini_batch_size"]]
    assert all(d > 0 for d in distances)


def test_the_docs_publish_the_measured_cosine_and_the_updates_per_chunk():
    """The BatchNorm section says by how much ``"chunk"`` differs (a table per stage and
    chunk size, with the command that measured it) and that the running statistics take one
    momentum update per chunk."""
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("### BatchNorm"):text.index("### In Lightning and the recipes")]
    assert "python benchmarks/bench_batchnorm_chunks.py" in section
    assert "one momentum update per chunk" in section
    table = [line for line in section.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [line.split("|")[1].strip() for line in table] == ["16", "32", "64", "128"]
    assert all(re.search(r"0\.\d{3}", line) for line in table)
