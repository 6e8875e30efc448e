"""Block configurations of the fused kernels: a fixed table per GPU architecture.

Autotuning at a user's sizes inside a training step costs seconds to minutes (13-27 s for the
first call on an H200, the cross-view case unfinished after 40 s) and synchronises with the
host. So the kernels launch with a configuration looked up here, a Python dict read per launch:

* the architecture from ``torch.cuda.get_device_capability`` (cached per device, no sync):
  ``"sm_90"`` (Hopper), ``"sm_80"`` (Ampere and Ada: sm_80 / 86 / 87 / 89), ``"default"`` (any
  other GPU: small blocks that fit every architecture's shared memory), ``"interpreter"``
  (Triton's interpreter on the CPU: small blocks, so the tests run the chunked and the
  split-output paths on small shapes);
* the kernel (``fwd``, ``dq``, ``dk``, the one-pass ``bwd`` and AMCL's ``pair_fwd``,
  ``pair_dq``, ``pair_dk``);
* the operands: ``"half"`` (bf16 / fp16 on tensor cores), ``"tf32"``, ``"ieee"`` (float32 on
  the CUDA cores, whose dot needs smaller blocks);
* the padded feature width (a power of two from 16).

Each entry is a :class:`Block`; the feature chunking follows from the width, the operands and
the kernel (:data:`LAYOUT`; the split backward's own on sm_90, :data:`BACKWARD_LAYOUT`): one
resident chunk up to a width, chunks beyond it, and the backward's output block the whole width
up to a cap (wider features split it). ``python -m benchmarks.kernel_report``
compiles every launch for sm_80 and sm_90 on the CPU and reports its registers, spills, shared
memory and structure; ``tests/plugins/test_kernel_compile.py`` asserts on them.

``tiling(autotune=True)`` (:mod:`~adaptcl.plugins.execution`; ``ADAPTCL_TRITON_AUTOTUNE=1``
sets its default) instead times the entry and a few alternatives once per key (the kernel, its
flags, the width and the batch sizes rounded up to powers of two), synchronising while it does,
and keeps the fastest for the process; it says which it chose once, so a table entry can be
updated from a GPU run.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, replace

import torch

ARCHS = ("sm_90", "sm_80", "default", "interpreter")
KERNELS = ("fwd", "dq", "dk", "bwd", "pair_fwd", "pair_dq", "pair_dk")
OPERANDS = ("half", "tf32", "ieee")
WIDTHS = (16, 32, 64, 128, 256, 512, 1024, 2048)


@dataclass(frozen=True)
class Block:
    """One launch configuration: the anchor block ``bm`` and column block ``bn`` of a tile,
    Triton's ``num_warps`` and ``num_stages``."""

    bm: int
    bn: int
    warps: int
    stages: int


#: per operand class: the widest feature width kept resident (one chunk), the chunk beyond it,
#: and the widest backward output block (wider outputs are split, each part recomputing its
#: tiles). IEEE float32 runs on the CUDA cores, whose dot holds its whole operands in
#: registers: small chunks there.
LAYOUT = {"half": (128, 128, 512), "tf32": (128, 64, 256), "ieee": (32, 32, 64),
          "interpreter": (16, 16, 16)}
#: the split backward's (``dq``, ``dk``) on sm_90 with bf16 / fp16 operands up to 512 features:
#: the program's block resident in shared memory (wgmma reads it there) at every width, the
#: accumulator at most 256 wide (a 512-wide one would not fit one warpgroup's registers)
BACKWARD_LAYOUT = (512, 128, 256)
#: the widest feature width of AMCL's pair kernels per operand class (wider features split
#: their backward's accumulators into more output blocks, each recomputing its tiles)
PAIR_WIDTH = {"half": 512, "tf32": 128, "ieee": 64, "interpreter": 1024}


def _layout(kernel: str | None, operands: str, arch: str, width: int) -> tuple[int, int, int]:
    """The resident width, chunk and output block ``kernel`` takes at a padded ``width``."""
    if kernel in ("dq", "dk") and arch == "sm_90" and operands == "half" and width <= 512:
        return BACKWARD_LAYOUT
    return LAYOUT[operands]


