"""The compile gate: the fused kernels compiled for sm_80 and sm_90 on this CPU, and their
structure asserted from what the compiler produced (issue 52).

Triton's interpreter (``interpreted_fused.py``) runs the kernels' values in NumPy and tolerates
what the GPU compiler refuses (the first GPU run found DySTreSS's kernel reading ``PI``, a
non-constexpr global). Here the launches the losses can make are enumerated by running them
(``benchmarks/kernel_reach.py``: every loss of the test table, form and option; nothing
hand-picked) and compiled with ``triton.compile`` for their GPU (``benchmarks/kernel_build.py``,
which also says how each quantity is read):

* every reachable (kernel, flags) set at sm_90, bf16 and fp16, 128 features, the widest of the
  resident widths, which all take the same block (:data:`benchmarks.kernel_reach.GATE_POINTS`);
* the covering set for the rest: one launch per distinct table cell (architecture, kernel,
  operand class, block, feature layout: sm_80, TF32, IEEE, the chunked and split widths), the
  reachable flag sets taking turns.

Asserted on every compile (one test each, so that a failure names what is wrong):

* it compiles; its shared memory fits the architecture's block (a launch over it fails);
* the products run on tensor cores for bf16, fp16 and TF32, not for IEEE; on sm_90 with
  ``wgmma`` only, no ``mma.sync`` (sm_80's instruction, a fraction of Hopper's rate), at
  every width up to :data:`WGMMA_WIDTH` (AMCL's pair backward up to
  :data:`PAIR_BACKWARD_WGMMA_WIDTH`, the docs say why);
* no spills on a tensor-core kernel up to :data:`NO_SPILL_WIDTH` features, at most
  :data:`SPILL_BYTES` elsewhere;
* no ptxas warning that ``wgmma`` instructions are serialised (C7515 and its kin);
* at most :data:`BACKWARD_WIDTH` features, ``dq`` and ``dk`` fit two CTAs per SM (one CTA's
  products and another's exps overlap), or are warp-specialised;
* no accumulator element is computed by two warps (the same tile in two warpgroups).

The compiles run in two processes; the fixture prints the report and the wall time (run
pytest with ``-s`` or ``-rP``). The whole table's report is
``python -m benchmarks.kernel_report`` (docs/large_batches.md).
"""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("triton", reason="the compile gate needs Triton")

from benchmarks.kernel_build import compile_all, compile_spec  # noqa: E402
from benchmarks.kernel_reach import GATE_POINTS, covering, reachable  # noqa: E402

#: the shared memory one block may take, by architecture (A100: 163 KiB, H100: 227 KiB)
SHARED = {80: 163 * 1024, 90: 227 * 1024}
SPILL_BYTES = 512
NO_SPILL_WIDTH = 256
WGMMA_WIDTH = 512
#: AMCL's pair backward beyond 256 features keeps every output in one 32-row program on
#: ``mma.sync`` (docs/large_batches.md, "AMCL's pair kernels": a 64-row wgmma tile cannot hold
#: both sides' 1,024 accumulator columns, and splitting the outputs recomputes each tile for 8
#: blocks: 815 SASS instructions per element against 226); up to 256 it is on wgmma
PAIR_BACKWARD_WGMMA_WIDTH = 256
BACKWARD_WIDTH = 128
JOBS = 2


def gate() -> list:
    """The gate's launches: every reachable one at the gate's points, a covering set
    elsewhere (module docstring)."""
    specs = reachable("--gate")
    full = [s for s in specs if (s.arch, s.precision, s.width) in GATE_POINTS]
    return full + covering(specs, covered=full)


@pytest.fixture(scope="module")
def compiled():
    from benchmarks.kernel_report import markdown, rows

    start = time.perf_counter()
    specs = gate()
    enumerated = time.perf_counter() - start
    results = compile_all(specs, jobs=JOBS, read_sass=False)
    print("\n" + markdown(rows(results, {})))
    cpu = sum(r.cpu_seconds for r in results)
    print(f"{len(results)} compiles: enumerated in {enumerated:.0f} s, compiled in "
          f"{time.perf_counter() - start - enumerated:.0f} s on {JOBS} processes ({cpu:.0f} CPU "
          f"seconds: {cpu / JOBS:.0f} s on {JOBS} idle cores; load {os.getloadavg()[0]:.1f})")
    return results


