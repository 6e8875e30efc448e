"""The fused kernels against issue 52's targets, in one run: ``bench_gpu.py --targets``.

Each row is one forward+backward of a tiled loss on the fused kernel (median of ``--repeats``
timed steps after one warm-up that compiles), on leaves in the case's dtype (bf16: what a
projection head hands the loss under autocast; the products then run on tensor cores), beside
its peer where the target is relative:

* cross-view InfoNCE at 65,536 / 262,144 / 1,048,576 pairs, dim 128, bf16 (at most 9 ms,
  140 ms, 2.3 s), with inf-cl's ``cal_flash_loss`` beside it where ``inf_cl`` imports;
* the 2N (NT-Xent) form at 131,072 rows (at most 40 ms);
* MACL, DCL, DySTreSS and ``labels=`` at 65,536 (each at most 1.3x the InfoNCE kernel);
* AMCL's pair term (at most 2.5x);
* dim 512 (at most 1.6x its floor: its five products at the GPU's dense bf16 peak,
  :func:`floor_ms`);
* the one-pass backward (``tiling(backward="onepass")``) beside the default split one, to
  decide which should be the default;
* float32 inputs at PyTorch's default "highest" precision: the kernel (IEEE products) and the
  PyTorch tile loop, which it must not be slower than;
* the first call in a fresh process with an empty Triton cache (at most 10 s): a subprocess
  that imports torch and adaptcl, compiles and runs the cross-view InfoNCE case once.

On CUDA each row also times its fused kernels apart (``fwd``, ``dq``, ``dk``, ...: one more
step under ``torch.profiler``, each kernel's device time), the numbers the kernel report's
model (``kernel_model.py``, its ``model ms`` column in docs/large_batches.md) predicts.

``--budget`` seconds bound the whole part: cases run in the order above, and those left when it
is spent are recorded as ``not run``. On the CPU (``--device cpu --tiny``, the smoke test) the
same machinery runs at toy sizes on the PyTorch loop (``backend`` says which ran); its numbers
are not the point.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

TEMPERATURE = 0.1
MIB = 2**20


@dataclass(frozen=True)
class Case:
    """One row: ``build(backend)`` returns ``loss(z0, z1)``; ``target`` in ms (``max_ms``), or
    as a ratio to the time of the row named ``relative_to`` (``max_ratio``)."""

    name: str
    batch: int
    dim: int
    dtype: str
    build: Callable[[str], Callable]
    max_ms: float | None = None
    relative_to: str | None = None
    max_ratio: float | None = None
    peer: bool = False  # a row that only stands beside another (no target of its own)
    setting: tuple[tuple[str, object], ...] = ()  # tiling(...) fields set while the row runs


class OnBackend(torch.nn.Module):
    """``loss`` called under ``adaptcl.plugins.tiling(backend=backend)``: the one place this
    file selects the kernel (a module, so that ``.to(device)`` moves the loss's parameters)."""

    def __init__(self, loss: torch.nn.Module, backend: str) -> None:
        super().__init__()
        self.loss, self.backend = loss, backend

    def forward(self, *args, **kwargs):
        from adaptcl.plugins import tiling

        with tiling(backend=self.backend):
            return self.loss(*args, **kwargs)


def tiled(cls_name: str, *args, **kwargs) -> Callable[[str], Callable]:
    """``build(backend)`` of one of adaptcl's losses on the tiled path of ``backend``."""
    def build(backend: str):
        import adaptcl.plugins as plugins

        loss = getattr(plugins, cls_name)(*args, check_finite=False,
                                          tile_size=tile_of(backend), **kwargs)
        return OnBackend(loss, backend)
    return build


def tile_of(backend: str) -> int | str:
    """The losses' ``tile_size`` on ``backend``: the loop's tile, or ``"auto"`` for the kernels,
    which run their own blocks (an int is the loop's tile only)."""
    return 4096 if backend == "torch" else "auto"


def with_labels(build: Callable[[str], Callable], classes: int) -> Callable[[str], Callable]:
    def wrapped(backend: str):
        loss = build(backend)

        def call(z0, z1):
            g = torch.Generator(device="cpu").manual_seed(0)
            labels = torch.randint(0, classes, (z0.shape[0],), generator=g).to(z0.device)
            return loss(z0, z1, labels=labels)
        return call
    return wrapped


def amcl(dim: int) -> Callable[[str], Callable]:
    def build(backend: str):
        import adaptcl.plugins as plugins

        net = plugins.PairTemperature(dim)
        loss = plugins.AMCLLoss(net, beta=1e-3, form="cross_view", check_finite=False,
                                tile_size=tile_of(backend))
        return OnBackend(loss, backend)
    return build


def inf_cl(_backend: str):
    from inf_cl import cal_flash_loss

    def loss(z0, z1):
        q, k = F.normalize(z0, dim=1), F.normalize(z1, dim=1)
        return cal_flash_loss(q, k, scale=1 / TEMPERATURE, head_dim=min(q.shape[1], 256)).mean()
    return loss


INFONCE = "cross-view InfoNCE, 65,536 x 128, bf16"
#: dense bf16 tensor-core flops per second of an H100 / H200 (SXM)
PEAK_BF16 = 989e12


def floor_ms(rows: int, dim: int) -> float:
    """The cross-view step's products alone at the dense bf16 peak, in ms: five products of
    ``rows x rows x dim`` (the forward's, two in ``dq``, two in ``dk``); 5.6 ms at 65,536 x
    128 (issue 52's floor)."""
    return 5 * 2 * rows * rows * dim / PEAK_BF16 * 1e3


def cases(scale: int = 1) -> list[Case]:
    """The issue's rows; ``scale`` divides every batch and dimension (the CPU smoke test)."""
    n, big, huge = 65536 // scale, 262144 // scale, 1048576 // scale
    d, wide = max(128 // scale, 8), max(512 // scale, 16)
    cross = tiled("InfoNCELoss", TEMPERATURE, form="cross_view")
    rows = [
        Case(INFONCE, n, d, "bf16", cross, max_ms=9.0),
        Case("inf-cl cal_flash_loss, 65,536 x 128, bf16", n, d, "bf16", inf_cl, peer=True),
        Case("cross-view InfoNCE, 262,144, bf16", big, d, "bf16", cross, max_ms=140.0),
        Case("inf-cl cal_flash_loss, 262,144, bf16", big, d, "bf16", inf_cl, peer=True),
        Case("cross-view InfoNCE, 1,048,576, bf16", huge, d, "bf16", cross, max_ms=2300.0),
        Case("2N form InfoNCE, 131,072 rows, bf16", n, d, "bf16",
             tiled("InfoNCELoss", TEMPERATURE), max_ms=40.0),
        Case("MACL cross-view, 65,536, bf16", n, d, "bf16",
             tiled("MACLLoss", TEMPERATURE, 0.5, form="cross_view"), relative_to=INFONCE,
             max_ratio=1.3),
        Case("DCL cross-view, 65,536, bf16", n, d, "bf16",
             tiled("DCLLoss", TEMPERATURE, form="cross_view"), relative_to=INFONCE,
             max_ratio=1.3),
        Case("DySTreSS cross-view, 65,536, bf16", n, d, "bf16",
             tiled("DySTreSSLoss", 0.1, 0.2, form="cross_view"), relative_to=INFONCE,
             max_ratio=1.3),
        Case("InfoNCE cross-view labels=, 65,536, bf16", n, d, "bf16",
             with_labels(cross, 1000), relative_to=INFONCE, max_ratio=1.3),
        Case("AMCL pair term, cross-view, 65,536, bf16", n, d, "bf16", amcl(d),
             relative_to=INFONCE, max_ratio=2.5),
        Case("cross-view InfoNCE, 65,536 x 512, bf16", n, wide, "bf16", cross,
             max_ms=1.6 * floor_ms(n, wide)),
        Case("cross-view InfoNCE, one-pass backward, 65,536, bf16", n, d, "bf16", cross,
             peer=True, setting=(("backward", "onepass"),)),
        Case("PyTorch tile loop, float32 highest, 65,536", n, d, "fp32", cross, peer=True),
        Case("cross-view InfoNCE, float32 highest, 65,536", n, d, "fp32", cross,
             relative_to="PyTorch tile loop, float32 highest, 65,536", max_ratio=1.0),
    ]
    return rows


def _backend(case: Case, kernel_backend: str) -> str:
    if case.build is inf_cl:
        return "inf-cl"
    return "torch" if case.name.startswith("PyTorch tile loop") else kernel_backend


def _timer(device: torch.device):
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def measure(step) -> float:
            start.record()
            step()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        return measure

    def measure(step) -> float:
        t0 = time.perf_counter()
        step()
        return time.perf_counter() - t0
    return measure


#: the fused kernels' names (Triton names a CUDA kernel after its function)
KERNEL_PREFIXES = ("row_stats_", "pair_lse_")


def kernel_times(events) -> dict[str, float]:
    """The fused kernels' device milliseconds by short name (``row_stats_fwd`` -> ``fwd``,
    ``pair_lse_dq`` -> ``pair_dq``) from ``torch.profiler``'s ``key_averages()``."""
    out = {}
    for event in events:
        if event.key.startswith(KERNEL_PREFIXES):
            name = event.key.removeprefix("row_stats_").replace("pair_lse_", "pair_")
            out[name] = out.get(name, 0.0) + event.device_time_total / 1e3
    return out


def pass_times(step, device: torch.device) -> dict[str, float]:
    """One more ``step`` under ``torch.profiler``: each fused kernel's device time in ms
    (``{}`` off CUDA, where no kernel runs on a device)."""
    if device.type != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize(device)
    return kernel_times(prof.key_averages())


def run_case(case: Case, device: torch.device, backend: str, repeats: int) -> dict:
    """One row: ``{"status": "ok", "time_s", "first_s", "peak_bytes"}`` or the failure."""
    from adaptcl.plugins import tiling

    with tiling(**dict(case.setting)):
        return _run_case(case, device, backend, repeats)


def _run_case(case: Case, device: torch.device, backend: str, repeats: int) -> dict:
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[case.dtype]
    record = {"case": case.name, "batch": case.batch, "dim": case.dim, "dtype": case.dtype,
              "backend": backend}
    try:
        loss_fn = case.build(backend)
        if isinstance(loss_fn, torch.nn.Module):
            loss_fn = loss_fn.to(device)
        g = torch.Generator(device="cpu").manual_seed(case.batch)
        z0, z1 = (torch.randn(case.batch, case.dim, generator=g).to(device, dtype)
                  .requires_grad_(True) for _ in range(2))

        def step() -> None:
            z0.grad = z1.grad = None
            loss_fn(z0, z1).backward()

        measure = _timer(device)
        first = measure(step)  # compiles the kernels of this case
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        times = [measure(step) for _ in range(repeats)]
        peak = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else None
        try:
            passes = pass_times(step, device)
        except Exception as error:  # noqa: BLE001 - the profile is extra: the row's time stands
            passes = {}
            record["passes_error"] = f"{type(error).__name__}: {error}"[:300]
    except Exception as error:  # noqa: BLE001 - one case cannot end the run
        message = (str(error).splitlines() or [""])[0][:300]
        return {**record, "status": "error", "error": f"{type(error).__name__}: {message}"}
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {**record, "status": "ok", "time_s": statistics.median(times), "times_s": times,
            "first_s": first, "peak_bytes": peak, "passes_ms": passes}


FIRST_CALL = """
import time, sys
t0 = time.perf_counter()
import torch
sys.path.insert(0, {here!r})
from kernel_targets import cases
case = next(c for c in cases({scale}) if c.name == {name!r})
device = torch.device({device!r})
loss = case.build({backend!r})
z0, z1 = (torch.randn(case.batch, case.dim).to(device, torch.bfloat16).requires_grad_(True)
          for _ in range(2))
loss(z0, z1).backward()
if device.type == "cuda":
    torch.cuda.synchronize()
print("FIRST_CALL_S", time.perf_counter() - t0)
"""


def first_call(device: torch.device, backend: str, scale: int, timeout: float) -> dict:
    """The cross-view InfoNCE case once, in a fresh process with an empty Triton cache:
    interpreter start, imports, CUDA set-up, compilation and the step (at most 10 s)."""
    record = {"case": "first call in a fresh process, empty Triton cache", "batch": None,
              "dim": None, "dtype": "bf16", "backend": backend}
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache}
        code = FIRST_CALL.format(here=here, scale=scale, name=INFONCE, device=str(device),
                                 backend=backend)
        try:
            proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                  text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return {**record, "status": "error", "error": f"over {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("FIRST_CALL_S")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or [""])[-1][:300]
        return {**record, "status": "error", "error": f"exit {proc.returncode}: {tail}"}
    seconds = float(lines[-1].split()[1])
    return {**record, "status": "ok", "time_s": seconds, "max_ms": 10000.0,
            "met": seconds <= 10.0, "target": "<= 10 s"}


def judge(records: list[dict], table: list[Case]) -> None:
    """Each row's target and whether the run met it (``met``: True / False / None)."""
    by_name = {r["case"]: r for r in records}
    for case in table:
        r = by_name.get(case.name)
        if r is None:
            continue
        ok = r["status"] == "ok"
        if case.max_ms is not None:
            r["target"] = f"<= {case.max_ms:,.0f} ms"
            r["met"] = ok and r["time_s"] * 1e3 <= case.max_ms
        elif case.relative_to is not None:
            ref = by_name.get(case.relative_to)
            ratio = (r["time_s"] / ref["time_s"] if ok and ref and ref["status"] == "ok"
                     else None)
            r["ratio"] = ratio
            r["target"] = f"<= {case.max_ratio:g}x {case.relative_to}"
            r["met"] = None if ratio is None else ratio <= case.max_ratio
        else:
            r["target"], r["met"] = "(beside)", None


def run(device: torch.device, *, tiny: bool, repeats: int, budget: float,
        log=print) -> list[dict]:
    """Every case in order within ``budget`` seconds, then the fresh-process first call."""
    scale = 256 if tiny else 1
    backend = "triton" if device.type == "cuda" else "torch"
    table = cases(scale)
    records, t0 = [], time.monotonic()
    have_inf_cl = _imports("inf_cl") and device.type == "cuda"
    for case in table:
        chosen = _backend(case, backend)
        if chosen == "inf-cl" and not have_inf_cl:
            records.append({"case": case.name, "batch": case.batch, "dim": case.dim,
                            "dtype": case.dtype, "backend": chosen, "status": "unavailable",
                            "error": "inf_cl is not installed here (or no CUDA)"})
        elif time.monotonic() - t0 > budget:
            records.append({"case": case.name, "batch": case.batch, "dim": case.dim,
                            "dtype": case.dtype, "backend": chosen, "status": "not run",
                            "error": f"the part's budget of {budget:.0f} s was spent"})
        else:
            records.append(run_case(case, device, chosen, repeats))
        log(f"  {describe(records[-1])}")
    left = budget - (time.monotonic() - t0)
    if left > 5:
        records.append(first_call(device, backend, scale, timeout=max(left, 5)))
    else:
        records.append({"case": "first call in a fresh process, empty Triton cache",
                        "status": "not run", "error": "no budget left", "backend": backend,
                        "batch": None, "dim": None, "dtype": "bf16"})
    log(f"  {describe(records[-1])}")
    judge(records, table)
    return records


def _imports(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def describe(r: dict) -> str:
    if r["status"] != "ok":
        return f"{r['case']}: {r['status']} ({r.get('error', '')})"
    return f"{r['case']}: {r['time_s'] * 1e3:,.2f} ms [{r['backend']}]"


def render(records: list[dict], env: dict) -> str:
    """The targets' table (markdown), with the GPU and versions it ran on."""
    out = [f"### Issue 47's targets on {env.get('gpu') or env.get('device', '?')} (torch "
           f"{env.get('torch')}, Triton {env.get('triton', '-')}, commit {env.get('git_commit', '-')})",
           "", "| case | rows x dim | backend | time | kernels apart (ms) | first call | peak MiB "
           "| target | ratio | met |",
           "| --- | ---: | --- | ---: | --- | ---: | ---: | --- | ---: | :---: |"]
    for r in records:
        ok = r["status"] == "ok"
        time_ms = f"{r['time_s'] * 1e3:,.1f} ms" if ok else r["status"]
        first = f"{r['first_s']:.2f} s" if ok and r.get("first_s") is not None else "-"
        peak = f"{r['peak_bytes'] / MIB:,.0f}" if ok and r.get("peak_bytes") else "-"
        ratio = f"{r['ratio']:.2f}x" if r.get("ratio") is not None else "-"
        met = {True: "yes", False: "**no**", None: "-"}[r.get("met")]
        size = "-" if r.get("batch") is None else f"{r['batch']:,} x {r['dim']}"
        passes = ", ".join(f"{k} {v:,.2f}" for k, v in (r.get("passes_ms") or {}).items()) or "-"
        out.append(f"| {r['case']} | {size} | {r['backend']} | {time_ms} | {passes} | {first} "
                   f"| {peak} | {r.get('target', '-')} | {ratio} | {met} |")
    return "\n".join(out) + "\n"
