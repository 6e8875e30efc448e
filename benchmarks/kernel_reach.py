"""The fused kernels' reachable specialisations: every launch the dispatcher can make, found by
running the losses, not listed by hand.

**What runs.** Every loss of the test table (``tests/plugins/_helpers.LOSSES``: each loss of
``adaptcl.plugins`` in the configurations the tests use) that takes two views and a tile size,
expanded over

* every value of its class's choice options, the keywords of its constructor typed as a
  ``Literal`` or a ``bool`` (``form``, ``shape``, ``detach_temperature``, ``reweight``,
  ``hardness_mode``, ...; not the shared ``tile_size``, ``reduction``, ``check_finite``,
  ``gather_distributed``, which choose how, not what, the loss computes), in their full
  product, so options that interact are crossed;
* the options of the call: multi-positive ``labels`` (where the class takes them), a bank of
  extra negatives (and the bank's labels), a batch gathered over two ranks (one process, as
  the interpreted tests do);
* both backward passes: the split default and ``tiling(backward="onepass")``.

A new loss in the table, a new choice option or value in a constructor's signature, a new
constexpr the launcher passes: each joins by itself.

**How.** Each configuration runs a forward and a backward under ``tiling(backend="triton")``
with :data:`adaptcl.plugins.tiles._fused.launch_observer` set: every launch is recorded (the
kernel, the types of its arguments, its constexprs, the table's block) and skipped, so
nothing is computed. That is sound because what is launched never depends on what a launch
computed: the dispatcher plans from shapes, dtypes and devices (it reads no tensor value, so
that nothing synchronises with the GPU), the launcher derives the constexprs from the loss's
typed description of its math, and the backward's launches follow autograd's graph, which the
forward builds from the same. ``tests/plugins/test_kernel_reach.py`` checks it: the
interpreter's real run of the table's cases records exactly the launches recorded without
running them. ``_configs.arch_of`` answers the architecture asked for (sm_80, sm_90), so the
launches are those a GPU of that architecture makes: its table's blocks, layouts and width
limits.

Two stages: every configuration at one point (sm_90, IEEE products, 8 features) finds every
distinct set of launches; then one configuration per set runs at every architecture (sm_80,
sm_90), precision (bf16, fp16, TF32, IEEE) and padded width of the table (16 to 2,048), for
the launches a GPU makes there (the gate's variant: every one at sm_90, bf16 and fp16, 128
features, and elsewhere they take turns). A constexpr whose value changes with the precision
or width (``PRECISION``, the feature chunking) is layout; the others are the launch's flags.

It runs in a fresh process with ``TRITON_INTERPRET=1`` (on CPU tensors the dispatcher takes
the kernel only under the interpreter): :func:`reachable` starts it and returns the launches
as :class:`~benchmarks.kernel_build.Spec`; ``python -m benchmarks.kernel_reach`` prints a
summary.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import itertools
import json
import os
import re
import subprocess
import sys
import time
import typing
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import UnionType

from benchmarks.kernel_build import Spec

ROOT = Path(__file__).resolve().parents[1]
#: the shared keywords, which choose how the loss computes, not what
SHARED = ("tile_size", "reduction", "check_finite", "gather_distributed", "gather_fn")
ARCHS = (80, 90)
#: each product precision: PyTorch's float32 matmul setting and the inputs' dtype selecting it
PRECISIONS = {"bf16": ("highest", "bfloat16"), "fp16": ("highest", "float16"),
              "tf32": ("high", "float32"), "ieee": ("highest", "float32")}
#: the first stage's point: architecture, precision, feature width
REFERENCE = (90, "ieee", 8)
#: a point that differs from it in precision and in every feature layout constexpr: what
#: changes between the two is layout, not the loss's flags
PROBE = (90, "bf16", 256)
ROWS, BANK, TEMPERATURE = 4, 3, 0.2
#: the loop-free launch parameters: the block's, not the loss's nor the layout's
BLOCK = ("BM", "BN")
#: the dispatcher's refusal under ``tiling(backend="triton")``: the loss, then why
_REFUSED = re.compile(r"tiling\(backend='triton'\) cannot run (?P<method>.+?) here: (?P<why>.+?); use ")


@dataclass(frozen=True)
class Configuration:
    """One loss configuration: the table's case and a value of every axis (its class's choice
    options and the call's options), as ``(axis, value)`` pairs."""

    case: str
    values: tuple[tuple[str, object], ...]

    def get(self, axis: str, default=None):
        return dict(self.values).get(axis, default)

    def but(self, **changes) -> Configuration:
        return Configuration(self.case, tuple(sorted({**dict(self.values), **changes}.items())))

    def text(self) -> str:
        base = dict(base_configuration(self.case).values)
        changed = [f"{k}={v}" for k, v in self.values if base.get(k) != v]
        return " ".join([self.case, *changed])


