"""The fused kernels' specialisations, compiled for a GPU on this CPU (``triton.compile`` with a
``GPUTarget``: PTX and a cubin from Triton's bundled ``ptxas``, no GPU needed).

What is compiled (:func:`covering_set`), per architecture (sm_80, sm_90):

* every distinct configuration of the fixed table (``tiles/_configs.py``): each kernel, each
  operand class and each block the table can choose, at the smallest feature width that
  chooses it, in each feature layout it meets (one resident chunk, several chunks, a split
  backward output);
* over those, the flags rotate so that each ``TERM`` (none, cosine, piecewise), ``HAS_POS``,
  ``HAS_SELF``, ``HAS_LAB``, ``DETACH``, ``SQUASH`` and each precision (bf16, fp16, TF32, IEEE)
  appears with each kernel.

:func:`compile_spec` returns what the compiler says: the PTX's tensor-core instructions
(``mma.sync`` on sm_80, ``wgmma`` on sm_90), registers, spills and shared memory from ptxas'
report, the compile time. ``tests/plugins/test_kernel_compile.py`` asserts on them; run this
file to print the whole report::

    PYTHONPATH=src:. python -m tests.plugins._kernel_specs [--arch 90] [--jobs 2]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import re
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

ARCHS = (80, 90)
PRECISIONS = ("bf16", "fp16", "tf32", "ieee")
OPERAND_TYPES = {"bf16": "bf16", "fp16": "fp16", "tf32": "fp32", "ieee": "fp32"}
POINTERS = {"A", "K", "PA", "PK"}
INDEX_POINTERS = {"POS", "SELF", "RLAB", "KLAB"}
FLOAT_POINTERS = {"LSE", "SUM_UL", "SUM_U", "G_LSE", "G_UL", "G", "TAU_SUM", "GA", "GK", "GPA",
                  "GPK", "GA32"}
INTS = {"M", "N", "D", "P"}
KERNEL_FUNCTIONS = {"fwd": ("_triton_rowstats", "row_stats_fwd"),
                    "dq": ("_triton_rowstats", "row_stats_dq"),
                    "dk": ("_triton_rowstats", "row_stats_dk"),
                    "bwd": ("_triton_rowstats", "row_stats_bwd_onepass"),
                    "pair_fwd": ("_triton_pairlse", "pair_lse_fwd"),
                    "pair_dq": ("_triton_pairlse", "pair_lse_dq"),
                    "pair_dk": ("_triton_pairlse", "pair_lse_dk")}
#: the flags each row-statistics compile takes in turn (every value of every flag appears)
ROW_FLAGS = [dict(HAS_POS=True, HAS_SELF=True, HAS_LAB=False, TERM=0, DETACH=True),
             dict(HAS_POS=True, HAS_SELF=False, HAS_LAB=True, TERM=1, DETACH=True),
             dict(HAS_POS=True, HAS_SELF=True, HAS_LAB=True, TERM=2, DETACH=False),
             dict(HAS_POS=False, HAS_SELF=False, HAS_LAB=False, TERM=1, DETACH=False),
             dict(HAS_POS=True, HAS_SELF=False, HAS_LAB=False, TERM=2, DETACH=True)]
PAIR_FLAGS = [dict(HAS_POS=True, HAS_SELF=True, SQUASH=1), dict(HAS_POS=True, HAS_SELF=False,
                                                                 SQUASH=0),
              dict(HAS_POS=False, HAS_SELF=False, SQUASH=1)]


@dataclass(frozen=True)
class Spec:
    """One compile: a kernel at an architecture, precision, feature width(s), flags and the
    table's block for them."""

    arch: int
    kernel: str
    precision: str
    width: int
    flags: tuple
    pair_width: int = 0

    def name(self) -> str:
        flags = ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in self.flags)
        pair = f" P={self.pair_width}" if self.kernel.startswith("pair") else ""
        return f"sm_{self.arch} {self.kernel} {self.precision} D={self.width}{pair} [{flags}]"


@dataclass
class Compiled:
    spec: Spec
    block: tuple
    seconds: float
    tensor_core_ops: int
    registers: int | None
    spill_stores: int | None
    spill_loads: int | None
    shared: int | None
    error: str | None = None
    notes: list[str] = field(default_factory=list)


