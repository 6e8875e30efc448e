"""How ``benchmarks/kernel_build.py`` reads a compiled kernel: ptxas' report, the SASS main
loop, the TTGIR's MMA layouts and CUDA's occupancy rules, on small hand-made inputs whose
answers are worked out here (no compile: the gate, ``tests/plugins/test_kernel_compile.py``,
runs the reading on the real kernels)."""

from __future__ import annotations

import pytest

from benchmarks.kernel_build import (
    dot_layouts,
    main_loop,
    mma_flops,
    occupancy,
    parse_sass,
    ptxas_report,
)

PTXAS_LOG = """\
ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized \
due to non wgmma instructions defining accumulator registers of a wgmma between start and end \
of the pipeline stage in the function 'row_stats_dk'
ptxas info    : 11 bytes gmem
ptxas info    : Compiling entry function 'row_stats_dk' for 'sm_90a'
ptxas info    : Function properties for row_stats_dk
    0 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 228 registers, used 1 barriers
"""


def test_ptxas_report_reads_registers_spills_and_coded_messages():
    regs, stores, loads, messages = ptxas_report(PTXAS_LOG)
    assert (regs, stores, loads) == (228, 24, 16)
    assert list(messages) == ["C7515"] and "serialized" in messages["C7515"]


def _sass(*lines: str) -> str:
    """``cuobjdump -sass``'s layout: an address comment, the instruction, the encoding."""
    return "\n".join(f"        /*{16 * n:04x}*/                   {line} ;    /* 0x0 */"
                     for n, line in enumerate(lines))


#: a kernel whose loop (0x10 to 0xb0) skips a masking block (0x50, 0x60) on most tiles,
#: leaves by a forward branch and holds an inner loop (0x70 to 0x80)
LOOP = _sass("MOV R1, R2",                 # 0x00  prologue
             "IMAD R3, R1, R2, RZ",        # 0x10  head
             "ISETP.GE.AND P0, PT, R3, R4, PT",
             "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ",
             "@!P0 BRA 0x70",              # 0x40  skip the masks
             "FSEL R5, R5, -INF, P1",      # 0x50
             "FSEL R6, R6, -INF, P1",      # 0x60
             "MUFU.EX2 R7, R5",            # 0x70  inner head
             "@P2 BRA 0x70",               # 0x80  inner back-edge
             "MUFU.RCP R8, R6",            # 0x90
             "@P3 BRA 0xd0",               # 0xa0  leave the loop
             "BRA 0x10",                   # 0xb0  back-edge
             "NOP",                        # 0xc0
             "EXIT",                       # 0xd0
             "BRA 0xe0")                   # 0xe0  the trap after EXIT: not a loop


def test_the_main_loop_is_the_widest_back_edge_and_its_shortest_path_skips_the_masks():
    loop = main_loop(parse_sass(LOOP))
    assert [i.address for i in loop.path] == [0x10, 0x20, 0x30, 0x40, 0x70, 0x80, 0x90, 0xa0,
                                              0xb0]
    assert loop.nested == 1
    assert [i.opcode for i in loop.path].count("MUFU.EX2") == 1
    assert sum(i.opcode.startswith("HGMMA") for i in loop.path) == 1


#: a loop ptxas versioned: the widest back-edge (0xc0 to 0x30) closes a range that holds no
#: forward path from its head to it (0x60 exits); an iteration runs 0x30-0x50, the loop's own
#: back-edge to 0x10, then out of line at 0xb0 and back
VERSIONED = _sass("MOV R1, R2",                 # 0x00  prologue
                  "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ",  # 0x10
                  "BRA 0xb0",                   # 0x20  the common tile, out of line
                  "FSEL R5, R5, -INF, P1",      # 0x30  head of the widest back-edge
                  "FADD R8, R8, R5",            # 0x40
                  "@P2 BRA 0x10",               # 0x50
                  "EXIT",                       # 0x60
                  "NOP",                        # 0x70
                  "NOP",                        # 0x80
                  "NOP",                        # 0x90
                  "NOP",                        # 0xa0
                  "MUFU.EX2 R7, R5",            # 0xb0
                  "BRA 0x30")                   # 0xc0  the widest back-edge