@dataclass
class Outcome:
    """What a configuration launched (per launch: ``(kernel name, function, signature,
    constexprs, warps, stages, precision, width)``), or why it did not."""

    launches: list[tuple] = field(default_factory=list)
    refused: str | None = None
    invalid: str | None = None


# --------------------------------------------------------------------------------------------
# The configurations
# --------------------------------------------------------------------------------------------

#: the call's options: multi-positive labels, a bank of extra negatives, the bank's labels, a
#: batch gathered over two ranks
CALL_AXES = ("labels", "bank", "bank_labels", "gather")


def _cases(cases: list[str] | None = None) -> list[str]:
    """The table's cases that take two views and a tile size (``cases`` only, if given)."""
    from tests.plugins._helpers import LOSSES

    return [name for name, case in LOSSES.items()
            if case.tileable and case.kind in ("pair", "queue")
            and (cases is None or name in cases)]


def _spec(case: str, dim: int):
    from tests.plugins._helpers import LOSSES

    return LOSSES[case].spec(TEMPERATURE, dim)


def _choices(cls) -> dict[str, tuple]:
    """The choice options of ``cls``'s constructor: each ``Literal`` / ``bool`` keyword but the
    shared ones, with every value (``None`` too where the type allows it)."""
    hints = typing.get_type_hints(cls.__init__)
    out = {}
    for name in inspect.signature(cls.__init__).parameters:
        hint = hints.get(name)
        if name in SHARED or hint is None:
            continue
        if hint is bool:
            out[name] = (False, True)
            continue
        members = (typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, UnionType)
                   else (hint,))
        values = tuple(v for m in members if typing.get_origin(m) is typing.Literal
                       for v in typing.get_args(m))
        if values:
            out[name] = values + ((None,) if type(None) in members else ())
    return out


def axes(case: str) -> dict[str, tuple]:
    """Every axis of a case and its values: the class's choice options, then the call's."""
    from tests.plugins._helpers import LOSSES

    cls, _, _ = _spec(case, REFERENCE[2])
    out = _choices(cls)
    out["labels"] = (False, True) if getattr(cls, "takes_labels", False) else (False,)
    out["bank"] = out["bank_labels"] = (False, True)
    out["gather"] = (False, True) if LOSSES[case].shared else (False,)
    return out


@functools.cache
def base_configuration(case: str) -> Configuration:
    """The case as the table configures it (a choice it does not set at its default), called
    with two views (and a bank for the queue form)."""
    cls, _, kwargs = _spec(case, REFERENCE[2])
    defaults = {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()}
    values = {name: kwargs.get(name, defaults[name]) for name in _choices(cls)}
    values |= {"labels": False, "bank": False, "bank_labels": False, "gather": False}
    return _normalised(Configuration(case, tuple(sorted(values.items()))))


def _normalised(config: Configuration) -> Configuration:
    """The queue form always has its bank; the bank's labels need labels and a bank."""
    bank = config.get("bank") or config.get("form") == "queue"
    return config.but(bank=bank, bank_labels=bool(config.get("bank_labels") and bank
                                                   and config.get("labels")))


