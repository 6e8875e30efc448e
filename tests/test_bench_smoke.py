"""Smoke test of ``benchmarks/bench_losses.py``: the script runs end to end and reports ratios.

Runs ``--smoke`` (batch 32, one round, one memory worker) in a subprocess, as ``make bench``
would, and checks the printed table, the summary of ratios and the JSON file. It says nothing
about the speed itself: one round at batch 32 is noise.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "benchmarks" / "bench_losses.py"
NAMES = ("adaptcl InfoNCELoss", "adaptcl MACLLoss", "lightly NTXentLoss", "lightly DCLLoss",
         "lightly MACLLoss")

pytest.importorskip("lightly", reason="the benchmark compares against Lightly (extra 'vision')")


@pytest.mark.slow
def test_bench_smoke_prints_ratios_and_summary(tmp_path: Path) -> None:
    out_json = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--threads", "1", "--json", str(out_json)],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout

    # One table row per candidate, each with a time and four ratio cells ("1.23x" or "-").
    for name in NAMES:
        row = next((line for line in text.splitlines() if line.startswith(f"| {name} |")), None)
        assert row is not None, f"no table row for {name}:\n{text}"
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1]) > 0  # time ms
        assert all(re.fullmatch(r"\d+\.\d\dx|-", c) for c in cells[3:]), row
    # Lightly's NTXentLoss against itself, measured in the same round, is exactly 1.
    ref_row = next(line for line in text.splitlines() if line.startswith("| lightly NTXentLoss |"))
    assert "| 1.00x |" in ref_row

    # The headline ratios as measurements, with no verdicts.
    summary = re.findall(r"^(our .+?): (\d+\.\d\dx|below .+)$", text, re.MULTILINE)
    assert [s[0] for s in summary] == [
        "our NT-Xent time / Lightly NTXentLoss time",
        "our MACL time / Lightly NTXentLoss time",
        "our MACL time / Lightly MACLLoss time",
        "our MACL peak memory / Lightly MACLLoss peak memory",
        "our MACL time / our NT-Xent time",
    ]
    assert not re.search(r"\b(PASS|FAIL)\b", text)

    # The JSON holds the same numbers.
    result = json.loads(out_json.read_text())
    rows = result["batches"]["32"]
    assert set(rows) == set(NAMES)
    assert rows["lightly NTXentLoss"]["time_vs_lightly_ntxent"] == pytest.approx(1.0)
    assert rows["lightly MACLLoss"]["time_vs_lightly_macl"] == pytest.approx(1.0)
    for row in rows.values():
        assert row["time_median_s"] > 0 and row["peak_bytes"] >= 0
    assert [row["ratio_of"] for row in result["summary"]] == [s[0] for s in summary]
    # ... and says what produced them (the recipes' environment record)
    env = result["environment"]
    assert env["adaptcl"] and env["torch"] and "git_commit" in env and "cpu" in env
