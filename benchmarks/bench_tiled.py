"""Tiled (Inf-CL style) vs materialised MACL: time and peak memory, as ratios in one run.

Purpose
-------
Project issue 8: ``MACLLoss(..., tile_size=T)`` streams the ``2N x 2N`` similarity matrix in
``T x T`` tiles (Cheng et al., "Breaking the Memory Barrier: Near Infinite Batch Size Scaling
for Contrastive Loss", 2024), so memory grows linearly with the batch. This script prints

1. MACL (``MACLLoss(0.1, 0.5, 0.0)``, symmetric NT-Xent form, dim 128) forward+backward at a
   huge batch (default 65,536 pairs, i.e. 131,072 anchors x 131,072 candidates) on the tiled
   path: time and peak memory, next to the bytes one materialised ``[2N, 2N]`` float32 matrix
   would take (the materialised path cannot run there);
2. at smaller batches both paths can run (default 1024, 4096, 8192), tiled vs materialised
   time and peak memory, as ratios measured in the same run (workers alternate, ratio per
   round, median over rounds).

Example::

    .venv/bin/python benchmarks/bench_tiled.py                          # full run
    .venv/bin/python benchmarks/bench_tiled.py --huge 0 --batches 2048  # comparison only
    .venv/bin/python benchmarks/bench_tiled.py --smoke                  # seconds

Peak memory
-----------
Each measurement runs in a fresh subprocess (``OMP_WAIT_POLICY=passive``, ``MALLOC_MMAP_THRESHOLD_=65536`` so freed tensors
return to the OS). The worker allocates the inputs, runs one untimed warm-up step (skipped at
the huge batch, where one step takes minutes: there the import/first-call overhead is part of
the reported number, so it is an upper bound), resets the kernel's high-water mark
(``echo 5 > /proc/self/clear_refs``) and reports ``VmHWM - VmRSS`` around the measured step:
every byte the step kept alive at its worst moment (saved tensors, tiles, gradients).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

GiB = 1024**3
MiB = 1024**2


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def worker(batch: int, dim: int, tile: int | None, warm: bool, repeats: int, threads: int) -> dict:
    import torch

    from adaptcl.plugins import MACLLoss

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    z0 = torch.randn(batch, dim, generator=g).requires_grad_()
    z1 = torch.randn(batch, dim, generator=g).requires_grad_()
    loss_fn = MACLLoss(0.1, 0.5, 0.0, tile_size=tile)

    def step() -> float:
        z0.grad = z1.grad = None
        t0 = time.perf_counter()
        loss = loss_fn(z0, z1)
        loss.backward()
        return time.perf_counter() - t0, float(loss)

    if warm:
        step()
        z0.grad = z1.grad = None
    import gc

    gc.collect()
    exact = _reset_hwm()
    base = _status("VmRSS")
    seconds, value = step()
    peak = _status("VmHWM") - base
    times = [seconds] + [step()[0] for _ in range(repeats - 1)]
    return {"batch": batch, "tile": tile, "peak_bytes": peak, "seconds": statistics.median(times),
            "times": times, "loss": value, "hwm_reset": exact}


def run_worker(batch: int, dim: int, tile: int | None, *, warm: bool, repeats: int,
               threads: int) -> dict:
    # Passive OpenMP waits: on a shared, loaded machine spinning threads turn every small op of
    # the tiled loop into a scheduling stall (measured 100x slower with the default policy).
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_WAIT_POLICY="passive")
    cmd = [sys.executable, __file__, "--worker", json.dumps(
        {"batch": batch, "dim": dim, "tile": tile, "warm": warm, "repeats": repeats,
         "threads": threads})]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"batch": batch, "tile": tile, "error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def fmt_bytes(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--huge", type=int, default=65536, help="batch (pairs) of the tiled-only run; 0 skips")
    p.add_argument("--huge-tile", type=int, default=4096)
    p.add_argument("--batches", type=int, nargs="+", default=[1024, 4096, 8192])
    p.add_argument("--tile", type=int, default=2048, help="tile size of the comparison")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3, help="alternating worker pairs per batch")
    p.add_argument("--repeats", type=int, default=3, help="timed steps per worker")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for the tests")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(worker(**spec)))
        return 0
    if args.smoke:
        args.huge, args.huge_tile, args.batches, args.tile, args.rounds, args.repeats = 2048, 512, [256], 128, 1, 1

    from adaptcl.plugins.tiles._loop import materialised_bytes

    report: dict = {"dim": args.dim, "threads": args.threads}
    print(f"MACLLoss(0.1, 0.5, 0.0), form nt_xent (2N anchors x 2N candidates), dim {args.dim}, "
          f"float32, {args.threads} threads")
    if args.huge:
        n2 = 2 * args.huge
        need = materialised_bytes(n2, n2)
        print(f"\n== batch {args.huge} (matrix {n2} x {n2}) ==")
        print(f"materialised: one [2N, 2N] float32 matrix = {fmt_bytes(need)} ({need} bytes); "
              "its forward+backward keeps at least two (the logits/exp buffer and the gradient)")
        r = run_worker(args.huge, args.dim, args.huge_tile, warm=False, repeats=1, threads=args.threads)
        report["huge"] = {**r, "materialised_bytes_one_copy": need}
        if "error" in r:
            print(f"tiled (tile {args.huge_tile}): did not run: {r['error']}")
        else:
            print(f"tiled (tile {args.huge_tile}): forward+backward {r['seconds']:.1f} s, peak memory "
                  f"{fmt_bytes(r['peak_bytes'])} (no warm-up: includes first-call overhead), "
                  f"loss {r['loss']:.6f}")
            print(f"  materialised one-copy bytes / tiled peak = {need / max(r['peak_bytes'], 1):.0f}x")
    rows = []
    print(f"\n== tiled (tile {args.tile}) vs materialised, same run ==")
    print(f"{'batch':>7} {'mat time':>10} {'tiled time':>11} {'time ratio':>11} "
          f"{'mat peak':>11} {'tiled peak':>11} {'mem ratio':>10} {'|dloss|':>9}")
    for batch in args.batches:
        t_ratios, m_ratios, mats, tils = [], [], [], []
        for k in range(args.rounds):
            order = [None, args.tile] if k % 2 == 0 else [args.tile, None]
            res = {t: run_worker(batch, args.dim, t, warm=True, repeats=args.repeats,
                                 threads=args.threads) for t in order}
            mat, til = res[None], res[args.tile]
            if "error" in mat or "error" in til:
                print(f"{batch:>7} error: {mat.get('error') or til.get('error')}")
                break
            mats.append(mat)
            tils.append(til)
            t_ratios.append(til["seconds"] / mat["seconds"])
            m_ratios.append(til["peak_bytes"] / max(mat["peak_bytes"], 1))
        if not mats:
            continue
        row = {"batch": batch, "tile": args.tile,
               "materialised_seconds": statistics.median(m["seconds"] for m in mats),
               "tiled_seconds": statistics.median(t["seconds"] for t in tils),
               "time_ratio": statistics.median(t_ratios),
               "materialised_peak": statistics.median(m["peak_bytes"] for m in mats),
               "tiled_peak": statistics.median(t["peak_bytes"] for t in tils),
               "memory_ratio": statistics.median(m_ratios),
               "loss_difference": abs(mats[0]["loss"] - tils[0]["loss"])}
        rows.append(row)
        print(f"{batch:>7} {row['materialised_seconds']:>9.3f}s {row['tiled_seconds']:>10.3f}s "
              f"{row['time_ratio']:>10.2f}x {fmt_bytes(row['materialised_peak']):>11} "
              f"{fmt_bytes(row['tiled_peak']):>11} {row['memory_ratio']:>9.3f}x "
              f"{row['loss_difference']:>9.1e}")
    report["comparison"] = rows
    print("\ntime ratio = tiled / materialised (median of per-round ratios; > 1 means tiling costs time);"
          "\nmem ratio = tiled peak / materialised peak (fresh subprocess each, peak RSS growth of one step).")
    if args.json:
        from adaptcl.recipes.engine.provenance import write_measurements

        write_measurements(args.json, report, device="cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