def first_stage(cases: list[str] | None = None, launch=None) -> dict[Configuration, Outcome]:
    """Every configuration the first stage runs, with what it launched: each case, each of
    its axes' values one at a time, and then the full product of every axis that added a
    launch on its own at some case of the class (the others at each case's value).
    ``launch(config)`` runs one (default: :func:`run` at :data:`REFERENCE`)."""
    launch = launch or (lambda config: run(config, *REFERENCE))
    outcomes: dict[Configuration, Outcome] = {}

    def get(config: Configuration) -> Outcome:
        config = _normalised(config)
        if config not in outcomes:
            outcomes[config] = launch(config)
        return outcomes[config]

    relevant: dict[type, set[str]] = {}
    names = _cases(cases)
    for case in names:
        base = base_configuration(case)
        seen = set(get(base).launches)
        cls = _spec(case, REFERENCE[2])[0]
        for axis, values in axes(case).items():
            for value in values:
                if not set(get(base.but(**{axis: value})).launches) <= seen:
                    relevant.setdefault(cls, set()).add(axis)
    for case in names:
        cls = _spec(case, REFERENCE[2])[0]
        crossed = {a: v for a, v in axes(case).items() if a in relevant.get(cls, ())}
        for values in itertools.product(*crossed.values()):
            get(base_configuration(case).but(**dict(zip(crossed, values, strict=True))))
    return outcomes


def _two_rank_gather(x):
    """A gradient-carrying gather over two ranks in one process: this rank's rows and another
    rank's built from them."""
    return [x, x.flip(0) * 0.5 + 0.25]


# --------------------------------------------------------------------------------------------
# Running one (in the interpreter's process)
# --------------------------------------------------------------------------------------------


def _signature_type(value) -> str:
    """Triton's signature type of a launch argument, as its launcher specialises it."""
    import torch

    if isinstance(value, torch.Tensor):
        return "*" + {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
                      torch.float64: "fp64", torch.int64: "i64", torch.int32: "i32",
                      torch.bool: "i1"}[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"the kernel report cannot type a launch argument of {type(value).__name__} "
                    f"(benchmarks/kernel_reach.py: _signature_type)")


def _observer(record: list, skip: bool):
    def observe(kernel, name, args, meta, block, precision, width):
        fn = getattr(kernel, "fn", kernel)
        if isinstance(args, dict):  # launched with keywords
            runtime = [(n, args[n]) for n in kernel.arg_names if n in args]
        else:  # positional: they bind to the first parameters (the constexprs are keywords)
            runtime = list(zip(kernel.arg_names[:len(args)], args, strict=True))
        signature = tuple((n, _signature_type(a)) for n, a in runtime)
        constexprs = tuple(sorted({**meta, "BM": block.bm, "BN": block.bn}.items()))
        record.append((name, f"{fn.__module__}:{fn.__name__}", signature, constexprs,
                       block.warps, block.stages, precision, width))
        return skip
    return observe