def _table_entries():
    from adaptcl.plugins.tiles import _configs as configs

    return configs


def covering_set(archs=ARCHS, widths=None) -> list[Spec]:
    """Every distinct (kernel, operands, block, feature layout) the table can choose, per
    architecture, at the widest feature width that chooses it (the most registers), the flags
    and precisions rotating over them (see the module docstring). ``widths``: only those."""
    configs = _table_entries()
    specs = []
    for arch in archs:
        arch_name = f"sm_{arch}"
        flag_cycle = {k: itertools.cycle(PAIR_FLAGS if k.startswith("pair") else ROW_FLAGS)
                      for k in configs.KERNELS}
        precision_cycle = {(k, o): itertools.cycle([p for p in PRECISIONS
                                                    if configs.operands_of(p) == o])
                           for k in configs.KERNELS for o in configs.OPERANDS}
        widest: dict[tuple, int] = {}
        for kernel in configs.KERNELS:
            for operands in configs.OPERANDS:
                precision = next(p for p in PRECISIONS if configs.operands_of(p) == operands)
                for width in configs.WIDTHS:
                    if kernel.startswith("pair") and width > configs.pair_width(precision,
                                                                                 arch_name):
                        continue
                    if widths is not None and width not in widths:
                        continue
                    for heavy in (False, True):
                        block = configs.block(kernel, precision, width, arch_name, heavy)
                        layout = _layout(configs.features(width, precision, arch_name), width)
                        widest[kernel, operands, block, layout, heavy] = width
        for (kernel, operands, _block, _kind, heavy), width in widest.items():
            flags = dict(next(flag_cycle[kernel]))
            if not kernel.startswith("pair"):  # a flag set of the block's weight
                while (flags["HAS_LAB"] or flags["TERM"] != 0) != heavy:
                    flags = dict(next(flag_cycle[kernel]))
            if kernel.endswith("fwd"):
                flags.pop("DETACH", None)
            pair = kernel.startswith("pair")
            specs.append(Spec(arch, kernel, next(precision_cycle[kernel, operands]), width,
                              tuple(sorted(flags.items())), pair_width=width if pair else 0))
    return specs


def _layout(feats: dict[str, int], width: int) -> str:
    """The feature layout class a width takes: one resident chunk, several, a split output."""
    if feats["KCH"] == 1:
        return "resident"
    return "chunked" if feats["BDO"] >= width else "split"


def _signature(fn, precision: str) -> dict[str, str]:
    out = {}
    for i, name in enumerate(fn.arg_names):
        if fn.params[i].is_constexpr:
            out[name] = "constexpr"
        elif name in POINTERS:
            out[name] = "*" + OPERAND_TYPES[precision]
        elif name in INDEX_POINTERS:
            out[name] = "*i64"
        elif name in FLOAT_POINTERS:
            out[name] = "*fp32"
        elif name in INTS:
            out[name] = "i32"
        else:
            out[name] = "fp32"
    return out


def _attrs(fn, sig: dict[str, str]) -> dict:
    """What a launch at large aligned sizes specialises: 16-aligned pointers, sizes divisible
    by 16."""
    return {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
            if sig[name].startswith("*") or name in INTS}


def launch_meta(spec: Spec) -> tuple[dict, object]:
    """The constexprs and the block the launch would use (as ``_fused`` builds them)."""
    configs = _table_entries()
    arch = f"sm_{spec.arch}"
    flags = dict(spec.flags)
    heavy = bool(flags.get("HAS_LAB")) or bool(flags.get("TERM"))
    block = configs.block(spec.kernel, spec.precision, max(spec.width, spec.pair_width), arch,
                          heavy)
    feats = configs.features(spec.width, spec.precision, arch)
    meta = {**dict(spec.flags), "PRECISION": spec.precision, "BM": block.bm, "BN": block.bn,
            "BK": feats["BK"], "KCH": feats["KCH"]}
    if spec.kernel.startswith("pair"):
        pfeats = configs.features(spec.pair_width, spec.precision, arch)
        meta |= {"BP": pfeats["BK"], "PCH": pfeats["KCH"]}
        if spec.kernel != "pair_fwd":
            meta |= {"BDO": configs.padded(spec.width), "BPO": configs.padded(spec.pair_width)}
    elif spec.kernel != "fwd":
        meta["BDO"] = feats["BDO"]
    return meta, block


