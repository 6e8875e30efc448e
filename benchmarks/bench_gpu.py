"""GPU benchmark: forward+backward time and peak memory of adaptcl's losses against the peers.

What it measures, in one run, on one CUDA device:

* **losses**: adaptcl's ``InfoNCELoss``, ``MACLLoss``, ``DCLLoss`` (NT-Xent form, 2N anchors),
  ``ASCLLoss`` (in-batch soft labels), ``InfoNCELoss(form="cross_view")``, the tiled
  ``MACLLoss`` / cross-view ``InfoNCELoss`` (``tile_size``) on the PyTorch tile loop
  (``tiling(backend="torch")``) and, on CUDA with Triton, the same two on the fused kernel
  (``tiling(backend="triton")``, :mod:`adaptcl.plugins.tiles._fused`), against Lightly's ``NTXentLoss``,
  ``MACLLoss`` and ``DCLLoss``, sentence-transformers' ``MultipleNegativesRankingLoss`` and,
  when the ``inf_cl`` package imports, Inf-CL's tiled ``cal_flash_loss``; at every batch of
  ``--batches`` (materialised losses up to 262,144; larger batches run the tiled losses only),
  every dim of ``--dims`` and every dtype of ``--dtypes``. Each row names its peer (the same
  formulation in the other library) and gives time and memory as ratios to it and to Lightly's
  ``NTXentLoss``.
* **SimCLR step**: one training step (two views through a CIFAR ResNet-18, torchvision's
  ``resnet18`` with a 3x3 stride-1 stem and no max-pool, Lightly's ``SimCLRProjectionHead``,
  the loss, backward, SGD) at batch 512 under bf16 autocast, with adaptcl's Lightly
  ``MACLLoss`` against Lightly's ``NTXentLoss`` (and adaptcl's ``NTXentLoss``).

How:

* inputs ``z0, z1 ~ N(0, 1)`` of shape ``[batch, dim]`` in the case's dtype, leaves that
  require grad (as if they came out of a projection head); bf16 cases run the loss under
  ``torch.autocast(dtype=torch.bfloat16)``, as a mixed-precision training step does;
* time: ``--warmup`` untimed steps, then ``--repeats`` steps each timed with CUDA events
  (``time.perf_counter`` on CPU); the table shows the median. A case whose first step takes
  longer than ``--case-budget`` seconds is timed once;
* memory: ``torch.cuda.reset_peak_memory_stats`` before the timed steps and
  ``max_memory_allocated - memory_allocated`` around them, i.e. every byte the step added on
  top of its inputs: autograd-saved tensors, temporaries and the input gradients (not
  measured on CPU);
* an out-of-memory error is caught per case and recorded (``oom``); the same loss is then not
  tried at larger batches of that dim and dtype (``skipped``). Any other exception is recorded
  as ``error`` with its message, listed at the end, and makes the exit code 1.

Without CUDA the script prints why and exits 0. ``--device cpu`` runs the same machinery on
the CPU, for the smoke test (``tests/test_bench_gpu.py``); its numbers are not the point.

Examples::

    python benchmarks/bench_gpu.py                      # everything (tens of minutes on an H100)
    python benchmarks/bench_gpu.py --quick              # batches 4096 16384, dim 128: minutes
    python benchmarks/bench_gpu.py --batches 65536 262144 --dims 512 --dtypes bf16 --out r.json
    python benchmarks/bench_gpu.py --batches 65536 262144 --dims 128 --dtypes bf16 --tiled-only \
        --step-batch 0                                  # the tiled losses alone
    python benchmarks/bench_gpu.py --targets            # the fused kernels against issue 52's
                                                        # targets, within --budget (110 s)

``--targets`` runs ``kernel_targets.py`` (beside this file) instead of the tables above: the
kernels' cases at the issue's sizes, each with its target and whether it was met.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

TEMPERATURE = 0.1
DEFAULT_BATCHES = [4096, 16384, 65536, 262144, 1048576]
MATERIALISED_MAX_BATCH = 262144  # above it only the tiled losses run
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MIB = 2**20

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Candidate:
    """A loss to time: ``make(tile_size)`` returns ``loss_fn(z0, z1) -> scalar``."""

    name: str
    make: Callable[[int], LossFn]
    peer: str | None = None  # the same formulation in another library, for the ratio
    tiled: bool = False


def _plugin(cls_name: str, tiled: bool = False, backend: str = "torch",
            **kwargs) -> Callable[[int], LossFn]:
    def make(tile_size: int) -> LossFn:
        import adaptcl.plugins as plugins

        # the untiled rows time the materialised path (tile_size=None); the tiled ones run on
        # `backend`, the scoped setting of adaptcl.plugins.tiling: the loop at `tile_size`, the
        # kernels in their own blocks (tile_size="auto": an int is the loop's tile only)
        tiles = (tile_size if backend == "torch" else "auto") if tiled else None
        loss = getattr(plugins, cls_name)(check_finite=False, **kwargs, tile_size=tiles)

        def loss_fn(z0: torch.Tensor, z1: torch.Tensor) -> torch.Tensor:
            with plugins.tiling(backend=backend):
                return loss(z0, z1)

        loss_fn.backend = backend
        return loss_fn

    return make


def _lightly(cls_name: str, *args) -> Callable[[int], LossFn]:
    def make(_tile_size: int) -> LossFn:
        import lightly.loss

        return getattr(lightly.loss, cls_name)(*args)

    return make


def _mnrl(_tile_size: int) -> LossFn:
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    mnrl = MultipleNegativesRankingLoss(model=None, scale=1 / TEMPERATURE)
    return lambda z0, z1: mnrl.compute_loss_from_embeddings([z0, z1], None)


def _inf_cl(_tile_size: int) -> LossFn:
    from inf_cl import cal_flash_loss

    def loss_fn(z0: torch.Tensor, z1: torch.Tensor) -> torch.Tensor:
        q, k = F.normalize(z0, dim=1), F.normalize(z1, dim=1)  # counted, as ours normalise inside
        return cal_flash_loss(q, k, scale=1 / TEMPERATURE, head_dim=min(q.shape[1], 256)).mean()

    return loss_fn


OURS_INFONCE, OURS_MACL, OURS_DCL = "adaptcl InfoNCE", "adaptcl MACL", "adaptcl DCL"
OURS_ASCL, OURS_CROSS = "adaptcl ASCL (in-batch)", "adaptcl InfoNCE cross-view"
OURS_TILED_MACL, OURS_TILED_CROSS = "adaptcl MACL tiled", "adaptcl InfoNCE cross-view tiled"
OURS_KERNEL_MACL = "adaptcl MACL kernel"
OURS_KERNEL_CROSS = "adaptcl InfoNCE cross-view kernel"
LIGHTLY_NTXENT, LIGHTLY_MACL, LIGHTLY_DCL = "lightly NTXentLoss", "lightly MACLLoss", "lightly DCLLoss"
ST_MNRL, INF_CL = "sentence-transformers MNRL", "inf-cl cal_flash_loss"

# Check-finite is off in ours: on a GPU it is a host synchronisation, which timing would count.
CANDIDATES = [
    Candidate(OURS_INFONCE, _plugin("InfoNCELoss", temperature=TEMPERATURE), LIGHTLY_NTXENT),
    Candidate(OURS_MACL, _plugin("MACLLoss", temperature=TEMPERATURE, alpha=0.5), LIGHTLY_MACL),
    Candidate(OURS_DCL, _plugin("DCLLoss", temperature=TEMPERATURE), LIGHTLY_DCL),
    Candidate(OURS_ASCL, _plugin("ASCLLoss", temperature=TEMPERATURE, form="cross_view"),
              OURS_CROSS),
    Candidate(OURS_CROSS, _plugin("InfoNCELoss", temperature=TEMPERATURE, form="cross_view"),
              ST_MNRL),
    Candidate(OURS_TILED_MACL, _plugin("MACLLoss", tiled=True, temperature=TEMPERATURE,
                                       alpha=0.5), LIGHTLY_MACL, tiled=True),
    Candidate(OURS_TILED_CROSS, _plugin("InfoNCELoss", tiled=True, temperature=TEMPERATURE,
                                        form="cross_view"), INF_CL, tiled=True),
    Candidate(LIGHTLY_NTXENT, _lightly("NTXentLoss", TEMPERATURE)),
    Candidate(LIGHTLY_MACL, _lightly("MACLLoss", TEMPERATURE, 0.5, 0.0)),
    Candidate(LIGHTLY_DCL, _lightly("DCLLoss", TEMPERATURE)),
    Candidate(ST_MNRL, _mnrl),
    Candidate(INF_CL, _inf_cl, tiled=True),
]

# The fused Triton kernel of the tiled losses, beside the PyTorch tile loop and inf-cl (CUDA with
# Triton only: the kernel's peer for MACL is our tile loop, for cross-view InfoNCE inf-cl).
KERNEL_CANDIDATES = [
    Candidate(OURS_KERNEL_MACL, _plugin("MACLLoss", tiled=True, backend="triton",
                                        temperature=TEMPERATURE, alpha=0.5), OURS_TILED_MACL,
              tiled=True),
    Candidate(OURS_KERNEL_CROSS, _plugin("InfoNCELoss", tiled=True, backend="triton",
                                         temperature=TEMPERATURE, form="cross_view"), INF_CL,
              tiled=True),
]


def available_candidates(device: torch.device | None = None) -> list[Candidate]:
    """Every candidate whose library imports (Inf-CL is optional and CUDA-only), and the kernel
    rows on a CUDA ``device`` where Triton imports."""
    needs = {LIGHTLY_NTXENT: "lightly", LIGHTLY_MACL: "lightly", LIGHTLY_DCL: "lightly",
             ST_MNRL: "sentence_transformers", INF_CL: "inf_cl"}
    out = [c for c in CANDIDATES
           if c.name not in needs or importlib.util.find_spec(needs[c.name]) is not None]
    if device is not None and device.type == "cuda" and importlib.util.find_spec("triton"):
        out += KERNEL_CANDIDATES
    return out


# ------------------------------------------------------------------------------ measuring


class Timer:
    """Elapsed seconds of a region: CUDA events on a GPU, ``perf_counter`` elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __enter__(self) -> Timer:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self._end.record()
            self._end.synchronize()
            self.seconds = self._start.elapsed_time(self._end) / 1e3
        else:
            self.seconds = time.perf_counter() - self._t0