def run(config: Configuration, arch: int | None, precision: str, dim: int, *,
        execute: bool = False) -> Outcome:
    """The launches of ``config`` at ``arch`` (``_configs.arch_of`` answers it; ``None``: the
    tensors' own, the interpreter's), ``precision`` and ``dim`` features: recorded and
    skipped, or with ``execute`` recorded and run (by the interpreter, whose blocks it must
    then be at: ``arch=None``)."""
    import torch

    from adaptcl.plugins import tiling
    from adaptcl.plugins.execution import BACKWARDS
    from adaptcl.plugins.tiles import _configs, _fused

    setting, dtype = PRECISIONS[precision]
    cls, args, kwargs = _spec(config.case, dim)
    values = dict(config.values)
    options = {**kwargs, **{k: v for k, v in values.items() if k not in CALL_AXES},
               "tile_size": "auto"}  # the kernel's way in (an int is the loop's tile)
    if values["gather"]:
        options["gather_fn"] = _two_rank_gather
    g = torch.Generator().manual_seed(0)
    views = [torch.randn(ROWS, dim, generator=g).to(getattr(torch, dtype)) for _ in range(2)]
    call = {}
    if values["bank"]:
        views.append(torch.randn(BANK, dim, generator=g).to(getattr(torch, dtype)))
    if values["labels"]:
        call["labels"] = torch.tensor([0, 1, 0, 1])
    if values["bank_labels"]:
        call["negative_labels"] = torch.tensor([-1, 0, 1])
    record: list = []
    saved = (_fused.launch_observer, _configs.arch_of, torch.get_float32_matmul_precision())
    _fused.launch_observer = _observer(record, skip=not execute)
    if arch is not None:
        _configs.arch_of = lambda device: f"sm_{arch}"
    torch.set_float32_matmul_precision(setting)
    try:
        try:
            loss = cls(*args, **options)
        except (TypeError, ValueError) as error:
            return Outcome(invalid=f"{type(error).__name__}: {error}")
        leaves = [v.clone().requires_grad_() for v in views]
        params = [p for p in loss.parameters() if p.requires_grad]
        # float32 products follow the matmul precision on the CPU as on CUDA only where the
        # tensor cores are emulated
        with tiling(backend="triton", emulate_tensor_cores=True):
            try:
                value = loss(*leaves, **call)
            except (TypeError, ValueError) as error:
                refused = _REFUSED.match(str(error))
                if refused:
                    return Outcome(refused=refused["why"])
                return Outcome(invalid=f"{type(error).__name__}: {error}")
            if value.requires_grad:
                for backward in BACKWARDS:
                    with tiling(backward=backward):
                        torch.autograd.grad(value, leaves + params, retain_graph=True,
                                            allow_unused=True)
    finally:
        _fused.launch_observer, _configs.arch_of = saved[0], saved[1]
        torch.set_float32_matmul_precision(saved[2])
    return Outcome(launches=record)


#: where the gate compiles every reachable set (the rest it covers): sm_90, bf16 and fp16, 128
#: features (the widest of the table's resident widths, which share one block)
GATE_POINTS = ((90, "bf16", 128), (90, "fp16", 128))


def points(full: bool, archs=ARCHS, precisions=tuple(PRECISIONS), widths=None
           ) -> tuple[list[tuple], list[tuple]]:
    """The second stage's ``(arch, precision, width)`` points: where every representative runs,
    and where they take turns (one of each kind of kernel set per point). ``full``: every
    representative at each of ``archs`` x ``precisions`` x ``widths`` (default: the table's
    widths; the report); else every one at :data:`GATE_POINTS`, turns elsewhere (the gate)."""
    from adaptcl.plugins.tiles import _configs

    every = list(itertools.product(archs, precisions, widths or _configs.WIDTHS))
    if full:
        return every, []
    return list(GATE_POINTS), [p for p in every if p not in GATE_POINTS]


def layout_keys(first: dict[frozenset, Configuration], launch) -> set[str]:
    """The constexprs that follow from the precision and the width (the layout), not from the
    loss: those whose value differs between a representative's launches at the first stage's
    point (``first``'s keys) and at :data:`PROBE` (``launch(config)``'s)."""
    keys = set()
    for launches, config in first.items():
        here = {name: dict(constexprs) for name, _f, _s, constexprs, *_ in launches}
        for name, _f, _s, constexprs, *_ in launch(config):
            there = dict(constexprs)
            keys |= {k for k in here.get(name, {}) if there.get(k) != here[name][k]}
    return keys