def _table() -> dict[tuple[str, str, str, int, bool], Block]:
    """Every entry, from a few rules per architecture."""
    return {(arch, kernel, operands, width, heavy): _rule(arch, kernel, operands, width, heavy)
            for arch in ARCHS for kernel in KERNELS for operands in OPERANDS
            for width in WIDTHS for heavy in (False, True)}


def _rule(arch: str, kernel: str, operands: str, width: int, heavy: bool) -> Block:
    """The blocks: the widest whose accumulators and tiles fit the registers without spilling
    (ptxas' report, ``python -m benchmarks.kernel_report``): the backward keeps a
    ``[block, min(width, output)]`` float32 accumulator (two for AMCL), the forward none.
    sm_80's ``mma.sync`` holds its operands in registers where sm_90's ``wgmma`` reads them
    from shared memory: smaller backward blocks there. ``heavy``: label targets or a term,
    whose tile temporaries take a forward's registers too. The row statistics' kernels:
    :func:`_row_rule`; AMCL's: :func:`_pair_rule`."""
    if kernel.startswith("pair"):
        return _pair_rule(arch, kernel, operands, width)
    if arch == "interpreter":
        return Block(16, 16, 1, 1)
    if operands == "ieee" or arch == "default":  # CUDA cores, or an unknown shared memory
        return Block(32, 32, 4, 1)
    return _row_rule(arch, kernel, operands, width, heavy)


def _row_rule(arch: str, kernel: str, operands: str, width: int, heavy: bool) -> Block:
    """The row statistics' blocks on tensor cores (``fwd``, ``dq``, ``dk``, the one-pass
    ``bwd``), read from ptxas' report and the SASS for sm_90 (bf16, D <= 128 the main path):

    * the forward's ``128 x 64`` block: 60-72 registers, two blocks per SM by shared memory;
      with label targets or DySTreSS's term (72-137 registers) one warpgroup per program
      (``64 x 64``, 4 warps: three programs per SM);
    * the split backward at two programs per SM, so one program's products overlap
      another's exponentials: ``dq`` in ``128 x 32`` blocks of two warpgroups (114-127
      registers), ``dk`` the same transposed (``32`` anchors per step against ``128`` columns,
      115-128); 128-row programs read each streamed block once for two warpgroups (half the
      L2 traffic of 64-row programs). Label targets and DySTreSS's term hold 128-168
      registers: one warpgroup per program (``64 x 32``, 4 warps: three per SM). Wider
      features keep the program's block resident (:func:`features`): 256 in one warpgroup
      (196-255 registers, two per SM), 512 in ``128 x 32`` blocks of two (one per SM: its
      shared memory; with a term 16 anchors per ``dk`` step, no spill);
    * sm_80 (``mma.sync``, operands in registers) in ``64 x 64`` blocks up to 128 features (4
      warps with label targets or a term: 218-236 registers, two per SM); its chunked forward
      in one stage (two spill);
    * TF32 (float32 operands: twice the registers and shared memory of bf16) in ``64 x 32``
      blocks of one warpgroup up to 128 features (206-244 registers, two per SM), ``64 x 64``
      of two beyond (226-255);
    * the one-pass backward (up to :data:`ONE_PASS_WIDEST` features) in ``64 x 128`` blocks
      of two warpgroups on sm_90 (223-254 registers), ``32 x 64`` of one on sm_80. Every
      product a kernel forms has 64 rows or more per warpgroup, so none falls back to
      ``mma.sync`` on sm_90 and no element is computed by two warps
      (``tests/plugins/test_kernel_compile.py``).
    """
    hopper = arch == "sm_90"
    resident, _chunk, output = _layout(kernel, operands, arch, width)
    if kernel == "fwd":
        if width <= resident and operands == "half" and not heavy:
            block = Block(128, 64, 8, 3 if hopper else 2)
        elif width <= resident and operands == "half":
            block = Block(64, 64, 4, 3) if hopper else Block(64, 64, 8, 2)
        elif hopper:
            block = Block(64, 64, 8, 2)
        else:  # sm_80's chunked operands in registers: one stage, no spill (two spill)
            block = Block(64, 64, 8, 1) if operands == "half" else Block(32, 64, 8, 2)
    elif kernel == "bwd":  # two accumulators: dK and a dA share (:data:`ONE_PASS_WIDEST`)
        # sm_90: 128 columns a program, 64 anchors a step (every product 64 rows or more a
        # warpgroup: wgmma, no element held twice); sm_80: 64 columns, 32 anchors, 4 warps
        block = Block(128, 64, 8, 2) if hopper else Block(64, 32, 4, 2)
    elif hopper and operands == "half" and width <= 512:
        if width <= 128 and not heavy:
            block = Block(128, 32, 8, 2)
        elif width <= 256:
            block = Block(64, 32, 4, 2)
        elif not heavy:
            block = Block(128, 32, 8, 2)
        else:  # a term's temporaries beside the 256-wide accumulator: fewer anchors per step
            block = Block(128, 16, 8, 2) if kernel == "dk" else Block(128, 32, 8, 1)
    elif min(width, output) <= 128 and operands == "half":  # sm_80
        block = Block(64, 64, 4, 2) if heavy else Block(64, 64, 8, 2)
    elif operands == "tf32":  # 64-row products on one warpgroup, or on two side by side
        block = Block(64, 32, 4, 2) if width <= 128 else Block(64, 64, 8, 2)
    elif min(width, output) <= 256:
        block = Block(64, 32, 8, 2)
    else:
        block = Block(32, 32, 8, 2)
    if kernel in ("dk", "bwd"):  # the program's block is the column block
        block = replace(block, bm=block.bn, bn=block.bm)
    if operands == "tf32":  # float32 operands take twice the shared memory per stage
        block = replace(block, stages=max(1, block.stages - 1))
    return block


