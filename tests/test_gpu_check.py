"""``tools/gpu_check.py`` (``make gpu-check``) on CPU: the whole check end to end at toy size,
a part over its time limit recorded as timed out while the others run, and the full-size GPU
commands accepted by the recipes (``--print-config``: parsed, not run).

Nothing here measures a GPU; the CPU path runs the same machinery (process groups, limits,
parsers, the report) that a CUDA machine runs at full size.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "tools" / "gpu_check.py"
RECIPE_PARTS = ("tu", "images", "moleculenet", "simcse", "clip")

pytest.importorskip("lightly", reason="the benchmark compares against Lightly (extra 'vision')")


@pytest.fixture
def gpu_check(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT / "tools"))
    return importlib.import_module("gpu_check")


def _check(out: Path, data: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # over the GPU run's budget of 9 minutes: a busy CI machine gets more; each part keeps its own
    return subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--out",
                           str(out), "--data-root", str(data), "--budget", "900", *args],
                          capture_output=True, text=True, timeout=1200, cwd=REPO_ROOT,
                          check=False, env=env)


def _parts(out: Path) -> dict[str, dict]:
    report = json.loads((out / "report.json").read_text())
    return {p["name"]: p for p in report["parts"]}


@pytest.mark.slow
def test_cpu_run_end_to_end_a_part_over_its_limit_timed_out_the_others_reported(tmp_path,
                                                                              shared_data):
    out = tmp_path / "check"
    proc = _check(out, shared_data, "--skip", "simcse", "--limit", "bench-quick=0.5")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a part timed out
    report = json.loads((out / "report.json").read_text())
    env = report["environment"]
    assert env["device"] == "cpu" and env["torch"] and len(env["commit"] or "x" * 40) == 40
    assert set(env) >= {"gpu", "driver", "torch_cuda", "triton", "dirty"}
    parts = _parts(out)
    assert list(parts) == ["kernels", "pytest", "bench-quick", "bench-tiled", "gradcache",
                           *RECIPE_PARTS]
    quick = parts["bench-quick"]
    assert (quick["status"], quick["exit_status"], quick["limit_s"]) == ("timed out", None, 0.5)
    assert quick["wall_s"] < 15 and "still running after its limit" in quick["reason"]
    assert quick["results"] == {"missing": "no bench_gpu.json"}
    for name in ("kernels", "pytest", "bench-tiled", "gradcache", "tu", "images", "moleculenet",
                 "clip"):  # ran after all
        part = parts[name]
        assert (part["status"], part["exit_status"]) == ("ok", 0), part
        assert 0 < part["wall_s"] <= part["limit_s"] and part["command"]
    assert parts["simcse"]["status"] == "skipped"
    assert parts["simcse"]["reason"] == "left out with --skip"
    # the numbers, read from each part's own output
    tests = parts["pytest"]["results"]["counts"]
    assert tests["passed"] > 0 and tests["failed"] == tests["errors"] == 0
    tiled = parts["bench-tiled"]["results"]["rows"]
    assert {r["batch"] for r in tiled} == {64, 128}
    assert {r["loss"] for r in tiled} == {"adaptcl MACL tiled", "adaptcl InfoNCE cross-view tiled"}
    assert all(r["status"] == "ok" and r["time_ms"] > 0 for r in tiled)
    cached = [r for r in parts["gradcache"]["results"]["rows"] if "cached, mini" in r["loss"]]
    assert [(r["loss"], r["batch"], r["status"]) for r in cached] == [
        ("images: cached, mini-batch 8", 32, "ok"), ("clip: cached, mini-batch 8", 16, "ok")]
    assert all(r["time_vs_peer"] > 0 for r in cached)  # time per sample vs the uncached step
    for name, metric, methods in (("tu", "accuracy", {"dcl", "macl"}),
                                  ("images", "knn_top1", {"infonce", "macl"}),
                                  ("moleculenet", "test_roc_last", {"none", "macl"}),
                                  ("clip", "zero_shot_top1", {"infonce", "macl"})):
        means = [m for m in parts[name]["results"]["means"] if m["metric"] == metric]
        assert {m["method"] for m in means} == methods, means
        assert all(0 <= m["value"] <= 100 for m in means)
    epochs = parts["images"]["results"]["epoch_seconds"]
    assert len(epochs) == 2 and all(e["seconds"] > 0 for e in epochs)
    # one markdown report saying what ran
    md = (out / "report.md").read_text()
    assert md.startswith("# GPU check: cpu")
    assert "no CUDA: the device tests' CPU cases ran" in md
    for name, part in parts.items():
        assert f"## {name}:" in md and part["command"] in md
    assert "| bench-quick | timed out | - |" in md and "No numbers: no bench_gpu.json." in md
    assert "| adaptcl MACL tiled | bf16 | 8 | 128 |" in md
    assert "| accuracy | MUTAG | macl |" in md and "time per epoch, cifar10/macl/0" in md
    assert "**skipped**: left out with --skip" in md
    targets = {r["case"]: r for r in parts["kernels"]["results"]["targets"]}
    assert all(r["status"] in ("ok", "unavailable") for r in targets.values()), targets
    assert targets["cross-view InfoNCE, 65,536 x 128, bf16"]["target"] == "<= 9 ms"
    assert "| cross-view InfoNCE, 65,536 x 128, bf16 | 256 x 8 | torch |" in md
    assert (out / "parts.log").read_text().count("===== ") == 18  # a header and a footer per run


def test_a_timed_out_part_loses_its_whole_process_group(gpu_check, tmp_path):
    from gpu_check_run import Part, run_part

    child = ("import subprocess, sys, time; "
             "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
             "print('grandchild', p.pid, flush=True); time.sleep(60)")
    slow = Part("slow", "sleeps", [sys.executable, "-c", child], 2.0, "recipe", tmp_path)
    fast = Part("fast", "prints", [sys.executable, "-c", "print('done')"], 30.0, "recipe", tmp_path)
    log = tmp_path / "parts.log"
    records = [run_part(p, log=log, env=dict(os.environ), cwd=tmp_path, budget_left_s=60.0)
               for p in (slow, fast)]
    assert [r["status"] for r in records] == ["timed out", "ok"]
    pid = int(log.read_text().split("grandchild ")[1].split()[0])
    time.sleep(0.2)
    state = Path(f"/proc/{pid}/stat")
    assert not state.exists() or state.read_text().split(") ")[1][0] in "ZX"  # gone or a zombie
    assert "done" in records[1]["log_tail"]


def test_the_budget_caps_a_part_and_skips_the_rest(gpu_check, tmp_path):
    from gpu_check_run import Part, run_part

    part = Part("p", "t", [sys.executable, "-c", "import time; time.sleep(30)"], 60.0, "recipe",
                tmp_path)
    log = tmp_path / "parts.log"
    capped = run_part(part, log=log, env=dict(os.environ), cwd=tmp_path, budget_left_s=1.0)
    assert capped["status"] == "timed out" and capped["limit_s"] == 1.0
    spent = run_part(part, log=log, env=dict(os.environ), cwd=tmp_path, budget_left_s=0.5)
    assert spent["status"] == "skipped" and "total budget" in spent["reason"]


def test_full_size_gpu_commands_are_accepted_by_the_recipes_and_the_benchmark(
        gpu_check, tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_gpu",
                                                  REPO_ROOT / "benchmarks" / "bench_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_gpu", bench)  # its dataclasses look themselves up
    spec.loader.exec_module(bench)
    args = gpu_check.parse_args(["--device", "cuda", "--data-root", str(tmp_path)])
    parts = {p.name: p for p in gpu_check.plan(args, tmp_path)}
    assert list(parts)[0] == "kernels" and "--targets" in parts["kernels"].argv  # first
    assert parts["pytest"].argv[3:6] == ["-m", "gpu", "tests"]
    assert "--quick" in parts["bench-quick"].argv
    tiled = parts["bench-tiled"].argv
    assert tiled[tiled.index("--batches") + 1:][:2] == ["65536", "262144"] and "--tiled-only" in tiled
    cached = parts["gradcache"].argv  # the bench's defaults: the batches
    assert cached[1].endswith("bench_gradcache.py") and "--images-batch" not in cached
    images = parts["images"].argv
    for option, value in (("--device", "cuda"), ("--precision", "bf16-mixed"), ("--epochs", "2"),
                          ("--width", "1.0")):
        assert images[images.index(option) + 1] == value
    tiny = gpu_check.plan(gpu_check.parse_args(["--device", "cpu", "--tiny", "--data-root",
                                                str(tmp_path)]), tmp_path)
    spec = importlib.util.spec_from_file_location(
        "bench_gradcache", REPO_ROOT / "benchmarks" / "bench_gradcache.py")
    gradcache = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gradcache)
    for part in [*parts.values(), *tiny]:
        if part.name.startswith("bench") or part.name == "kernels":
            bench.parse_args(part.argv[2:])  # exits 2 on an option it does not have
        if part.name == "gradcache":
            gradcache.parse_args(part.argv[2:])
    commands = [p.argv[3:] + ["--print-config"] for p in [*parts.values(), *tiny]
                if p.name in RECIPE_PARTS]
    code = ("import contextlib, io, json, sys\nfrom adaptcl.cli import main\n"
            "for argv in json.loads(sys.argv[1]):\n"
            "    with contextlib.redirect_stdout(io.StringIO()):\n"
            "        print(argv[0], main(argv), file=sys.stderr)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(commands)], capture_output=True,
                          text=True, timeout=300, cwd=REPO_ROOT, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    assert [line.split() for line in proc.stderr.splitlines() if line.endswith((" 0", " 2"))] == [
        [argv[0], "0"] for argv in commands]


def test_bad_arguments_are_one_line_errors(gpu_check, tmp_path, capsys):
    for argv, named in ((["--device", "tpu"], "--device"), (["--budget", "0"], "--budget"),
                        (["--limit", "nope=3"], "--limit"), (["--limit", "tu=-1"], "--limit"),
                        (["--data-root", str(tmp_path / "absent")], "--data-root")):
        with pytest.raises(SystemExit) as exit_info:
            gpu_check.parse_args(["--data-root", str(tmp_path), *argv])
        assert exit_info.value.code == 2
        assert named in capsys.readouterr().err.splitlines()[-1]


def test_a_python_without_torch_is_one_line_pointing_to_make_setup(tmp_path):
    """``make gpu-check`` in a fresh clone runs the system Python (no venv yet), which has no
    torch: one line saying to run ``make setup``, before any part or file. ``-S``: this Python
    without its site-packages, so without torch."""
    proc = subprocess.run([sys.executable, "-S", str(SCRIPT), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, check=False)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "has no torch: run `make setup`" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_checks_time_is_said_the_same_everywhere_and_as_its_budget(gpu_check, tmp_path):
    """Wherever the check's time is said, it is the same and true: at most its ``--budget`` on
    CUDA, a few minutes (not seconds) for the CPU path, whose parts each import torch."""
    import re

    minutes = gpu_check.parse_args(["--data-root", str(tmp_path)]).budget / 60
    for name in ("README.md", "Makefile", "docs/install.md", "docs/gpu.md",
                 "tools/gpu_check.py"):
        text = " ".join((REPO_ROOT / name).read_text().split())  # one line: wrapped text
        said = re.findall(r"at most (?:the ``--budget`` of )?(\d+) minutes", text)
        assert said and {float(m) for m in said} == {minutes}, (name, said)
        assert not re.search(r"in seconds|about \d+ minutes", text), name


def test_the_gpu_runs_are_told_in_one_section_in_date_order():
    """docs/gpu.md tells its GPU runs once, in date order: each run's heading names its commit,
    each commit older than the next (where this clone has them)."""
    import re

    text = (REPO_ROOT / "docs" / "gpu.md").read_text()
    assert text.count("## Measured on GPUs") == 1
    commits = re.findall(r"^### .*\(([0-9a-f]{7,40})\)$", text.split("## Measured on GPUs")[1],
                         flags=re.M)
    assert len(commits) >= 2, commits
    for older, newer in zip(commits[:-1], commits[1:], strict=True):
        done = subprocess.run(["git", "merge-base", "--is-ancestor", older, newer],
                              cwd=REPO_ROOT, capture_output=True, check=False)
        if done.returncode not in (0, 1):
            pytest.skip(f"this clone lacks {older} or {newer} (a shallow clone)")
        assert done.returncode == 0, f"{older} is not older than {newer}"


def test_failed_tests_are_named_with_their_message(gpu_check, tmp_path):
    from gpu_check_report import parse_pytest, render

    (tmp_path / "test_sample.py").write_text(
        "import pytest\n\ndef test_passes():\n    pass\n\n"
        "@pytest.mark.parametrize('device', ['cuda'])\ndef test_fails(device):\n"
        "    raise RuntimeError('index is on cpu, different from other tensors on cuda:0')\n")
    junit = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
                    str(tmp_path), "--junitxml", str(junit), str(tmp_path / "test_sample.py")],
                   capture_output=True, timeout=120, cwd=tmp_path, check=False)
    results = parse_pytest(junit, {})
    assert results["counts"] == {"passed": 1, "failed": 1, "errors": 0, "skipped": 0}
    assert results["failures"] == [{"test": "test_sample.py::test_fails[cuda]", "message":
                                    "RuntimeError: index is on cpu, different from other "
                                    "tensors on cuda:0"}]
    part = {"name": "pytest", "title": "tests", "command": "pytest -m gpu tests",
            "status": "failed", "reason": "exit status 1", "exit_status": 1, "wall_s": 3.0,
            "limit_s": 120, "results": results, "log_tail": "1 failed, 1 passed"}
    md = render({"environment": {"gpu": "NVIDIA H100"}, "argv": [], "device": "cuda",
                 "size": "full", "started": "now", "wall_s": 3.0, "budget_s": 480.0,
                 "data_root": "d", "parts": [part]})
    assert "- `test_sample.py::test_fails[cuda]`: RuntimeError: index is on cpu" in md
    assert "Tests: 1 passed, 1 failed, 0 errors, 0 skipped in" in md
    assert "End of its output:" in md and "1 failed, 1 passed" in md