def enumerate_launches(cases: list[str] | None = None, full: bool = True, **where) -> dict:
    """The two stages (module docstring), in this process (which must interpret): a JSON-able
    ``{"launches": [...], "configurations": n, "refused": {reason: n}, "invalid": n,
    "representatives": [...], "seconds": s}``."""
    import torch

    # tiny tensors: one thread (with two, each elementwise op waits on the other thread)
    torch.set_num_threads(1)
    start = time.perf_counter()
    outcomes = first_stage(cases)
    first: dict[frozenset, Configuration] = {}
    refused: dict[str, int] = {}
    for config, outcome in outcomes.items():
        if outcome.refused:
            refused[outcome.refused] = refused.get(outcome.refused, 0) + 1
        elif outcome.launches:
            first.setdefault(frozenset(outcome.launches), config)
    stage_one = time.perf_counter() - start
    reps = list(first.values())
    references = {}
    for config in reps:  # InfoNCE in the same form, called alike (no labels), as it ran
        infonce = base_configuration("infonce").but(
            form=config.get("form", "nt_xent"), bank=config.get("bank"),
            gather=config.get("gather"))
        outcome = outcomes.get(_normalised(infonce)) or run(_normalised(infonce), *REFERENCE)
        same = first.get(frozenset(outcome.launches))
        if same is not None:
            references[config.text()] = same.text()
    layout = layout_keys(first, lambda config: run(config, *PROBE).launches)
    kinds: dict[frozenset, list[Configuration]] = {}
    for launches, config in first.items():
        kinds.setdefault(frozenset(x[0] for x in launches), []).append(config)
    everywhere, turns = points(full, **where)
    runs = [(config, p) for p in everywhere for config in reps]
    runs += [(group[n % len(group)], p) for n, p in enumerate(turns) for group in kinds.values()]
    launches = {}
    for config, (arch, precision, width) in runs:
        for launch in run(config, arch, precision, width).launches:
            launches.setdefault((arch, *launch), config.text())
    return {"launches": [[*key, text] for key, text in launches.items()],
            "layout": sorted(layout), "references": references, "configurations": len(outcomes), "refused": refused,
            "invalid": sum(1 for o in outcomes.values() if o.invalid),
            "representatives": [c.text() for c in reps], "second_stage_runs": len(runs),
            "seconds": time.perf_counter() - start, "first_stage_seconds": stage_one}


# --------------------------------------------------------------------------------------------
# From another process
# --------------------------------------------------------------------------------------------


def _interpreted_env() -> dict[str, str]:
    return {**os.environ, "TRITON_INTERPRET": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT),
                                           os.environ.get("PYTHONPATH", "")])}


def enumerate_in_subprocess(args: list[str] = (), prelude: str = "") -> dict:
    """:func:`enumerate_launches` in a fresh interpreting process (``args``: this module's
    command line; ``prelude``: Python run there first, a test's patch)."""
    code = (f"{prelude}\nimport sys\nfrom benchmarks.kernel_reach import main\n"
            f"main(['--json', *sys.argv[1:]])")
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=_interpreted_env(),
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"the enumeration failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout)


def specs_of(result: dict) -> list[Spec]:
    """The launches of an enumeration's result as compile specs (each with the configuration
    that reached it and its InfoNCE reference where that was enumerated too); their flags are
    their constexprs but the block and the layout (:func:`layout_keys`)."""
    from adaptcl.plugins.tiles import _configs

    launches = [tuple(x) for x in result["launches"]]
    layout = set(result["layout"]) | set(BLOCK)
    specs = {}
    for arch, name, function, signature, constexprs, warps, stages, precision, width, config \
            in launches:
        constexprs = tuple((k, v) for k, v in constexprs)
        spec = Spec(arch, name, precision, min(_configs.padded(width), _configs.WIDTHS[-1]),
                    tuple((k, v) for k, v in constexprs if k not in layout), function,
                    tuple((n, t) for n, t in signature), constexprs, warps, stages,
                    reached_by=config)
        specs.setdefault(spec, spec)
    by_point = {(s.arch, s.precision, s.width, s.kernel, s.reached_by): s for s in specs}
    out = []
    for spec in specs:
        ref = result["references"].get(spec.reached_by)
        kernel = spec.kernel.removeprefix("pair_")
        reference = by_point.get((spec.arch, spec.precision, spec.width, kernel, ref))
        out.append(replace(spec, reference=reference))
    return out


def width_classes(specs: list[Spec]) -> list[Spec]:
    """Of the launches of one kernel, architecture, precision and flags, the widest of each
    (block, feature layout) the table distinguishes: widths that share both compile to the
    same code but for the chunk's size."""
    widest: dict[tuple, Spec] = {}
    for spec in specs:
        key = (spec.arch, spec.kernel, spec.precision, spec.flags, spec.block, layout(spec))
        if key not in widest or spec.width > widest[key].width:
            widest[key] = spec
    return list(widest.values())