#: per architecture, the widest feature width at which AMCL's pair backward runs on 64-row
#: blocks of 4 warps (sm_90: ``wgmma``), splitting its outputs where both sides' accumulators
#: do not fit (:func:`pair_outputs`); wider features keep every output in one program on
#: 32-row blocks of 8 warps (``mma.sync``), which spread the accumulators over the 8 warps.
#: At 512 features on sm_90 the split recomputed each tile for 8 output blocks (815 SASS
#: instructions per tile element, 12 products) where one 32-row program takes 226 and 4; on
#: sm_80 the 64-row blocks spill beyond 128 features (64 for TF32), the 32-row ones do not
#: (ptxas)
PAIR_SPLIT_WIDEST = {"sm_90": {"half": 256, "tf32": 256}, "sm_80": {"half": 128, "tf32": 64}}


def _pair_rule(arch: str, kernel: str, operands: str, width: int) -> Block:
    """AMCL's pair kernels (``_triton_pairlse``): one block per kernel up to
    :data:`PAIR_SPLIT_WIDEST` features (where both sides' accumulators do not fit, the
    backward's outputs split instead, :func:`pair_outputs`), 32-row blocks beyond.

    * The backward chains two products (the tile, then ``W @ K``), for which Triton lays all
      warps along the tile's rows, 16 rows each: 64 rows on 4 warps, one warpgroup. 64 rows
      on 8 warps gave both warpgroups the same rows, and ``pair_dk``'s 32-row block fell back
      to ``mma.sync`` on sm_90 (``wgmma`` takes 64 rows a warpgroup); ``pair_dk``'s own block
      is its column block, the transposed tile's rows. One warpgroup of at most 255
      registers leaves room for two programs per SM, whose products and exps overlap.
    * The forward keeps no accumulator: 64 x 64 tiles, two programs per SM in the shared
      memory of the resident blocks (bf16 / fp16); on sm_80, 8 warps beyond 128 features and
      32 rows for TF32 (``mma.sync``'s operands in registers spilled otherwise).
    * Stages: three on sm_90 (``wgmma`` reads them from shared memory), two on sm_80 (a third
      tips ``mma.sync``'s registers into spilling), one fewer for float32 operands (twice the
      shared memory and, on sm_80, the registers).
    * IEEE float32 runs on the CUDA cores (and an unknown GPU gets blocks that fit any):
      small blocks; the interpreter: 16-wide blocks, so the tests run partial and split
      paths on small shapes.

    >>> _pair_rule("sm_90", "pair_dk", "half", 128)
    Block(bm=32, bn=64, warps=4, stages=3)
    """
    if arch == "interpreter":
        return Block(16, 16, 1, 1)
    if operands == "ieee" or arch == "default":
        return Block(32, 32, 4, 1)
    wide = width > PAIR_SPLIT_WIDEST[arch][operands]
    if kernel == "pair_fwd" and operands == "tf32":
        return Block(64, 64, 4, 1) if arch == "sm_90" else Block(32, 64, 4, 1)
    if kernel == "pair_fwd":  # sm_80's chunked products spill on 4 warps
        return Block(64, 64, 8 if wide and arch == "sm_80" else 4, 2)
    if wide:  # TF32 (at most 128 features, :data:`PAIR_WIDTH`) on 4 warps: 8 hold each
        return Block(32, 32, 4 if operands == "tf32" else 8, 2)  # element twice (ptxas: 248)
    stages = {"sm_90": 3, "sm_80": 2}[arch] if operands == "half" else {"sm_90": 2, "sm_80": 1}[arch]
    if kernel == "pair_dq":
        return Block(64, 32, 4, stages)
    return Block(32, 64, 4, stages)  # pair_dk: the program's block is the column block