def is_oom(error: BaseException) -> bool:
    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(error, RuntimeError) and "out of memory" in str(error).lower())


def free_memory(device: torch.device) -> None:
    """Return what a finished case left behind (after an OOM, between batches); ~1 s per call."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure(step: Callable[[], None], device: torch.device, *, warmup: int, repeats: int,
            case_budget: float) -> dict[str, object]:
    """Median time and peak added memory of ``step``.

    Returns ``{"status": "ok", ...}``, or ``"oom"`` when the device ran out of memory, or
    ``"error"`` with the exception's type and message for anything else (reported at the end
    and in the exit code, but a long run goes on).

    ``step`` runs ``warmup`` times untimed, then ``repeats`` times under :class:`Timer` (once
    if the first warm step took longer than ``case_budget`` seconds).
    """
    cuda = device.type == "cuda"
    try:
        for i in range(max(warmup, 1)):
            with Timer(device) as first:
                step()
            if i == 0 and first.seconds > case_budget:
                repeats = 1
                break
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        times = []
        for _ in range(repeats):
            with Timer(device) as timer:
                step()
            times.append(timer.seconds)
        peak = torch.cuda.max_memory_allocated(device) - base if cuda else None
    except Exception as error:  # noqa: BLE001 - recorded, so one case cannot end a long run
        free_memory(device)
        message = (str(error).splitlines() or [""])[0][:300]
        return {"status": "oom" if is_oom(error) else "error",
                "error": message if is_oom(error) else f"{type(error).__name__}: {message}"}
    return {"status": "ok", "time_s": statistics.median(times), "times_s": times,
            "peak_bytes": peak}


def loss_step(loss_fn: LossFn, z0: torch.Tensor, z1: torch.Tensor,
              dtype: torch.dtype) -> Callable[[], None]:
    """One forward+backward of ``loss_fn`` on the leaves ``z0, z1`` (bf16 under autocast)."""

    def step() -> None:
        z0.grad = z1.grad = None
        with torch.autocast(device_type=z0.device.type, dtype=dtype,
                            enabled=dtype != torch.float32):
            loss = loss_fn(z0, z1)
        loss.backward()

    return step


def run_losses(candidates: list[Candidate], device: torch.device, batches: list[int],
               dims: list[int], dtypes: list[str], *, tile_size: int, warmup: int, repeats: int,
               case_budget: float, log=print) -> list[dict[str, object]]:
    """Every (dtype, dim, batch, candidate) case; one record each."""
    records = []
    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]
        for dim in dims:
            failed: dict[str, int] = {}  # candidate -> smallest batch that ran out of memory
            for batch in batches:
                gen = torch.Generator(device="cpu").manual_seed(batch)
                try:
                    z0, z1 = (torch.randn(batch, dim, generator=gen).to(device, dtype)
                              .requires_grad_(True) for _ in range(2))
                except Exception as error:  # noqa: BLE001
                    if not is_oom(error):
                        raise
                    log(f"batch {batch} dim {dim} {dtype_name}: inputs do not fit, skipped")
                    continue
                for cand in candidates:
                    record = {"loss": cand.name, "peer": cand.peer, "tiled": cand.tiled,
                              "batch": batch, "dim": dim, "dtype": dtype_name}
                    if batch > MATERIALISED_MAX_BATCH and not cand.tiled:
                        continue
                    if cand.name in failed:
                        record.update(status="skipped",
                                      error=f"out of memory at batch {failed[cand.name]}")
                    else:
                        try:
                            loss_fn = cand.make(tile_size)
                        except ImportError as error:
                            record.update(status="unavailable", error=str(error))
                        else:
                            if isinstance(loss_fn, torch.nn.Module):
                                loss_fn.to(device)  # e.g. Lightly's (empty) memory bank
                            record.update(measure(loss_step(loss_fn, z0, z1, dtype), device,
                                                  warmup=warmup, repeats=repeats,
                                                  case_budget=case_budget))
                            del loss_fn
                        if record["status"] == "oom":
                            failed[cand.name] = batch
                    records.append(record)
                    log(f"  {dtype_name} dim {dim} batch {batch} {cand.name}: {describe(record)}")
                del z0, z1
                free_memory(device)
    add_ratios(records)
    return records


def describe(record: dict[str, object]) -> str:
    if record["status"] != "ok":
        return str(record["status"])
    peak = record.get("peak_bytes")
    memory = "" if peak is None else f", {peak / MIB:.1f} MiB"
    return f"{record['time_s'] * 1e3:.2f} ms{memory}"


def _ratio(a, b) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def add_ratios(records: list[dict[str, object]]) -> None:
    """Time and memory ratios to the row's peer and to Lightly's NTXentLoss, same case."""
    index = {(r["dtype"], r["dim"], r["batch"], r["loss"]): r for r in records}
    for r in records:
        for label, ref_name in (("peer", r["peer"]), ("lightly_ntxent", LIGHTLY_NTXENT)):
            ref = index.get((r["dtype"], r["dim"], r["batch"], ref_name))
            ok = r["status"] == "ok" and ref is not None and ref["status"] == "ok"
            r[f"time_vs_{label}"] = _ratio(r.get("time_s"), ref.get("time_s")) if ok else None
            r[f"memory_vs_{label}"] = (_ratio(r.get("peak_bytes"), ref.get("peak_bytes"))
                                       if ok else None)


# ------------------------------------------------------------------------------ SimCLR step


def cifar_resnet18() -> tuple[torch.nn.Module, int]:
    """torchvision's ResNet-18 for 32x32 images: 3x3 stride-1 stem, no max-pool, no classifier."""
    from torchvision.models import resnet18

    model = resnet18()
    model.conv1 = torch.nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = torch.nn.Identity()
    features = model.fc.in_features
    model.fc = torch.nn.Identity()
    return model, features