def test_a_versioned_main_loop_is_read_by_its_shortest_cycle():
    """No forward path joins the widest back-edge's head to its tail inside its range (the
    iteration leaves it): the shortest cycle through the head is the iteration counted."""
    loop = main_loop(parse_sass(VERSIONED))
    assert [i.address for i in loop.path] == [0x30, 0x40, 0x50, 0x10, 0x20, 0xb0, 0xc0]
    assert sum(i.opcode.startswith("HGMMA") for i in loop.path) == 1


def test_a_kernel_without_a_back_edge_has_no_main_loop():
    assert main_loop(parse_sass(_sass("MOV R1, R2", "EXIT", "BRA 0x20"))) is None


def _ttgir(warps: list[int], instr: list[int], shape: str) -> str:
    return (f"#mma = #ttg.nvidia_mma<{{versionMajor = 3, versionMinor = 0, warpsPerCTA = "
            f"{warps}, instrShape = {instr}}}>\n"
            f"    %acc = ttng.warp_group_dot %a, %b, %c {{isAsync = true}} : "
            f"!ttg.memdesc<64x128xbf16> * !ttg.memdesc<128x32xbf16> -> tensor<{shape}xf32, "
            f"#mma> loc(#loc1)\n")


def test_a_dot_smaller_than_its_warps_rows_is_computed_by_two_warpgroups():
    # eight warps along the rows cover 8 x 16 = 128 rows: a 64-row tile twice
    (dot,) = dot_layouts(_ttgir([8, 1], [16, 16, 16], "64x32"))
    assert dot.shape == (64, 32) and dot.copies == 2
    # four along the rows, two along the columns: 64 x 32, once
    assert dot_layouts(_ttgir([4, 2], [16, 16, 16], "64x32"))[0].copies == 1
    # mma.sync's 16 x 8 instructions on eight warps along the columns: 64 columns for 32
    (sync,) = dot_layouts(_ttgir([1, 8], [16, 8], "32x32").replace("versionMajor = 3",
                                                                     "versionMajor = 2"))
    assert sync.version == 2 and sync.copies == 2


def test_ctas_per_sm_follow_cudas_register_and_shared_memory_rules():
    # 128 registers x 32 = 4,096 per warp: four warps per sub-partition, 16 per SM, two CTAs
    assert occupancy(90, 128, 8, 0)["registers"] == 2
    # 129 round up to 4,352 per warp: three per sub-partition, 12 per SM, one CTA of eight
    assert occupancy(90, 129, 8, 0)["registers"] == 1
    # 170 x 32 = 5,440, allocated as 5,632: two warps per sub-partition (not three), two CTAs
    # of four warps
    assert occupancy(90, 170, 4, 0)["registers"] == 2
    # each sub-partition holds whole warps: 200 x 32 = 6,400 per warp, two of them in each
    # quarter (not 65,536 / 6,400 = 10 in all), eight warps, four CTAs of two (not five)
    assert occupancy(90, 200, 2, 0)["registers"] == 4
    # 87,048 bytes + the driver's 1 KiB, rounded to 128: 88,192 per CTA; 228 KiB hold two,
    # sm_80's 164 KiB one
    assert occupancy(90, 64, 8, 87048)["shared"] == 2
    assert occupancy(80, 64, 8, 87048)["shared"] == 1
    assert occupancy(90, 228, 8, 87048)["ctas"] == 1
    # over the block's limit: none fits
    assert occupancy(80, 64, 4, 170 * 1024)["ctas"] == 0


def test_the_sass_keeps_an_mma_instructions_shape_and_its_flops_follow_it():
    """``HGMMA.64x64x16`` is one per warpgroup (8 warps: two), ``HMMA.16816`` one per warp."""
    loop = main_loop(parse_sass(LOOP))
    assert "HGMMA.64x64x16.F32.BF16" in [i.opcode for i in loop.path]
    assert mma_flops("HGMMA.64x64x16.F32.BF16", 8) == 2 * 64 * 64 * 16 * 2
    assert mma_flops("HGMMA.64x32x8.F32.TF32", 4) == 2 * 64 * 32 * 8
    assert mma_flops("HMMA.16816.F32.BF16", 4) == 2 * 16 * 8 * 16 * 4
    assert mma_flops("HMMA.1688.F32.TF32", 8) == 2 * 16 * 8 * 8 * 8
    with pytest.raises(ValueError, match="HMMA.884"):
        mma_flops("HMMA.884.F32.F16", 4)