def layout(spec: Spec) -> tuple[str, ...]:
    """The feature layout of each operand pair of a launch: ``resident`` (one chunk kept in
    registers), ``chunked`` (several chunks, the backward's output whole) or ``split`` (the
    backward's output in parts)."""
    c = dict(spec.constexprs)
    kinds = []
    for chunk, chunks, output in (("BK", "KCH", "BDO"), ("BP", "PCH", "BPO")):
        if chunks in c:
            kinds.append("resident" if c[chunks] == 1 else
                         "chunked" if c.get(output, c[chunk] * c[chunks]) >= c[chunk] * c[chunks]
                         else "split")
    return tuple(kinds)


def covering(specs: list[Spec], covered: list[Spec] = ()) -> list[Spec]:
    """One launch per distinct table cell (architecture, kernel, operand class, block,
    feature layout) that ``covered`` does not hold, at the widest width of the cell, the
    reachable flag sets taking turns over the cells of each kernel."""
    def cell(s: Spec) -> tuple:
        return (s.arch, s.kernel, s.operands, s.block, layout(s))

    done = {cell(s) for s in covered}
    cells: dict[tuple, list[Spec]] = {}
    for spec in specs:
        if cell(spec) not in done:
            cells.setdefault(cell(spec), []).append(spec)
    turn: dict[str, int] = {}
    out = []
    for key in sorted(cells, key=str):
        widest = max(s.width for s in cells[key])
        options = sorted((s for s in cells[key] if s.width == widest), key=lambda s: s.name())
        n = turn.get(key[1], 0)
        turn[key[1]] = n + 1
        out.append(options[n % len(options)])
    return out


@functools.cache
def reachable(*args: str) -> tuple[Spec, ...]:
    """Every reachable launch (module docstring), enumerated once per process and command
    line ``args`` (this module's: ``"--gate"``, ``"--arch", "90"``, ...)."""
    return tuple(specs_of(enumerate_in_subprocess(list(args))))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the raw result as JSON")
    parser.add_argument("--cases", nargs="+", default=None,
                        help="only these cases of the test table")
    parser.add_argument("--gate", action="store_true",
                        help="the second stage at the gate's points (module docstring)")
    parser.add_argument("--arch", type=int, nargs="+", choices=ARCHS, default=ARCHS)
    parser.add_argument("--precision", nargs="+", choices=tuple(PRECISIONS),
                        default=tuple(PRECISIONS))
    parser.add_argument("--width", type=int, nargs="+", default=None,
                        help="the second stage at these feature widths (default: the table's)")
    args = parser.parse_args(argv)
    from adaptcl.plugins.tiles import _fused

    if not _fused.interpreting():
        result = enumerate_in_subprocess([a for a in (argv or sys.argv[1:]) if a != "--json"])
    else:
        result = enumerate_launches(args.cases, full=not args.gate, archs=tuple(args.arch),
                                    precisions=tuple(args.precision), widths=args.width)
    if args.json:
        print(json.dumps(result))
        return
    specs = specs_of(result)
    sets = sorted({(s.kernel, s.flags) for s in specs}, key=str)
    print(f"{result['configurations']} configurations ({result['first_stage_seconds']:.1f} s), "
          f"{result['second_stage_runs']} runs of the second stage ({result['seconds']:.1f} s in "
          f"all): "
          f"{len(result['representatives'])} distinct launch sets, "
          f"{sum(result['refused'].values())} refused, {result['invalid']} invalid")
    for reason, n in sorted(result["refused"].items()):
        print(f"  refused {n:5d}: {reason}")
    print(f"{len(sets)} reachable (kernel, flags) sets, {len(specs)} launches over "
          f"architectures, precisions and widths:")
    for kernel, flags in sets:
        print(f"  {kernel:<9} " + ",".join(f"{k}={int(v) if isinstance(v, bool) else v}"
                                          for k, v in flags))


if __name__ == "__main__":
    main()