STEP_LOSSES = {
    "adaptcl MACLLoss (Lightly adapter)": lambda: _adapter("MACLLoss", TEMPERATURE, 0.5, 0.0),
    "adaptcl NTXentLoss (Lightly adapter)": lambda: _adapter("NTXentLoss", TEMPERATURE),
    LIGHTLY_NTXENT: lambda: _lightly("NTXentLoss", TEMPERATURE)(0),
}


def _adapter(cls_name: str, *args) -> torch.nn.Module:
    import adaptcl.adapters.lightly as adapters

    return getattr(adapters, cls_name)(*args)


def run_simclr_step(device: torch.device, batch: int, dtype_name: str, *, warmup: int,
                    repeats: int, case_budget: float, log=print,
                    backbone_factory: Callable[[], tuple[torch.nn.Module, int]] = cifar_resnet18,
                    ) -> list[dict[str, object]]:
    """One SimCLR training step per loss, each on its own copy of the same initial model.

    ``backbone_factory`` returns ``(backbone, feature_dim)``; the smoke test passes a tiny one.
    """
    from lightly.models.modules.heads import SimCLRProjectionHead

    dtype = DTYPES[dtype_name]
    torch.manual_seed(0)
    backbone, features = backbone_factory()
    base = torch.nn.Sequential(backbone, SimCLRProjectionHead(features, 2048, 128))
    gen = torch.Generator().manual_seed(0)
    views = [torch.rand(batch, 3, 32, 32, generator=gen).to(device) for _ in range(2)]
    records = []
    for name, make_loss in STEP_LOSSES.items():
        model = copy.deepcopy(base).to(device).train()
        loss_fn = make_loss().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.06, momentum=0.9)

        def step(model=model, loss_fn=loss_fn, optimizer=optimizer) -> None:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device.type, dtype=dtype,
                                enabled=dtype != torch.float32):
                loss = loss_fn(model(views[0]), model(views[1]))
            loss.backward()
            optimizer.step()

        record = {"loss": name, "batch": batch, "dtype": dtype_name,
                  **measure(step, device, warmup=warmup, repeats=repeats,
                            case_budget=case_budget)}
        records.append(record)
        log(f"  SimCLR step batch {batch} {dtype_name} {name}: {describe(record)}")
        del model, loss_fn, optimizer
        free_memory(device)
    ref = next(r for r in records if r["loss"] == LIGHTLY_NTXENT)
    for r in records:
        ok = r["status"] == "ok" and ref["status"] == "ok"
        r["time_vs_lightly_ntxent"] = _ratio(r.get("time_s"), ref.get("time_s")) if ok else None
        r["memory_vs_lightly_ntxent"] = (_ratio(r.get("peak_bytes"), ref.get("peak_bytes"))
                                         if ok else None)
    return records


