"""Smoke test of ``benchmarks/bench_gpu.py`` on CPU: its case machinery, tables and JSON.

The timing and memory functions are device-generic (CUDA events and allocator statistics on a
GPU, ``perf_counter`` and no memory on CPU), so the cases run here through the same code path
as on a GPU, at sizes that take seconds. Nothing here says anything about speed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "benchmarks" / "bench_gpu.py"

pytest.importorskip("lightly", reason="the benchmark compares against Lightly (extra 'vision')")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = module
    spec.loader.exec_module(module)
    return module


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO_ROOT, check=False, env=env)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_says_so_and_exits_cleanly(tmp_path):
    out = tmp_path / "bench.json"
    proc = _run("--quick", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "CUDA is not available" in proc.stdout
    assert not out.exists()


def test_every_loss_runs_in_both_dtypes_with_ratios_to_its_peer(bench):
    cpu = torch.device("cpu")
    candidates = bench.available_candidates()
    records = bench.run_losses(candidates, cpu, [16], [8], ["fp32", "bf16"], tile_size=8,
                               warmup=0, repeats=1, case_budget=60.0, log=lambda _line: None)
    assert len(records) == len(candidates) * 2
    names = {c.name for c in candidates}
    assert {bench.OURS_MACL, bench.OURS_TILED_MACL, bench.LIGHTLY_NTXENT, bench.ST_MNRL} <= names
    for r in records:
        assert r["status"] == "ok", r
        assert r["time_s"] > 0 and r["peak_bytes"] is None  # no allocator statistics on CPU
        assert r["time_vs_lightly_ntxent"] == pytest.approx(r["time_s"] / next(
            x["time_s"] for x in records if x["loss"] == bench.LIGHTLY_NTXENT
            and (x["dtype"], x["dim"], x["batch"]) == (r["dtype"], r["dim"], r["batch"])))
        peer_present = r["peer"] in names
        assert (r["time_vs_peer"] is not None) == peer_present, r
    table = bench.render_losses(records, repeats=1)
    assert table.count("### ") == 2  # one table per (dtype, dim, batch)
    assert f"| {bench.OURS_MACL} |" in table and "| lightly MACLLoss |" in table


def test_tiled_only_batches_skip_materialised_losses(bench, monkeypatch):
    monkeypatch.setattr(bench, "MATERIALISED_MAX_BATCH", 16)
    candidates = bench.available_candidates()
    records = bench.run_losses(candidates, torch.device("cpu"), [24], [8], ["fp32"], tile_size=8,
                               warmup=0, repeats=1, case_budget=60.0, log=lambda _line: None)
    assert records and all(r["tiled"] for r in records)
    assert {r["loss"] for r in records} >= {bench.OURS_TILED_MACL, bench.OURS_TILED_CROSS}


def test_out_of_memory_is_recorded_and_larger_batches_are_skipped(bench):
    def make(_tile_size):
        def loss_fn(z0, z1):
            if z0.shape[0] >= 32:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
            return (z0 * z1).sum()
        return loss_fn

    greedy = bench.Candidate("greedy", make)
    records = bench.run_losses([greedy], torch.device("cpu"), [16, 32, 64], [4], ["fp32"],
                               tile_size=8, warmup=1, repeats=2, case_budget=60.0,
                               log=lambda _line: None)
    assert [r["status"] for r in records] == ["ok", "oom", "skipped"]
    assert "64.00 GiB" in records[1]["error"]
    assert records[2]["error"] == "out of memory at batch 32"
    assert len(records[0]["times_s"]) == 2


def test_other_errors_are_recorded_with_their_message_and_fail_the_exit_code(bench):
    def broken(_tile_size):
        def loss_fn(z0, z1):
            raise ValueError("a real bug")
        return loss_fn

    records = bench.run_losses([bench.Candidate("broken", broken)], torch.device("cpu"), [8, 16],
                               [4], ["fp32"], tile_size=8, warmup=0, repeats=1,
                               case_budget=60.0, log=lambda _line: None)
    assert [r["status"] for r in records] == ["error", "error"]
    assert records[0]["error"] == "ValueError: a real bug"


def test_cifar_resnet18_is_the_32x32_variant(bench):
    backbone, features = bench.cifar_resnet18()
    assert features == 512
    assert backbone.conv1.kernel_size == (3, 3) and backbone.conv1.stride == (1, 1)
    assert isinstance(backbone.maxpool, torch.nn.Identity)
    assert backbone.eval()(torch.randn(1, 3, 32, 32)).shape == (1, 512)


def test_simclr_step_compares_macl_with_lightly(bench):
    def tiny_backbone():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=4), torch.nn.Flatten()), 256

    records = bench.run_simclr_step(torch.device("cpu"), 4, "bf16", warmup=1, repeats=1,
                                    case_budget=60.0, log=lambda _line: None,
                                    backbone_factory=tiny_backbone)
    assert [r["loss"] for r in records] == list(bench.STEP_LOSSES)
    assert all(r["status"] == "ok" and r["time_s"] > 0 for r in records)
    lightly = next(r for r in records if r["loss"] == bench.LIGHTLY_NTXENT)
    assert lightly["time_vs_lightly_ntxent"] == 1.0
    assert "| adaptcl MACLLoss (Lightly adapter) |" in bench.render_step(records)


@pytest.mark.slow
def test_cli_on_cpu_writes_the_tables_and_the_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = _run("--device", "cpu", "--batches", "16", "--dims", "8", "--dtypes", "fp32",
                "--repeats", "1", "--warmup", "0", "--tile-size", "8", "--step-batch", "0",
                "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "### fp32, dim 8, batch 16" in proc.stdout
    assert "| adaptcl MACL | " in proc.stdout
    result = json.loads(out.read_text())
    assert result["environment"]["device"] == "cpu"
    assert result["environment"]["adaptcl"] and "git_commit" in result["environment"]
    assert {r["loss"] for r in result["losses"]} >= {"adaptcl MACL", "lightly NTXentLoss"}
    assert result["simclr_step"] == []


def test_an_error_in_any_case_makes_the_exit_code_1(bench, monkeypatch, tmp_path, capsys):
    def broken(_tile_size):
        def loss_fn(z0, z1):
            raise ValueError("a real bug")
        return loss_fn

    monkeypatch.setattr(bench, "CANDIDATES", [bench.Candidate("broken", broken)])
    out = tmp_path / "bench.json"
    code = bench.main(["--device", "cpu", "--batches", "8", "--dims", "4", "--dtypes", "fp32",
                       "--repeats", "1", "--step-batch", "0", "--out", str(out)])
    assert code == 1
    assert "ERROR in broken" in capsys.readouterr().err
    assert json.loads(out.read_text())["losses"][0]["status"] == "error"


def test_kernel_rows_join_on_cuda_with_triton_beside_the_tile_loop_and_inf_cl(bench):
    names = {c.name for c in bench.available_candidates(torch.device("cpu"))}
    assert bench.OURS_KERNEL_CROSS not in names and bench.OURS_TILED_CROSS in names
    cuda = {c.name: c for c in bench.available_candidates(torch.device("cuda"))}
    if importlib.util.find_spec("triton") is None:
        assert bench.OURS_KERNEL_CROSS not in cuda
        return
    kernel, loop = cuda[bench.OURS_KERNEL_CROSS], cuda[bench.OURS_TILED_CROSS]
    assert kernel.tiled and kernel.peer == bench.INF_CL
    assert cuda[bench.OURS_KERNEL_MACL].peer == bench.OURS_TILED_MACL
    assert kernel.make(64).backend == "triton" and loop.make(64).backend == "torch"
    assert max(bench.DEFAULT_BATCHES) == 1048576 > bench.MATERIALISED_MAX_BATCH


# ------------------------------------------------------------------------------ --targets


@pytest.fixture(scope="module")
def targets():
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import kernel_targets

    return kernel_targets


def test_the_targets_are_the_issues_rows_each_judged_against_its_reference(targets):
    table = targets.cases()
    names = [c.name for c in table]
    assert names[0] == targets.INFONCE and len(set(names)) == len(names)
    assert {c.batch for c in table} == {65536, 262144, 1048576}
    rows = {c.name: c for c in table}
    assert rows[targets.INFONCE].max_ms == 9.0
    assert rows["cross-view InfoNCE, 1,048,576, bf16"].max_ms == 2300.0
    assert rows["2N form InfoNCE, 131,072 rows, bf16"].max_ms == 40.0
    assert targets.floor_ms(65536, 128) == pytest.approx(5.56, abs=0.01)  # issue 52's floor
    assert rows["cross-view InfoNCE, 65,536 x 512, bf16"].max_ms == pytest.approx(
        1.6 * 4 * targets.floor_ms(65536, 128))
    assert rows["AMCL pair term, cross-view, 65,536, bf16"].max_ratio == 2.5
    for case in table:  # every relative target points at a row that exists and runs before it
        if case.relative_to is not None:
            assert names.index(case.relative_to) < names.index(case.name)
    records = [{"case": c.name, "status": "ok", "time_s": 0.010, "backend": "triton"}
               for c in table]
    records[0]["time_s"] = 0.0085  # the InfoNCE kernel: 8.5 ms, under its 9 ms
    by_name = {r["case"]: r for r in records}
    by_name["DySTreSS cross-view, 65,536, bf16"]["time_s"] = 0.0085 * 1.4  # over 1.3x
    by_name["DCL cross-view, 65,536, bf16"]["status"] = "error"
    targets.judge(records, table)
    assert by_name[targets.INFONCE]["met"] is True
    assert by_name["DySTreSS cross-view, 65,536, bf16"]["met"] is False
    assert by_name["DySTreSS cross-view, 65,536, bf16"]["ratio"] == pytest.approx(1.4)
    assert by_name["DCL cross-view, 65,536, bf16"]["met"] is None
    assert by_name["cross-view InfoNCE, 262,144, bf16"]["met"] is True
    records[0]["passes_ms"] = {"fwd": 1.5, "dq": 3.25, "dk": 3.5}
    table_md = targets.render(records, {"gpu": "a GPU", "torch": "x"})
    assert "| DySTreSS cross-view, 65,536, bf16 |" in table_md and "| **no** |" in table_md
    assert "| fwd 1.50, dq 3.25, dk 3.50 |" in table_md


@pytest.mark.slow
def test_targets_on_cpu_run_every_case_and_the_fresh_process_first_call(tmp_path):
    out = tmp_path / "targets.json"
    proc = _run("--targets", "--device", "cpu", "--tiny", "--repeats", "1", "--budget", "120",
                "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "### Issue 47's targets on cpu" in proc.stdout
    records = json.loads(out.read_text())["targets"]
    statuses = {r["case"]: r["status"] for r in records}
    assert statuses["first call in a fresh process, empty Triton cache"] == "ok"
    assert {s for name, s in statuses.items() if "inf-cl" not in name} == {"ok"}
    assert all(r["backend"] in ("torch", "inf-cl") for r in records)  # no kernel on the CPU


def test_the_kernels_timed_apart_are_read_from_the_profilers_events(targets):
    from types import SimpleNamespace as E

    events = [E(key="row_stats_fwd", device_time_total=1500.0),
              E(key="row_stats_dq", device_time_total=3250.0),
              E(key="pair_lse_dk", device_time_total=500.0),
              E(key="aten::mm", device_time_total=9000.0)]
    assert targets.kernel_times(events) == {"fwd": 1.5, "dq": 3.25, "pair_dk": 0.5}
    assert targets.pass_times(lambda: None, torch.device("cpu")) == {}  # no device kernels


def test_a_profile_that_fails_keeps_the_rows_time(targets, monkeypatch):
    def broken(step, device):
        raise RuntimeError("CUPTI is not available")

    monkeypatch.setattr(targets, "pass_times", broken)
    record = targets.run_case(targets.cases(256)[0], torch.device("cpu"), "torch", 1)
    assert record["status"] == "ok" and record["time_s"] > 0
    assert record["passes_ms"] == {} and "CUPTI" in record["passes_error"]
