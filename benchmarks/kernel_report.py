"""The fused kernels' report: what the GPU would run, read on the CPU.

For every reachable launch (``kernel_reach.py``: every set of flags the losses send to a
kernel, at each architecture, precision and feature width the table distinguishes), compiled
for its GPU with Triton's bundled tools (``kernel_build.py``), one markdown row:

* the kernel, its flags and the first loss configuration that reaches it;
* the architecture, the products' precision, the padded feature width; the table's block
  (``BM x BN``), warps and stages;
* registers per thread and spilled bytes (ptxas' report); CTAs per SM as the registers and the
  shared memory allow (the lower is the occupancy);
* the MMA family in the PTX (``wgmma``, ``mma.sync``, both, none); ptxas' serialisation
  warnings (``C7515``: each ``wgmma`` waits for the previous one); ``copies``: the most warps
  computing the same accumulator element (2: the tile in two warpgroups);
* thread instructions and ``MUFU`` operations per tile element in the main loop (SASS; defined
  in ``kernel_build.py``) and the instructions' ratio to InfoNCE's, per product: the same pass
  of InfoNCE in the same form at the same architecture, precision and width (AMCL's pair
  kernels do two products per tile in the forward and four in the backward where InfoNCE does
  one and two, so their count is divided by their products first). ``target``: issue 52's
  bound for that ratio (``labels=`` 1.3, DySTreSS 1.6, AMCL's pair term 2.5) and whether the
  row meets it;
* the model's lower bound of the pass's clocks per tile element on one SM and the pipe that
  sets it (issue, the float32 FMA pipe, ``MUFU``, the tensor cores; ``kernel_model.py``), and
  the milliseconds that makes for one pass over 65,536 x 65,536 on an H200 (sm_90) or an A100
  (sm_80): the prediction a GPU run checks;
* the compile's seconds.

Usage (from the repository root; ``make kernel-report`` runs the first)::

    python -m benchmarks.kernel_report                       # everything: long (see the docs)
    python -m benchmarks.kernel_report --arch 90 --precision bf16 --width 128
    python -m benchmarks.kernel_report --kernel dq dk --json report.json

``--width`` selects the launches by their padded feature width; without ``--every-width`` only
the widest width of each block and layout the table distinguishes is compiled (narrower widths
of the same class compile to the same code but for the chunk's size).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchmarks.kernel_build import Compiled, Spec, compile_all
from benchmarks.kernel_model import clocks_per_element, milliseconds
from benchmarks.kernel_reach import ARCHS, PRECISIONS, reachable, width_classes

KERNELS = ("fwd", "dq", "dk", "bwd", "pair_fwd", "pair_dq", "pair_dk")
#: the rows and columns of the pass the model's time is for (issue 52's cross-view 65,536)
MODEL_ROWS = 65536


def target(spec: Spec) -> float | None:
    """Issue 52's bound on a launch's instructions per element and product against InfoNCE's
    (``None``: InfoNCE's own specialisation, or no bound)."""
    flags = dict(spec.flags)
    if spec.kernel.startswith("pair"):
        return 2.5
    if flags.get("TERM"):
        return 1.6
    if flags.get("HAS_LAB"):
        return 1.3
    return None


def ratio(result: Compiled, results: dict[Spec, Compiled]) -> float | None:
    """``result``'s instructions per element and product over its InfoNCE reference's."""
    ref = results.get(result.spec.reference) if result.spec.reference is not None else None
    if ref is None or not result.instructions_per_element or not ref.instructions_per_element:
        return None
    mine = result.instructions_per_element / max(1, len(result.dots))
    theirs = ref.instructions_per_element / max(1, len(ref.dots))
    return mine / theirs


def _number(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def rows(results: list[Compiled], everything: dict[Spec, Compiled]) -> list[dict]:
    """One JSON-able row per compile (module docstring)."""
    out = []
    for r in sorted(results, key=lambda r: (r.spec.arch, r.spec.precision, r.spec.width,
                                            KERNELS.index(r.spec.kernel), r.spec.flag_text())):
        s = r.spec
        ctas = r.ctas() if r.error is None else {}
        x = ratio(r, everything)
        bound = target(s)
        model = clocks_per_element(r)
        out.append({
            "kernel": s.kernel, "flags": s.flag_text(), "reached_by": s.reached_by,
            "arch": s.arch, "precision": s.precision, "width": s.width,
            "block": f"{s.block[0]}x{s.block[1]}/{s.warps}/{s.stages}",
            "registers": r.registers, "spill_bytes": r.spill_stores,
            "ctas_per_sm": ctas.get("ctas"), "ctas_by_registers": ctas.get("registers"),
            "ctas_by_shared": ctas.get("shared"), "mma": r.mma_family,
            "serialised": r.serialised, "copies": r.copies,
            "instructions_per_element": r.instructions_per_element,
            "ratio_to_infonce": x, "target": bound,
            "meets_target": None if bound is None or x is None else x <= bound,
            "mufu_per_element": r.mufu_per_element, "mufu": r.loop_mufu,
            "fp32_per_element": r.fp32_per_element, "flops_per_element": r.flops_per_element,
            "model_clocks_per_element": None if model is None else model.clocks,
            "model_pipe": None if model is None else model.pipe,
            "model_ms": None if model is None else milliseconds(model, s.arch, MODEL_ROWS,
                                                                 MODEL_ROWS),
            "nested_loops": r.loops, "products": len(r.dots), "warp_specialized":
            r.warp_specialized, "seconds": r.seconds, "error": r.error})
    return out


HEADER = ("| kernel | flags | reached by | sm | prec. | D | block/warps/stages | regs | spill B "
          "| CTAs/SM (regs, smem) | MMA | serialised | copies | instr/elem | x InfoNCE | target "
          "| MUFU/elem | MUFU ops | model clk/elem (pipe) | model ms | s |")


def markdown(table: list[dict]) -> str:
    columns = HEADER.count("|") - 1
    lines = [HEADER, "| " + " | ".join(["---"] * columns) + " |"]
    for row in table:
        if row["error"]:
            lines.append(f"| {row['kernel']} | {row['flags']} | {row['reached_by']} | "
                         f"{row['arch']} | {row['precision']} | {row['width']} | "
                         f"{row['block']} | compile error: {row['error'][:120]} |"
                         + " |" * (columns - 8))
            continue
        ctas = (f"{row['ctas_per_sm']} ({row['ctas_by_registers']}, {row['ctas_by_shared']})")
        bound = "" if row["target"] is None else (
            f"<= {row['target']} " + {True: "yes", False: "**no**", None: "?"}[
                row["meets_target"]])
        mufu = " ".join(f"{k} {v}" for k, v in sorted(row["mufu"].items())) or "-"
        nested = f" ({row['nested_loops']} inner)" if row["nested_loops"] else ""
        model = ("-" if row["model_clocks_per_element"] is None else
                 f"{row['model_clocks_per_element']:.3f} ({row['model_pipe']})")
        lines.append(
            f"| {row['kernel']} | {row['flags']} | {row['reached_by']} | {row['arch']} | "
            f"{row['precision']} | {row['width']} | {row['block']} | {row['registers']} | "
            f"{row['spill_bytes']} | {ctas} | {row['mma']} | "
            f"{', '.join(row['serialised']) or '-'} | {row['copies']} | "
            f"{_number(row['instructions_per_element'])}{nested} | "
            f"{_number(row['ratio_to_infonce'], 2)} | {bound} | "
            f"{_number(row['mufu_per_element'], 2)} | {mufu} | {model} | "
            f"{_number(row['model_ms'], 2)} | {row['seconds']:.1f} |")
    return "\n".join(lines)


def _flag_dict(text: str) -> dict[str, str]:
    return dict(part.split("=") for part in text.split(",")) if text else {}


def steps(table: list[dict]) -> str:
    """The model's step over 65,536 x 65,536, one per set of flags with its three split passes
    in ``table`` (``fwd``, ``dq``, ``dk``) at one architecture, precision and width: their
    milliseconds, the sum and its ratio to InfoNCE's step of the same masks (a markdown table;
    empty if no set has all three)."""
    by_key = {(r["arch"], r["precision"], r["width"], r["kernel"], r["flags"]): r
              for r in table if r["model_ms"] is not None}
    found = []
    for (arch, precision, width, kernel, flags), dq in by_key.items():
        if kernel != "dq":
            continue
        f = _flag_dict(flags)
        fwd_flags = ",".join(f"{k}={v}" for k, v in f.items() if k != "DETACH")
        fwd = by_key.get((arch, precision, width, "fwd", fwd_flags))
        dk = by_key.get((arch, precision, width, "dk", flags))
        if fwd is None or dk is None:
            continue
        found.append(((arch, precision, width, flags), fwd, dq, dk))
    if not found:
        return ""
    total = {key: fwd["model_ms"] + dq["model_ms"] + dk["model_ms"] for key, fwd, dq, dk in found}
    by_flags = {(a, p, w, frozenset(_flag_dict(f).items())): t for (a, p, w, f), t in total.items()}
    lines = [f"| sm | prec. | D | flags | reached by | fwd ms | dq ms | dk ms | step ms "
             f"({MODEL_ROWS:,}²) | x InfoNCE |", "| " + " | ".join(["---"] * 10) + " |"]
    for key, fwd, dq, dk in sorted(found, key=lambda x: x[0]):
        arch, precision, width, flags = key
        f = _flag_dict(flags)
        plain = {k: {"HAS_LAB": "0", "TERM": "0", "DETACH": "1"}.get(k, v) for k, v in f.items()}
        ref = by_flags.get((arch, precision, width, frozenset(plain.items())))
        x = "-" if ref is None else f"{total[key] / ref:.2f}"
        lines.append(f"| {arch} | {precision} | {width} | {flags} | {dq['reached_by']} | "
                     f"{fwd['model_ms']:.2f} | {dq['model_ms']:.2f} | {dk['model_ms']:.2f} | "
                     f"{total[key]:.2f} | {x} |")
    return "\n".join(lines)


def select(specs: tuple[Spec, ...], args: argparse.Namespace) -> list[Spec]:
    chosen = [s for s in specs if s.arch in args.arch and s.precision in args.precision
              and (args.width is None or s.width in args.width)
              and (args.kernel is None or s.kernel in args.kernel)]
    return chosen if args.every_width else width_classes(chosen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, nargs="+", choices=ARCHS, default=list(ARCHS))
    parser.add_argument("--precision", nargs="+", choices=tuple(PRECISIONS),
                        default=list(PRECISIONS))
    parser.add_argument("--width", type=int, nargs="+", default=None,
                        help="padded feature widths (powers of two from 16)")
    parser.add_argument("--kernel", nargs="+", choices=KERNELS, default=None)
    parser.add_argument("--every-width", action="store_true",
                        help="every width, not one per block and layout")
    parser.add_argument("--jobs", type=int, default=2, help="compiling processes")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    for width in args.width or ():
        if width < 16 or width & (width - 1):
            parser.error(f"--width {width}: a padded feature width is a power of two >= 16")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: at least 1")
    if args.json is not None and not args.json.parent.is_dir():
        parser.error(f"--json {args.json}: no folder {args.json.parent}")
    start = time.perf_counter()
    where = ["--arch", *map(str, args.arch), "--precision", *args.precision]
    if args.width:
        where += ["--width", *map(str, args.width)]
    specs = reachable(*where)
    enumerated = time.perf_counter() - start
    chosen = select(specs, args)
    references = [s.reference for s in chosen if s.reference is not None]
    todo = list(dict.fromkeys([*chosen, *references]))
    results = {r.spec: r for r in compile_all(todo, args.jobs)}
    table = rows([results[s] for s in chosen], results)
    print(markdown(table))
    step_table = steps(table)
    if step_table:
        print(f"\nThe model's step (lower bound, kernel_model.py):\n\n{step_table}")
    cpu = sum(r.cpu_seconds for r in results.values())
    print(f"\n{len(chosen)} launches ({len(todo)} compiles with their InfoNCE references) of "
          f"{len(specs)} reachable: enumerated in {enumerated:.0f} s, compiled in "
          f"{time.perf_counter() - start - enumerated:.0f} s on {args.jobs} processes "
          f"({cpu:.0f} CPU seconds), {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    if args.json is not None:
        args.json.write_text(json.dumps(table, indent=1) + "\n")
    return 1 if any(r.error for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