# ------------------------------------------------------------------------------ report


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render_losses(records: list[dict[str, object]], repeats: int) -> str:
    out = []
    cases = sorted({(r["dtype"], r["dim"], r["batch"]) for r in records},
                   key=lambda c: (list(DTYPES).index(c[0]), c[1], c[2]))
    for dtype, dim, batch in cases:
        out += [f"### {dtype}, dim {dim}, batch {batch:,} (forward+backward, median of "
                f"{repeats})", "",
                "| loss | time ms | peak MiB | peer | time / peer | mem / peer "
                "| time / Lightly NTXent | mem / Lightly NTXent |",
                "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
        for r in records:
            if (r["dtype"], r["dim"], r["batch"]) != (dtype, dim, batch):
                continue
            ok = r["status"] == "ok"
            time_ms = f"{r['time_s'] * 1e3:.2f}" if ok else r["status"]
            peak = r.get("peak_bytes") if ok else None
            out.append(
                f"| {r['loss']} | {time_ms} | {_cell(None if peak is None else peak / MIB, '.1f')} "
                f"| {r['peer'] or '-'} | {_cell(r['time_vs_peer'], '.2f')} "
                f"| {_cell(r['memory_vs_peer'], '.2f')} "
                f"| {_cell(r['time_vs_lightly_ntxent'], '.2f')} "
                f"| {_cell(r['memory_vs_lightly_ntxent'], '.2f')} |")
        out.append("")
    return "\n".join(out)


def render_step(records: list[dict[str, object]]) -> str:
    if not records:
        return ""
    r0 = records[0]
    out = [f"### SimCLR step: CIFAR ResNet-18, batch {r0['batch']}, {r0['dtype']} autocast, SGD",
           "", "| loss | time ms | peak MiB | time / Lightly NTXent | mem / Lightly NTXent |",
           "| --- | ---: | ---: | ---: | ---: |"]
    for r in records:
        ok = r["status"] == "ok"
        peak = r.get("peak_bytes") if ok else None
        out.append(f"| {r['loss']} | {r['time_s'] * 1e3:.2f} " if ok else f"| {r['loss']} | {r['status']} ")
        out[-1] += (f"| {_cell(None if peak is None else peak / MIB, '.1f')} "
                    f"| {_cell(r['time_vs_lightly_ntxent'], '.3f')} "
                    f"| {_cell(r['memory_vs_lightly_ntxent'], '.3f')} |")
    return "\n".join(out) + "\n"


def environment(device: torch.device) -> dict[str, object]:
    """The recipes' environment record (versions, host, commit, threads) plus the GPU it ran on
    and whether TF32 matmuls were allowed."""
    from adaptcl.recipes.engine.provenance import environment as run_environment

    env = run_environment(device=str(device))
    env["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    env["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    if importlib.util.find_spec("triton") is not None:
        import triton

        env["triton"] = triton.__version__
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=DEFAULT_BATCHES,
                        help="batch sizes N; above 262,144 only the tiled losses run")
    parser.add_argument("--dims", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--repeats", type=int, default=10, help="timed steps per case (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per case")
    parser.add_argument("--tile-size", type=int, default=4096, help="tile of the tiled losses")
    parser.add_argument("--case-budget", type=float, default=30.0,
                        help="a case whose first step takes longer (s) is timed once")
    parser.add_argument("--step-batch", type=int, default=512, help="SimCLR step batch (0: skip)")
    parser.add_argument("--step-dtype", choices=list(DTYPES), default="bf16")
    parser.add_argument("--out", type=Path, default=Path("results/bench_gpu.json"),
                        help="JSON file with every number")
    parser.add_argument("--quick", action="store_true",
                        help="batches 4096 16384, dim 128, 3 repeats after 1 warm-up")
    parser.add_argument("--tiled-only", action="store_true",
                        help="time the tiled losses alone (their cases at large batches)")
    parser.add_argument("--device", default="cuda",
                        help="cuda (default; exits 0 without CUDA) or cpu (smoke test only)")
    parser.add_argument("--targets", action="store_true",
                        help="the fused kernels against issue 52's targets (kernel_targets.py)")
    parser.add_argument("--tiny", action="store_true",
                        help="with --targets: toy sizes (the CPU smoke test)")
    parser.add_argument("--budget", type=float, default=110.0,
                        help="with --targets: seconds for every case together (default 110)")
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.dims, args.repeats, args.warmup = [4096, 16384], [128], 3, 1
    if min(args.batches) < 2 or min(args.dims) < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("need batches >= 2, dims >= 1, repeats >= 1, warmup >= 0")
    if args.tile_size < 1 or args.step_batch < 0:
        parser.error("need --tile-size >= 1 and --step-batch >= 0")
    return args


def run_targets(args: argparse.Namespace, device: torch.device, env: dict) -> int:
    """``--targets``: issue 52's table (``kernel_targets.py``), printed and written as JSON."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import kernel_targets

    print(f"bench_gpu.py --targets on {env.get('gpu') or 'cpu'}: torch {env['torch']}, "
          f"budget {args.budget:.0f} s, {args.repeats} repeats", flush=True)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731 - progress only
    records = kernel_targets.run(device, tiny=args.tiny, repeats=args.repeats,
                                 budget=args.budget, log=log)
    print(kernel_targets.render(records, env), flush=True)
    from adaptcl.recipes.engine.files import write_json_atomic

    write_json_atomic(args.out, {"environment": env, "config": {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "targets": records})
    print(f"wrote {args.out}")
    return 1 if any(r["status"] == "error" for r in records) else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_gpu.py: CUDA is not available on this machine; nothing measured "
              "(run it on a GPU machine, or pass --device cpu to exercise the script).")
        return 0
    env = environment(device)
    if args.targets:
        return run_targets(args, device, env)
    candidates = [c for c in available_candidates(device) if c.tiled or not args.tiled_only]
    print(f"bench_gpu.py on {env.get('gpu') or 'cpu'}: torch {env['torch']}, batches "
          f"{args.batches}, dims {args.dims}, dtypes {args.dtypes}, {args.repeats} repeats "
          f"after {args.warmup} warm-up, tile {args.tile_size}; losses: "
          f"{', '.join(c.name for c in candidates)}", flush=True)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731 - progress only
    losses = run_losses(candidates, device, args.batches, args.dims, args.dtypes,
                        tile_size=args.tile_size, warmup=args.warmup, repeats=args.repeats,
                        case_budget=args.case_budget, log=log)
    print(render_losses(losses, args.repeats), flush=True)
    step = []
    if args.step_batch:
        step = run_simclr_step(device, args.step_batch, args.step_dtype, warmup=args.warmup,
                               repeats=args.repeats, case_budget=args.case_budget, log=log)
        print(render_step(step), flush=True)
    result = {"environment": env, "config": {k: (str(v) if isinstance(v, Path) else v)
                                             for k, v in vars(args).items()},
              "losses": losses, "simclr_step": step}
    from adaptcl.recipes.engine.files import write_json_atomic

    write_json_atomic(args.out, result)
    print(f"wrote {args.out}")
    errors = [r for r in losses + step if r["status"] == "error"]
    for r in errors:
        print(f"ERROR in {r['loss']} (batch {r['batch']}, {r.get('dim', '-')}, {r['dtype']}): "
              f"{r['error']}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