#: the float32 accumulator columns one program of AMCL's pair backward keeps, both sides
#: together, per architecture and operand class (a program of 64 rows on 4 warps: half as
#: many registers a thread). sm_80's ``mma.sync`` holds its operands in registers, and float32
#: operands take twice the registers of bf16 / fp16 (ptxas' report: 255 registers and no
#: spill for both sides at D = P = 128 on bf16 / fp16, sm_90 and sm_80)
PAIR_ACCUMULATORS = {"sm_90": {"half": 256, "tf32": 128, "ieee": 128},
                     "sm_80": {"half": 256, "tf32": 64, "ieee": 128},
                     "default": {"half": 128, "tf32": 64, "ieee": 128}}


def pair_outputs(precision: str, arch: str, width: int, pair_width: int,
                 squash: bool) -> tuple[int, int]:
    """The output blocks ``(BDO, BPO)`` of AMCL's pair backward for the feature widths
    ``width`` (the cosines') and ``pair_width`` (the temperature network's): the whole padded
    widths where both sides fit :data:`PAIR_ACCUMULATORS` (one program per row block keeps
    both) or the features are wider than :data:`PAIR_SPLIT_WIDEST` (32-row blocks), else
    blocks of half of it per side, one program each, each recomputing its tiles (``SQUASH=0``
    has one side: blocks of the whole of it); never wider than the layout's output block
    (:data:`LAYOUT`: the interpreter's 16 columns, so the tests run both layouts).
    ``_triton_pairlse.backward_parts`` counts the programs.

    >>> pair_outputs("bf16", "sm_90", 128, 128, True)
    (128, 128)
    >>> pair_outputs("bf16", "sm_90", 256, 256, True)  # four programs a row block
    (128, 128)
    """
    width, pair_width = padded(width), padded(pair_width)
    widest = LAYOUT[_layout_key(precision, arch)][2]
    if arch == "interpreter":
        budget = 2 * widest
    elif max(width, pair_width * squash) > PAIR_SPLIT_WIDEST.get(arch, {}).get(
            operands_of(precision), WIDTHS[-1]):
        return width, pair_width
    else:
        budget = PAIR_ACCUMULATORS[arch][operands_of(precision)]
    if not squash:
        return min(width, budget, widest), pair_width
    if width + pair_width <= budget and max(width, pair_width) <= widest:
        return width, pair_width
    side = min(budget // 2, widest)
    return min(width, side), min(pair_width, side)


TABLE = _table()


def arch_of(device: torch.device) -> str:
    """The table's architecture for tensors on ``device``."""
    if device.type != "cuda":
        return "interpreter"
    return _cuda_arch(0 if device.index is None else device.index)


@functools.cache
def _cuda_arch(index: int) -> str:
    major, _minor = torch.cuda.get_device_capability(index)
    return {9: "sm_90", 8: "sm_80"}.get(major, "default")


def padded(width: int) -> int:
    """The feature width as the kernels lay it out: a power of two, at least 16."""
    return max(16, 1 << (max(width, 1) - 1).bit_length())


def operands_of(precision: str) -> str:
    return "half" if precision in ("bf16", "fp16") else precision


def _layout_key(precision: str, arch: str) -> str:
    return "interpreter" if arch == "interpreter" else operands_of(precision)


def block(kernel: str, precision: str, width: int, arch: str, heavy: bool = False) -> Block:
    """The fixed configuration of ``kernel`` at ``precision`` and feature ``width``
    (``heavy``: with label targets or a term)."""
    return TABLE[arch, kernel, operands_of(precision), min(padded(width), WIDTHS[-1]), heavy]


def features(width: int, precision: str, arch: str, kernel: str | None = None) -> dict[str, int]:
    """``BK`` (the chunk), ``KCH`` (chunks) and ``BDO`` (the backward's output block) of a
    feature ``width`` for ``kernel`` (:data:`LAYOUT`; the split backward's own on sm_90,
    :data:`BACKWARD_LAYOUT`)."""
    operands = _layout_key(precision, arch)
    full = padded(width)
    resident, chunk, output = _layout(kernel, operands, arch, full)
    bk = full if full <= resident else chunk
    return {"BK": bk, "KCH": full // bk, "BDO": min(full, output)}


#: the widest padded feature width the one-pass backward (``tiling(backward="onepass")``) is
#: laid out for, per operand class: its two float32 accumulators, ``dK`` and each tile's ``dA``
#: share, fit one program up to 128 bf16 / fp16 features (at 256 and 512 thousands of bytes
#: spill at every block tried); TF32 operands spill or fall back to ``mma.sync`` on sm_90 at
#: every block tried; IEEE and the interpreter within their output block. Elsewhere the split
#: backward runs (and says so once)
ONE_PASS_WIDEST = {"half": 128, "tf32": 0, "ieee": 64, "interpreter": 16}


def one_pass(precision: str, arch: str, width: int) -> bool:
    """Whether the one-pass backward is laid out for ``width`` features at ``precision``."""
    return padded(width) <= ONE_PASS_WIDEST[_layout_key(precision, arch)]


def pair_width(precision: str, arch: str) -> int:
    """The widest feature width the pair kernels take at ``precision``."""
    return PAIR_WIDTH[_layout_key(precision, arch)]


def alternatives(base: Block) -> list[Block]:
    """The entry and its neighbours: half / double blocks, more or fewer stages."""
    out = [base]
    for bm, bn in ((base.bm, base.bn * 2), (base.bm, max(16, base.bn // 2)),
                   (max(16, base.bm // 2), base.bn), (base.bm * 2, base.bn)):
        if bm <= 256 and bn <= 256:
            out.append(replace(base, bm=bm, bn=bn))
    out.append(replace(base, stages=base.stages + 1))
    return list(dict.fromkeys(out))


_TUNED: dict[tuple, Block] = {}


def size_bin(n: int) -> int:
    """``n`` rounded up to a power of two: the autotuning key's batch sizes."""
    return 1 << max(n - 1, 0).bit_length()


def tuned(key: tuple, base: Block, run) -> Block:
    """The fastest of :func:`alternatives` for ``key``, timed once per process with
    ``triton.testing.do_bench`` (``run(block)`` launches the kernel; the kernels only write
    their outputs, so a repeated launch is harmless); a candidate that fails to compile or
    launch is skipped."""
    if key not in _TUNED:
        from triton.testing import do_bench

        timings = {}
        for candidate in alternatives(base):
            try:
                timings[candidate] = do_bench(lambda c=candidate: run(c), warmup=5, rep=20)
            except Exception:  # noqa: BLE001 - out of resources: not a candidate here
                continue
        _TUNED[key] = min(timings, key=timings.get) if timings else base
        warnings.warn(f"tiling(autotune=True): {key} -> {_TUNED[key]} (table: {base}; ms "
                      f"{ {str(c): round(t, 3) for c, t in timings.items()} })", stacklevel=3)
    return _TUNED[key]
