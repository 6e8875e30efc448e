"""Forward+backward time and peak memory of adaptcl's losses against Lightly's, as ratios.

Purpose
-------
Project issue 2, item 5: measure our NT-Xent (``InfoNCELoss(0.1)``) and MACL
(``MACLLoss(0.1, 0.5, 0.0)``) against ``lightly.loss.NTXentLoss(0.1)``, ``DCLLoss(0.1)`` and
``MACLLoss(0.1, 0.5, 0.0)`` on the same inputs (batch 256 / 1024 / 4096, dim 128 by default),
print absolute medians and ratios measured in ONE run, then a summary of the headline ratios
at batch 4096 (or the largest batch measured). It reports measurements; it judges nothing.

Example::

    .venv/bin/python benchmarks/bench_losses.py                      # full run (make bench)
    .venv/bin/python benchmarks/bench_losses.py --batches 1024 --repeats 9 --json out.json
    .venv/bin/python benchmarks/bench_losses.py --smoke              # seconds, for the tests

Time
----
All candidates live in this process and see the same leaf inputs ``z0, z1 ~ N(0, 1)``
(``requires_grad=True``, as if they came out of a projection head). One step is
``loss_fn(z0, z1).backward()`` timed with ``time.perf_counter``. After ``--warmup`` untimed
rounds, the candidates run round-robin for ``--repeats`` rounds, the starting candidate rotating
every round so none always runs first or last. The table shows each candidate's median time;
ratios are the median over rounds of the per-round ratio (candidate / reference measured in the
same round), which cancels slow drifts of the machine's load better than a ratio of medians.

Peak memory
-----------
One method: the peak resident-set growth of a fresh subprocess per (candidate, batch). The
worker imports only what the candidate needs, allocates the inputs, runs one untimed step at
the full size (so lazily created library buffers and first-call caches are not counted), frees
it, resets the kernel's high-water mark (``echo 5 > /proc/self/clear_refs``) and runs one more
step; the reported peak is ``VmHWM - VmRSS`` read from ``/proc/self/status`` around that step,
i.e. every byte the step kept alive at its worst moment: autograd-saved tensors, temporaries,
the gradients of ``z0``/``z1`` and allocator slack. The worker runs with
``MALLOC_MMAP_THRESHOLD_=65536`` so glibc serves every tensor above 64 KiB with ``mmap`` and
returns it to the OS on free (the default threshold adapts to past frees and would let
large blocks linger on the heap), which makes the number reproducible to a few hundred KiB.
Where ``clear_refs`` is not writable the worker falls back to ``ru_maxrss`` (the lifetime
peak), taken after the warm step: still a fresh process, but the import peak may hide a
small step; the JSON records which method was used.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

OURS_NTXENT = "adaptcl InfoNCELoss"
OURS_MACL = "adaptcl MACLLoss"
LIGHTLY_NTXENT = "lightly NTXentLoss"
LIGHTLY_DCL = "lightly DCLLoss"
LIGHTLY_MACL = "lightly MACLLoss"


def _ours_ntxent() -> torch.nn.Module:
    from adaptcl.plugins import InfoNCELoss

    return InfoNCELoss(0.1)


def _ours_macl() -> torch.nn.Module:
    from adaptcl.plugins import MACLLoss

    return MACLLoss(0.1, 0.5, 0.0)


def _lightly_ntxent() -> torch.nn.Module:
    from lightly.loss import NTXentLoss

    return NTXentLoss(0.1)


def _lightly_dcl() -> torch.nn.Module:
    from lightly.loss import DCLLoss

    return DCLLoss(0.1)


def _lightly_macl() -> torch.nn.Module:
    from lightly.loss import MACLLoss

    return MACLLoss(0.1, 0.5, 0.0)


# name -> factory; factories import lazily, so a memory worker loads only its own library.
CANDIDATES: dict[str, Callable[[], torch.nn.Module]] = {
    OURS_NTXENT: _ours_ntxent,
    OURS_MACL: _ours_macl,
    LIGHTLY_NTXENT: _lightly_ntxent,
    LIGHTLY_DCL: _lightly_dcl,
    LIGHTLY_MACL: _lightly_macl,
}

# (label, candidate, reference, metric): the headline ratios, candidate / reference.
SUMMARY = (
    ("our NT-Xent time / Lightly NTXentLoss time", OURS_NTXENT, LIGHTLY_NTXENT, "time"),
    ("our MACL time / Lightly NTXentLoss time", OURS_MACL, LIGHTLY_NTXENT, "time"),
    ("our MACL time / Lightly MACLLoss time", OURS_MACL, LIGHTLY_MACL, "time"),
    ("our MACL peak memory / Lightly MACLLoss peak memory", OURS_MACL, LIGHTLY_MACL, "memory"),
    ("our MACL time / our NT-Xent time", OURS_MACL, OURS_NTXENT, "time"),
)
SUMMARY_BATCH = 4096
MIB = 2**20
# Peaks are read in pages from /proc; below this a memory ratio is noise and is not reported.
MEMORY_RESOLUTION = MIB


def core_fingerprint() -> str:
    """Short hash of the installed ``adaptcl.plugins`` sources.

    Other people edit the core while benchmarks run; the timing process and every memory worker
    record this so a run that mixed two versions of the code says so instead of lying.
    """
    import adaptcl.plugins

    digest = hashlib.sha256()
    for path in sorted(Path(adaptcl.plugins.__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def load_average() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def make_inputs(batch: int, dim: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two ``[batch, dim]`` leaf embeddings that require grad, identical for every candidate."""
    gen = torch.Generator().manual_seed(seed)
    z0 = torch.randn(batch, dim, generator=gen).requires_grad_(True)
    z1 = torch.randn(batch, dim, generator=gen).requires_grad_(True)
    return z0, z1