def _assert_none(compiled, bad) -> None:
    """Every compiled launch for which ``bad(result)`` says what is wrong, or none."""
    found = [f"{r.spec.name()} {r.spec.block}: {why}" for r in compiled
             if r.error is None and (why := bad(r))]
    assert not found, f"{len(found)} of {len(compiled)} launches:\n" + "\n".join(found)


@pytest.mark.slow
def test_the_gate_compiles_every_reachable_set_at_its_points_and_covers_the_table():
    specs = gate()
    reached = reachable("--gate")
    for point in GATE_POINTS:
        sets = {(s.kernel, s.flags) for s in reached}
        here = {(s.kernel, s.flags) for s in specs if (s.arch, s.precision, s.width) == point}
        assert here == sets, (point, sets - here)
    cells = {(s.arch, s.kernel, s.operands, s.block) for s in reached}
    assert cells == {(s.arch, s.kernel, s.operands, s.block) for s in specs}
    assert {s.precision for s in specs} == {"bf16", "fp16", "tf32", "ieee"}
    assert {s.arch for s in specs} == {80, 90}


@pytest.mark.slow
def test_every_launch_compiles_and_fits_its_shared_memory(compiled):
    errors = [f"{r.spec.name()}: {r.error}" for r in compiled if r.error]
    assert not errors, "\n".join(errors)
    _assert_none(compiled, lambda r: (r.shared is None or r.shared > SHARED[r.spec.arch])
                 and f"{r.shared} bytes of shared memory (at most {SHARED[r.spec.arch]})")


def _tensor_cores(r) -> str | None:
    family = r.mma_family
    if r.spec.precision == "ieee":
        return family != "none" and f"IEEE products on tensor cores ({family})"
    if family == "none":
        return "no tensor-core instruction in its PTX"
    widest = (PAIR_BACKWARD_WGMMA_WIDTH if r.spec.kernel in ("pair_dq", "pair_dk")
              else WGMMA_WIDTH)
    if r.spec.arch == 90 and r.spec.width <= widest and family != "wgmma":
        return f"{family} on sm_90 ({r.mma_sync} mma.sync)"
    return None


@pytest.mark.slow
def test_tensor_cores_and_on_sm90_wgmma_only(compiled):
    _assert_none(compiled, _tensor_cores)


def _spills(r) -> str | None:
    if r.spill_stores is None:
        return "no ptxas report"
    main = r.spec.width <= NO_SPILL_WIDTH and r.spec.precision != "ieee"
    bound = 0 if main else SPILL_BYTES
    return r.spill_stores > bound and (f"{r.spill_stores} bytes spilled at {r.registers} "
                                       f"registers (at most {bound})")


@pytest.mark.slow
def test_no_spills_on_the_tensor_core_paths(compiled):
    _assert_none(compiled, _spills)


@pytest.mark.slow
def test_no_serialised_wgmma(compiled):
    _assert_none(compiled, lambda r: r.serialised and "ptxas: " + "; ".join(
        f"({code}) {r.messages[code]}" for code in r.serialised))


def _backward_overlap(r) -> str | None:
    if r.spec.kernel not in ("dq", "dk") or r.spec.width > BACKWARD_WIDTH:
        return None
    ctas = r.ctas()
    return (ctas["ctas"] < 2 and not r.warp_specialized
            and f"{ctas['ctas']} CTA per SM (registers allow {ctas['registers']}, shared "
                f"memory {ctas['shared']}) and no warp specialisation")


@pytest.mark.slow
def test_the_backward_fits_two_ctas_per_sm(compiled):
    _assert_none(compiled, _backward_overlap)


@pytest.mark.slow
def test_no_tile_computed_twice(compiled):
    _assert_none(compiled, lambda r: r.copies > 1 and "; ".join(
        f"a {d.shape[0]}x{d.shape[1]} dot on warps {list(d.warps)} of "
        f"{d.instr[0]}x{d.instr[1]}: each element {d.copies} times" for d in r.dots
        if d.copies > 1))


@pytest.mark.slow
def test_a_non_constexpr_global_fails_the_gate(monkeypatch, tmp_path):
    """The first GPU run's failure (``PI`` as a plain float), put back with the term's
    polynomial's first coefficient. The interpreter runs it; the gate must not."""
    from adaptcl.plugins.tiles import _triton_rowstats

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_triton_rowstats, "E0", _triton_rowstats.E0.value)
    spec = next(s for s in reachable("--gate") if s.kernel == "dq" and s.arch == 90
                and dict(s.flags).get("TERM") == 1 and not dict(s.flags).get("DETACH"))
    result = compile_spec(spec, read_sass=False)
    assert result.error is not None and "E0" in result.error, result
