"""The accuracy table of docs/large_batches.md, measured: each product precision on each
backend against float64, within bounds derived from ``benchmarks/bench_accuracy.py``'s
measurement (the documented table), with margin.

On the CPU: the materialised path and the PyTorch tile loop here, the fused kernel under
Triton's interpreter in ``interpreted_fused.py``; on CUDA (``-m gpu``) all three, the kernel
compiled and the products on real tensor cores (cuBLAS and Triton's TF32 may truncate where the
emulation rounds to nearest: the bounds leave that room).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

#: (largest per-anchor loss error, gradient relative error) per precision, at the test's sizes:
#: 5-10x what the table measured (cross-view InfoNCE, temperature 0.1, 128 and 4,099 rows)
BOUNDS = {"ieee": (1e-5, 1e-5), "tf32": (3e-4, 2e-3), "bf16": (3e-3, 1e-2), "fp16": (3e-4, 2e-3)}


def accuracy_script():
    spec = importlib.util.spec_from_file_location("bench_accuracy",
                                                  ROOT / "benchmarks" / "bench_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_accuracy", module)
    spec.loader.exec_module(module)
    return module


def check_bounds(records: list[dict]) -> None:
    """Each record within its precision's bounds, and every rounded precision measurably less
    exact than IEEE (the rounding happened)."""
    by_key = {(r["backend"], r["precision"]): r for r in records}
    for r in records:
        loss_bound, grad_bound = BOUNDS[r["precision"]]
        assert r["loss_max_abs"] <= loss_bound, r
        assert r["grad_relative"] <= grad_bound, r
        if r["precision"] != "ieee":
            ieee = by_key[r["backend"], "ieee"]
            assert r["grad_relative"] > 10 * ieee["grad_relative"], (r, ieee)


@pytest.mark.slow
def test_materialised_and_loop_within_the_tables_bounds():
    records = accuracy_script().measure(["materialised", "loop"], 512, 64, torch.device("cpu"))
    check_bounds(records)
    # the two backends form every product through one function: equal to float32 accumulation
    by_key = {(r["backend"], r["precision"]): r for r in records}
    for precision in ("tf32", "bf16", "fp16"):
        a, b = by_key["loop", precision], by_key["materialised", precision]
        assert abs(a["grad_relative"] - b["grad_relative"]) < 0.05 * b["grad_relative"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_every_backend_within_the_tables_bounds():
    records = accuracy_script().measure(["materialised", "loop", "kernel"], 4099, 128,
                                        torch.device("cuda"))
    print(accuracy_script().render(records))
    check_bounds(records)
