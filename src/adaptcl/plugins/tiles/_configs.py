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

Each entry is a :class:`Block`; the feature chunking follows from the width and the operands
(:data:`LAYOUT`): one resident chunk up to a width, chunks beyond it, and the backward's output
block the whole width up to a cap (wider features split it). ``tests/plugins/test_kernel_compile.py``
compiles every entry for sm_80 and sm_90 on the CPU and reports its registers, spills and shared
memory.

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
#: the widest feature width of AMCL's pair kernels (their backward keeps both gradients' rows
#: at full width) per operand class
PAIR_WIDTH = {"half": 512, "tf32": 128, "ieee": 64, "interpreter": 1024}


def _table() -> dict[tuple[str, str, str, int, bool], Block]:
    """Every entry, from a few rules per architecture."""
    return {(arch, kernel, operands, width, heavy): _rule(arch, kernel, operands, width, heavy)
            for arch in ARCHS for kernel in KERNELS for operands in OPERANDS
            for width in WIDTHS for heavy in (False, True)}


def _rule(arch: str, kernel: str, operands: str, width: int, heavy: bool) -> Block:
    """The blocks: the widest whose accumulators and tiles fit the registers without spilling
    (ptxas' report, ``python -m tests.plugins._kernel_specs``): the backward keeps a
    ``[block, min(width, output)]`` float32 accumulator (two for AMCL), the forward none.
    sm_80's ``mma.sync`` holds its operands in registers where sm_90's ``wgmma`` reads them
    from shared memory: smaller backward blocks there. ``heavy``: label targets or a term,
    whose tile temporaries take a forward's registers too."""
    if arch == "interpreter":
        return Block(16, 16, 1, 1)
    if operands == "ieee" or arch == "default":  # CUDA cores, or an unknown shared memory
        return Block(32, 32, 4, 1)
    hopper = arch == "sm_90"
    pair = kernel.startswith("pair")
    two = pair or kernel == "bwd"  # two accumulators: AMCL's sides, or dK and a dA share
    resident = width <= LAYOUT[operands][0]
    out = min(width, LAYOUT[operands][2]) * (2 if two else 1)
    if kernel.endswith("fwd"):
        if resident and not pair and not heavy and operands == "half":
            block = Block(128, 64, 8, 3 if hopper else 2)
        else:
            block = Block(64, 64, 8, 2) if hopper or operands == "half" else Block(32, 64, 8, 2)
    elif two:  # two accumulators (and for AMCL eight [block, block] temporaries per tile)
        wide = out <= 256 and kernel in ("pair_dq", "bwd") and (hopper or operands == "half")
        block = Block(64, 32, 8, 2) if wide else Block(32, 32, 8, 2)
    elif out <= 128 and operands == "half" and hopper:
        block = Block(128, 64, 8, 3)
    elif out <= 128 and operands == "half":
        block = Block(64, 64, 8, 2)
    elif out <= 256 and operands == "half" and hopper:
        block = Block(64, 64, 8, 2)
    elif out <= 256:
        block = Block(64, 32, 8, 2)
    else:
        block = Block(32, 32, 8, 2)
    if kernel in ("dk", "bwd"):  # the program's block is the column block
        block = replace(block, bm=block.bn, bn=block.bm)
    if operands == "tf32":  # float32 operands take twice the shared memory per stage
        block = replace(block, stages=max(1, block.stages - 1))
    return block


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


def features(width: int, precision: str, arch: str) -> dict[str, int]:
    """``BK`` (the chunk), ``KCH`` (chunks) and ``BDO`` (the backward's output block) of a
    feature ``width``."""
    resident, chunk, output = LAYOUT[_layout_key(precision, arch)]
    full = padded(width)
    bk = full if full <= resident else chunk
    return {"BK": bk, "KCH": full // bk, "BDO": min(full, output)}


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