_PTXAS = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def compile_spec(spec: Spec) -> Compiled:
    """Compile one spec for its architecture; never raises (a failure is in ``error``)."""
    import importlib

    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, name = KERNEL_FUNCTIONS[spec.kernel]
    fn = getattr(importlib.import_module(f"adaptcl.plugins.tiles.{module}"), name)
    meta, block = launch_meta(spec)
    sig = _signature(fn, spec.precision)
    log = io.StringIO()
    start = time.perf_counter()
    try:
        previous = knobs.nvidia.dump_ptxas_log
        knobs.nvidia.dump_ptxas_log = True
        try:
            with contextlib.redirect_stdout(log):
                kernel = triton.compile(
                    ASTSource(fn=fn, signature=sig, constexprs=meta, attrs=_attrs(fn, sig)),
                    target=GPUTarget("cuda", spec.arch, 32),
                    options={"num_warps": block.warps, "num_stages": block.stages})
        finally:
            knobs.nvidia.dump_ptxas_log = previous
    except Exception as error:  # noqa: BLE001 - reported, the test fails on it
        return Compiled(spec, (block.bm, block.bn, block.warps, block.stages),
                        time.perf_counter() - start, 0, None, None, None, None,
                        error=_cause(error))
    seconds = time.perf_counter() - start
    ptx = kernel.asm["ptx"]
    mma = len(re.findall(r"\bwgmma\.mma_async|\bmma\.sync", ptx))
    text = log.getvalue()
    regs = _PTXAS.search(text)
    spills = _SPILLS.search(text)
    return Compiled(spec, (block.bm, block.bn, block.warps, block.stages), seconds, mma,
                    int(regs.group(1)) if regs else None,
                    int(spills.group(1)) if spills else None,
                    int(spills.group(2)) if spills else None,
                    getattr(kernel.metadata, "shared", None))


def _cause(error: BaseException) -> str:
    """The innermost error of a compile's chain (Triton wraps the cause in each caller's
    frame), with its type, on one line."""
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__
    lines = [ln.strip() for ln in str(error).strip().splitlines() if ln.strip()]
    return f"{type(error).__name__}: {' | '.join(lines[-4:])}"


def _init_worker(cache: str) -> None:
    os.environ["TRITON_CACHE_DIR"] = cache  # a fresh cache: ptxas runs (and reports) each time


def compile_all(specs: list[Spec], jobs: int = 2) -> list[Compiled]:
    """Compile ``specs`` in ``jobs`` processes, each with an empty Triton cache."""
    with tempfile.TemporaryDirectory() as cache, ProcessPoolExecutor(
            max_workers=jobs, initializer=_init_worker, initargs=(cache,)) as pool:
        return list(pool.map(compile_spec, specs))


def report(results: list[Compiled]) -> str:
    lines = [f"{'kernel':<72} {'block':<18} {'s':>5} {'mma':>4} {'regs':>4} {'spill':>9} "
             f"{'smem':>7}"]
    for r in results:
        block = "x".join(str(x) for x in r.block[:2]) + f" w{r.block[2]} s{r.block[3]}"
        spill = "-" if r.spill_stores is None else f"{r.spill_stores}/{r.spill_loads}"
        lines.append(f"{r.spec.name():<72} {block:<18} {r.seconds:5.1f} {r.tensor_core_ops:4d} "
                     f"{r.registers or '-':>4} {spill:>9} {r.shared or '-':>7}"
                     + (f"  ERROR {r.error}" if r.error else ""))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, nargs="+", default=list(ARCHS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--widths", type=int, nargs="+", default=None)
    parser.add_argument("--kernels", nargs="+", default=None)
    parser.add_argument("--operands", nargs="+", default=None)
    args = parser.parse_args()
    start = time.perf_counter()
    specs = [s for s in covering_set(args.arch, args.widths)
             if (args.kernels is None or s.kernel in args.kernels)
             and (args.operands is None or _table_entries().operands_of(s.precision)
                  in args.operands)]
    results = compile_all(specs, args.jobs)
    print(report(results))
    print(f"{len(results)} compiles in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
