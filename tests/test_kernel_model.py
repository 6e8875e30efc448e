"""``benchmarks/kernel_model.py``: the busiest pipe of a compiled kernel's main loop, on
hand-made counts whose answers are worked out here (the report runs it on the real kernels)."""

from __future__ import annotations

import pytest

from benchmarks.kernel_build import Compiled, Spec
from benchmarks.kernel_model import clocks_per_element, milliseconds


def _compiled(*, arch: int = 90, instructions: int, fp32: int, mufu: int, mma_flops: int,
              registers: int = 128, warps: int = 4, block: tuple[int, int] = (64, 64),
              precision: str = "bf16", wgmma: int = 1, mma_sync: int = 0) -> Compiled:
    """A compile whose main loop issues these counts per warp and iteration (a 64 x 64 tile
    on 4 warps: 32 elements per thread, so 32 instructions are 1.0 per element)."""
    spec = Spec(arch, "fwd", precision, 128, (), "m:f", (), (("BM", block[0]), ("BN", block[1])),
                warps, 2)
    return Compiled(spec, registers=registers, shared=32 * 1024, wgmma=wgmma,
                    mma_sync=mma_sync, loop_instructions=instructions,
                    loop_mufu={"EX2": mufu} if mufu else {}, loop_fp32=fp32,
                    loop_mma_flops=mma_flops)


def test_two_ctas_per_sm_take_the_busiest_pipe():
    # 10 instructions, 1 exp, a 128-wide product per element: issue 10/128, MUFU 1/16,
    # tensor cores 256/4096
    r = _compiled(instructions=320, fp32=96, mufu=32, mma_flops=256 * 64 * 64)
    bound = clocks_per_element(r)
    assert bound.pipe == "issue" and bound.clocks == pytest.approx(10 / 128)
    more_exps = _compiled(instructions=320, fp32=96, mufu=96, mma_flops=256 * 64 * 64)
    assert clocks_per_element(more_exps).pipe == "mufu"
    assert clocks_per_element(more_exps).clocks == pytest.approx(3 / 16)
    wide = _compiled(instructions=320, fp32=96, mufu=32, mma_flops=1024 * 64 * 64)
    assert clocks_per_element(wide).pipe == "tensor"
    assert clocks_per_element(wide).clocks == pytest.approx(1024 / 4096)


def test_sm_80s_fma_pipe_is_half_as_wide_and_one_cta_does_not_overlap():
    r = _compiled(arch=80, instructions=320, fp32=256, mufu=32, mma_flops=256 * 64 * 64,
                  wgmma=0, mma_sync=1)
    bound = clocks_per_element(r)
    assert bound.pipe == "fp32" and bound.clocks == pytest.approx(8 / 64)
    alone = _compiled(instructions=320, fp32=96, mufu=32, mma_flops=256 * 128 * 64,
                      registers=255, warps=8, block=(128, 64))  # 255 registers: one CTA
    bound = clocks_per_element(alone)
    assert bound.pipe == "tensor+issue"
    assert bound.clocks == pytest.approx(256 / 4096 + 10 / 128)


def test_the_milliseconds_of_a_pass_on_an_h200():
    r = _compiled(instructions=320, fp32=96, mufu=32, mma_flops=256 * 64 * 64)
    ms = milliseconds(clocks_per_element(r), 90, 65536, 65536)
    assert ms == pytest.approx(65536**2 * (10 / 128) / (132 * 1.83e9) * 1e3)


def test_a_kernel_without_a_read_loop_has_no_bound():
    r = _compiled(instructions=320, fp32=96, mufu=32, mma_flops=0)
    r.loop_instructions = None
    assert clocks_per_element(r) is None


def test_the_steps_table_sums_each_flag_sets_three_passes_against_infonces():
    from benchmarks.kernel_report import steps

    def row(kernel, flags, ms, by="x"):
        return {"arch": 90, "precision": "bf16", "width": 128, "kernel": kernel,
                "flags": flags, "model_ms": ms, "reached_by": by}

    plain, term = "HAS_POS=1,TERM=0", "HAS_POS=1,TERM=1"
    table = [row("fwd", plain, 1.0), row("dq", "DETACH=1," + plain, 2.0, "infonce"),
             row("dk", "DETACH=1," + plain, 2.0),
             row("fwd", term, 2.0), row("dq", "DETACH=1," + term, 3.0, "dystress"),
             row("dk", "DETACH=1," + term, 3.0),
             row("dq", "DETACH=0," + term, 4.0, "dystress attached")]  # no dk: no step
    lines = steps(table).splitlines()
    assert len(lines) == 4
    assert lines[2].endswith("| infonce | 1.00 | 2.00 | 2.00 | 5.00 | 1.00 |")
    assert lines[3].endswith("| dystress | 2.00 | 3.00 | 3.00 | 8.00 | 1.60 |")
    assert steps([row("fwd", plain, 1.0)]) == ""