def step(loss_fn: torch.nn.Module, z0: torch.Tensor, z1: torch.Tensor) -> float:
    """One forward+backward; returns the loss value (forces the computation to finish)."""
    z0.grad = None
    z1.grad = None
    loss = loss_fn(z0, z1)
    loss.backward()
    return float(loss.detach())


# ----------------------------------------------------------------------------------- time


def time_batch(names: list[str], batch: int, dim: int, repeats: int, warmup: int,
               seed: int = 0) -> dict[str, list[float]]:
    """Seconds per forward+backward of each candidate, ``repeats`` interleaved rounds each."""
    fns = {name: CANDIDATES[name]() for name in names}
    z0, z1 = make_inputs(batch, dim, seed)
    for _ in range(warmup):
        for name in names:
            step(fns[name], z0, z1)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            gc.collect()
            start = time.perf_counter()
            step(fns[name], z0, z1)
            times[name].append(time.perf_counter() - start)
    return times


def paired_ratio(times: dict[str, list[float]], name: str, ref: str) -> float:
    """Median over rounds of ``time[name] / time[ref]`` measured in the same round."""
    return statistics.median(a / b for a, b in zip(times[name], times[ref], strict=True))


# --------------------------------------------------------------------------------- memory


def _proc_status_kib(field: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(rf"^{field}:\s+(\d+)\s+kB", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS counter (VmHWM); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return False
    return _proc_status_kib("VmHWM") is not None


def memory_worker(name: str, batch: int, dim: int, seed: int) -> dict[str, object]:
    """Peak bytes one step of ``name`` adds to this process; see the module docstring."""
    loss_fn = CANDIDATES[name]()
    z0, z1 = make_inputs(batch, dim, seed)
    step(loss_fn, z0, z1)  # warm: first-call caches and library buffers are not the step's cost
    z0.grad = None
    z1.grad = None
    gc.collect()
    if _reset_peak():
        method = "VmHWM-after-clear_refs"
        before = _proc_status_kib("VmRSS")
        step(loss_fn, z0, z1)
        peak = _proc_status_kib("VmHWM")
    else:
        method = "ru_maxrss"
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        step(loss_fn, z0, z1)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"name": name, "batch": batch, "dim": dim, "method": method,
            "peak_bytes": max(0, peak - before) * 1024, "core": core_fingerprint()}


def measure_memory(names: list[str], batch: int, dim: int, seed: int, threads: int,
                   shared_process: bool = False) -> dict[str, dict[str, object]]:
    """Peak step memory of each candidate, each in a fresh interpreter.

    ``shared_process=True`` (``--smoke``) measures all candidates one after the other in a
    single worker to save interpreter start-ups; the numbers are then only indicative.
    """
    env = dict(os.environ)
    env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    src = str(Path(__file__).resolve().parents[1] / "src")  # works without an editable install
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    groups = [names] if shared_process else [[name] for name in names]
    out: dict[str, dict[str, object]] = {}
    for group in groups:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--_memory-worker", *group,
               "--batches", str(batch), "--dim", str(dim), "--seed", str(seed),
               "--threads", str(threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"memory worker for {group} at batch {batch} failed:\n{proc.stderr}")
        for line in proc.stdout.strip().splitlines():
            record = json.loads(line)
            out[record["name"]] = record
    return out


# -------------------------------------------------------------------------------- report


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def run(args: argparse.Namespace) -> dict[str, object]:
    names = list(CANDIDATES)
    core = core_fingerprint()
    results: dict[str, object] = {
        "config": {"smoke": args.smoke, "batches": args.batches, "dim": args.dim,
                   "repeats": args.repeats, "warmup": args.warmup, "threads": args.threads,
                   "seed": args.seed, "torch": torch.__version__},
        "core_fingerprint": core,
        "load_average_start": load_average(),
        "batches": {},
    }
    for name in names:  # import every library before timing anything
        CANDIDATES[name]()
    for batch in args.batches:
        t0 = time.perf_counter()
        times = time_batch(names, batch, args.dim, args.repeats, args.warmup, args.seed)
        memory = measure_memory(names, batch, args.dim, args.seed, args.threads,
                                shared_process=args.smoke)
        rows = {}
        for name in names:
            peak = int(memory[name]["peak_bytes"])
            rows[name] = {
                "time_median_s": statistics.median(times[name]),
                "times_s": times[name],
                "peak_bytes": peak,
                "memory_method": memory[name]["method"],
                "time_vs_lightly_ntxent": paired_ratio(times, name, LIGHTLY_NTXENT),
                "time_vs_lightly_macl": paired_ratio(times, name, LIGHTLY_MACL),
                "time_vs_ours_ntxent": paired_ratio(times, name, OURS_NTXENT),
                "memory_vs_lightly_ntxent": memory_ratio(peak, memory[LIGHTLY_NTXENT]["peak_bytes"]),
                "memory_vs_lightly_macl": memory_ratio(peak, memory[LIGHTLY_MACL]["peak_bytes"]),
            }
        results["batches"][str(batch)] = rows
        seen = {str(m["core"]) for m in memory.values()} | {core_fingerprint()}
        changed = sorted(seen - {core})
        if changed:
            results.setdefault("warnings", []).append(f"batch {batch}: core changed {changed}")
            print(f"WARNING: src/adaptcl/plugins changed during the run (fingerprint {core} -> "
                  f"{', '.join(changed)}); batch {batch} mixes two versions of the core: rerun",
                  flush=True)
        print(render_batch(batch, args.dim, rows, args.repeats), flush=True)
        print(f"(batch {batch} measured in {time.perf_counter() - t0:.0f} s)\n", flush=True)
    results["load_average_end"] = load_average()
    print(f"load average (1/5/15 min): {results['load_average_start']} at start, "
          f"{results['load_average_end']} at the end, on {os.cpu_count()} cores\n", flush=True)
    results["summary"] = summarise(results["batches"], args.batches)
    print(render_summary(results["summary"]), flush=True)
    return results


def memory_ratio(peak: float, reference: float) -> float | None:
    """``peak / reference``, or ``None`` when the reference is below :data:`MEMORY_RESOLUTION`."""
    return peak / reference if reference >= MEMORY_RESOLUTION else None


def render_batch(batch: int, dim: int, rows: dict[str, dict], repeats: int) -> str:
    lines = [
        f"### batch {batch}, dim {dim} (forward+backward, median of {repeats} interleaved rounds)",
        "",
        "| loss | time ms | peak MiB | time / Lightly NTXent | time / Lightly MACL "
        "| mem / Lightly NTXent | mem / Lightly MACL |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {row['time_median_s'] * 1e3:.1f} | {row['peak_bytes'] / MIB:.1f} "
            f"| {fmt_ratio(row['time_vs_lightly_ntxent'])} | {fmt_ratio(row['time_vs_lightly_macl'])} "
            f"| {fmt_ratio(row['memory_vs_lightly_ntxent'])} "
            f"| {fmt_ratio(row['memory_vs_lightly_macl'])} |"
        )
    return "\n".join(lines)


def summarise(per_batch: dict[str, dict], batches: list[int]) -> list[dict[str, object]]:
    """The headline ratios at batch 4096 (or the largest batch measured)."""
    batch = SUMMARY_BATCH if SUMMARY_BATCH in batches else max(batches)
    rows = per_batch[str(batch)]
    out = []
    for label, name, ref, metric in SUMMARY:
        if metric == "time":
            key = {LIGHTLY_NTXENT: "time_vs_lightly_ntxent", LIGHTLY_MACL: "time_vs_lightly_macl",
                   OURS_NTXENT: "time_vs_ours_ntxent"}[ref]
            ratio = rows[name][key]
        else:
            ratio = memory_ratio(rows[name]["peak_bytes"], rows[ref]["peak_bytes"])
        out.append({"ratio_of": label, "batch": batch, "ratio": ratio})
    return out


def render_summary(summary: list[dict[str, object]]) -> str:
    batch = summary[0]["batch"]
    note = "" if batch == SUMMARY_BATCH else f" (batch {SUMMARY_BATCH} not measured)"
    lines = [f"### ratios at batch {batch}{note}"]
    for row in summary:
        measured = ("below the 1 MiB resolution of the memory measurement" if row["ratio"] is None
                    else fmt_ratio(row["ratio"]))
        lines.append(f"{row['ratio_of']}: {measured}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[256, 1024, 4096],
                        help="batch sizes N (each loss sees 2N embeddings)")
    parser.add_argument("--dim", type=int, default=128, help="embedding dimension")
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed round-robin rounds per batch (median is reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds before timing")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch intra-op threads (default: all cores)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write every number here")
    parser.add_argument("--smoke", action="store_true",
                        help="seconds-long run: batch 32, 1 round, one shared memory worker "
                             "(checks the script, not the speed)")
    parser.add_argument("--_memory-worker", dest="memory_worker", nargs="+", default=None,
                        choices=list(CANDIDATES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.batches, args.repeats, args.warmup = [32], 1, 1
    if min(args.batches) < 2 or args.dim < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("need batches >= 2, dim >= 1, repeats >= 1, warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.memory_worker is not None:
        for name in args.memory_worker:
            print(json.dumps(memory_worker(name, args.batches[0], args.dim, args.seed)), flush=True)
        return 0
    print(f"torch {torch.__version__}, {args.threads} threads, dim {args.dim}, "
          f"batches {args.batches}, {args.repeats} rounds after {args.warmup} warm-up, "
          f"adaptcl.plugins fingerprint {core_fingerprint()}\n", flush=True)
    results = run(args)
    if args.json is not None:
        from adaptcl.recipes.engine.provenance import write_measurements

        write_measurements(args.json, results, device="cpu")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
