"""The compile gate: the fused kernels compiled for sm_80 and sm_90 on this CPU.

Triton's interpreter (``interpreted_fused.py``) runs the kernels' values in NumPy and tolerates
what the GPU compiler refuses: the first GPU run found DySTreSS's kernel reading ``PI``, a
non-constexpr global, which the interpreter accepted and CUDA did not compile. Here every kernel
goes through ``triton.compile`` for each architecture (PTX, then a cubin from Triton's bundled
``ptxas``; no GPU needed), over a covering set (:data:`GATE`) in which each term (none,
cosine, piecewise), each flag (the positive and self masks, labels, a detached temperature),
each pair kernel with each squash, the one-pass backward and each precision (bf16, fp16, TF32,
IEEE) appears, at the feature widths of the issue's targets (128, 512) and with the backward's
output split (2,048), each with the block the fixed table chooses. The test asserts that:

* everything compiles;
* the PTX multiplies on tensor cores (``mma.sync`` on sm_80, ``wgmma`` on sm_90) for bf16, fp16
  and TF32 and not for IEEE;
* the shared memory fits the architecture (a launch over it fails);
* no register spills on the main path (up to width 128, on tensor cores), and at most
  :data:`SPILL_BYTES` elsewhere (a spill goes to local memory through L1: a few hundred bytes
  in the wide layouts, or in the IEEE kernels on the CUDA cores, cost little next to their
  products).

It prints the compiler's report (registers, spills, shared memory, compile seconds; run pytest
with ``-s`` or ``-rP``). The whole table's sweep (every entry) is
``python -m tests.plugins._kernel_specs``.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("triton", reason="the compile gate needs Triton")

from ._kernel_specs import (  # noqa: E402
    PAIR_FLAGS,
    ROW_FLAGS,
    Spec,
    compile_all,
    compile_spec,
    report,
)

ROW, PAIR = ("fwd", "dq", "dk", "bwd"), ("pair_fwd", "pair_dq", "pair_dk")
#: the shared memory one block may take, by architecture (A100: 163 KiB, H100: 227 KiB)
SHARED = {80: 163 * 1024, 90: 227 * 1024}
SPILL_BYTES = 512


def _row(arch: int, precision: str, width: int, flags: dict, kernels=ROW[:3]) -> list[Spec]:
    return [Spec(arch, k, precision, width, tuple(sorted(
        {f: v for f, v in flags.items() if not (k == "fwd" and f == "DETACH")}.items())))
        for k in kernels]


def _pair(arch: int, precision: str, width: int, pair_width: int, flags: dict) -> list[Spec]:
    return [Spec(arch, k, precision, width, tuple(sorted(flags.items())), pair_width)
            for k in PAIR]


def gate() -> list[Spec]:
    specs = []
    for arch in (80, 90):
        specs += _row(arch, "bf16", 128, ROW_FLAGS[0])  # InfoNCE's 2N form
        specs += _row(arch, "fp16", 128, ROW_FLAGS[1])  # labels, DySTreSS cosine, detached
        specs += _row(arch, "tf32", 128, ROW_FLAGS[2])  # labels, piecewise, attached
        specs += _row(arch, "ieee", 64, ROW_FLAGS[3])  # a queue: no masks
        specs += _pair(arch, "bf16", 128, 128, PAIR_FLAGS[0])  # PairTemperature
        specs += _pair(arch, "tf32", 128, 1, PAIR_FLAGS[1])  # ConstantTemperature
    specs += _row(90, "bf16", 512, ROW_FLAGS[4])  # dim 512: chunked features
    specs += _row(90, "bf16", 2048, ROW_FLAGS[0], kernels=("dq", "dk"))  # split output
    for arch in (80, 90):  # the one-pass backward (ADAPTCL_TRITON_BACKWARD=onepass)
        specs += _row(arch, "bf16", 128, ROW_FLAGS[0], kernels=("bwd",))
    specs += _row(90, "tf32", 128, ROW_FLAGS[1], kernels=("bwd",))
    specs += _pair(90, "ieee", 32, 32, PAIR_FLAGS[2])
    return specs


GATE = gate()


@pytest.fixture(scope="module")
def compiled():
    results = compile_all(GATE, jobs=2)
    print("\n" + report(results))
    return results


def test_the_gate_covers_every_term_flag_pair_kernel_and_precision():
    seen = {(k, v) for spec in GATE for k, v in spec.flags}
    for flag in ("HAS_POS", "HAS_SELF", "HAS_LAB", "DETACH"):
        assert {(flag, True), (flag, False)} <= seen, flag
    assert {("TERM", t) for t in (0, 1, 2)} <= seen and {("SQUASH", 0), ("SQUASH", 1)} <= seen
    for kernels in (ROW, PAIR):
        for arch in (80, 90):
            assert {s.kernel for s in GATE if s.arch == arch} >= set(kernels)
    assert {s.precision for s in GATE} == {"bf16", "fp16", "tf32", "ieee"}


@pytest.mark.slow
def test_every_kernel_compiles_for_sm80_and_sm90_on_tensor_cores_without_spilling(compiled):
    failures = [f"{r.spec.name()}: {r.error}" for r in compiled if r.error]
    assert not failures, "\n".join(failures)
    for r in compiled:
        name = r.spec.name()
        if r.spec.precision == "ieee":
            assert r.tensor_core_ops == 0, name
        else:
            assert r.tensor_core_ops > 0, f"{name}: no tensor-core instruction in its PTX"
        assert r.shared is not None and r.shared <= SHARED[r.spec.arch], (name, r.shared)
        assert r.spill_stores is not None, f"{name}: no ptxas report"
        main = max(r.spec.width, r.spec.pair_width) <= 128 and r.spec.precision != "ieee"
        bound = 0 if main else SPILL_BYTES
        assert r.spill_stores <= bound, (name, r.spill_stores, r.registers)


def test_a_non_constexpr_global_fails_the_gate(monkeypatch, tmp_path):
    """The first GPU run's failure, put back: ``PI`` as a plain float. The interpreter ran it;
    the gate must not."""
    from adaptcl.plugins.tiles import _triton_rowstats

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_triton_rowstats, "PI", math.pi)
    spec = Spec(90, "dq", "bf16", 64, tuple(sorted(dict(
        HAS_POS=True, HAS_SELF=False, HAS_LAB=False, TERM=1, DETACH=False).items())))
    result = compile_spec(spec)
    assert result.error is not None and "PI" in result.error, result
