"""Mutation testing of ``src/adaptcl/plugins`` against ``tests/plugins`` with mutmut 3
(``make mutate``; how to read the report: docs/mutation.md).

mutmut copies ``src/`` and the tests into ``mutants/`` (configuration: ``[mutmut]`` in
``setup.cfg``), rewrites every function of the loss core into trampolines that switch between
the original and its mutants, records once which tests reach which function, and then runs for
each mutant only those tests (``pytest -x``, in a forked process). A mutant is *killed* when a
test fails, *survived* when all pass, *no tests* when no test reaches its function.

This driver adds two things mutmut lacks:

* a reproducible random sample (``--sample N --seed S``) for a run that fits a small machine
  (all mutants with ``--sample 0``);
* the score without the equivalent mutants listed in ``tools/mutmut_equivalent.txt`` (one
  ``name  reason`` per line: mutants with no observable change), with a 95% Wilson interval
  when sampled, written to ``mutants/report.md`` with the diff of every surviving mutant.

Usage::

    python tools/mutate.py --sample 300 --seed 2026 --max-children 2
    python tools/mutate.py --resume             # after adding tests: rerun what was not killed
    python tools/mutate.py --report-only        # re-read the results of the last run
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import random
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT = ROOT / "tools" / "mutmut_equivalent.txt"
REPORT = ROOT / "mutants" / "report.md"


def _import_mutmut():
    extra = os.environ.get("MUTMUT_PATH")  # a --target install kept out of the project's venv
    if extra:
        sys.path.append(extra)
    try:
        import mutmut  # noqa: F401
    except ImportError:
        sys.exit("mutmut is not installed: pip install 'mutmut>=3.8,<4' (or the `mutate` extra)")


def generate() -> list[str]:
    """Copy and mutate the sources (mutmut's own first step); return every mutant's name."""
    from mutmut.__main__ import create_mutants
    from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir, setup_source_paths

    Path("mutants").mkdir(exist_ok=True)
    copy_src_dir()
    copy_also_copy_files()
    setup_source_paths()
    create_mutants(2)
    return sorted(name for _, name, _ in _results())


def _results():
    """``(file, mutant name, exit code or None)`` of every generated mutant."""
    for meta in sorted(glob.glob("mutants/src/adaptcl/plugins/*.py.meta")):
        with open(meta) as f:
            codes = json.load(f)["exit_code_by_key"]
        for name, code in codes.items():
            yield Path(meta).name.removesuffix(".meta"), name, code


def equivalent() -> dict[str, str]:
    out = {}
    for line in EQUIVALENT.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, reason = line.partition(" ")
            out[name] = reason.strip()
    return out


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def report(names: list[str], total: int, seed: int | None) -> float:
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    chosen = set(names)
    equiv = equivalent()
    rows = [(f, n, status_by_exit_code[c]) for f, n, c in _results() if n in chosen]
    counted = [(f, n, s) for f, n, s in rows if n not in equiv and s != "not checked"]
    killed = sum(s in ("killed", "timeout", "caught by type check", "segfault")
                 for _, _, s in counted)
    score = killed / len(counted) if counted else 0.0
    lo, hi = wilson(killed, len(counted))
    lines = ["# Mutation testing of src/adaptcl/plugins", ""]
    sample = (f"random sample of {len(names)} of {total} mutants (seed {seed})"
              if seed is not None else f"all {len(names)} mutants")
    lines += [f"- mutants: {sample}",
              f"- equivalent (listed in tools/mutmut_equivalent.txt, not counted): "
              f"{sum(n in equiv for _, n, _ in rows)}",
              f"- not checked: {sum(s == 'not checked' for _, _, s in rows)}",
              f"- counted: {len(counted)}, killed: {killed}",
              f"- **score: {100 * score:.1f}%** (95% Wilson interval {100 * lo:.1f}-{100 * hi:.1f}%)",
              "", "| status | count |", "| --- | --- |"]
    lines += [f"| {s} | {c} |" for s, c in sorted(Counter(s for _, _, s in rows).items())]
    lines += ["", "| file | counted | killed |", "| --- | --- | --- |"]
    for f in sorted({f for f, _, _ in counted}):
        mine = [s for g, _, s in counted if g == f]
        lines.append(f"| {f} | {len(mine)} | {sum(s in ('killed', 'timeout') for s in mine)} |")
    lines += ["", "## Not killed (equivalent ones marked)", ""]
    for f, n, s in rows:
        if s in ("killed", "timeout"):
            continue
        tag = f" (equivalent: {equiv[n]})" if n in equiv else ""
        lines += [f"### {n}: {s}{tag}", "", "```diff",
                  get_diff_for_mutant(n, path=Path("src/adaptcl/plugins") / f).strip(), "```", ""]
    REPORT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:12]))
    print(f"full report: {REPORT}")
    return score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=300, help="mutants to run (0: all)")
    parser.add_argument("--seed", type=int, default=2026, help="seed of the random sample")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--resume", action="store_true",
                        help="keep the last sample (mutants/sample.txt) and rerun only its "
                             "mutants that were not killed (new tests cannot revive a killed "
                             "one; mutants of a changed function are regenerated, unchecked)")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    os.chdir(ROOT)
    _import_mutmut()
    names = generate()
    total = len(names)
    sample_file = Path("mutants/sample.txt")
    seed, drawn_from = args.seed, total
    if (args.resume or args.report_only) and sample_file.exists():
        existing = set(names)
        header, *kept = sample_file.read_text().split("\n")
        _, seed, drawn_from = (int(v) if v.isdigit() else v for v in header.split())
        names = [n for n in kept if n in existing]
    elif args.sample and args.sample < total:
        names = sorted(random.Random(args.seed).sample(names, args.sample))
    else:
        seed = None
    # first line: "# <seed> <number of mutants the sample was drawn from>"
    sample_file.write_text(f"# {seed} {drawn_from}\n" + "\n".join(names) + "\n")
    to_run = names
    if args.resume:
        from mutmut.stats import status_by_exit_code

        done = {n for _, n, c in _results() if status_by_exit_code[c] in ("killed", "timeout")}
        to_run = [n for n in names if n not in done]
        print(f"resuming: {len(to_run)} of the {len(names)} sampled mutants to run")
    if not args.report_only and to_run:
        from mutmut.__main__ import cli

        try:
            cli.main(["run", "--max-children", str(args.max_children), *to_run],
                     standalone_mode=False)
        except SystemExit as e:
            if e.code:
                raise
    report(names, drawn_from, seed if isinstance(seed, int) else None)


if __name__ == "__main__":
    main()
