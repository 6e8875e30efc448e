"""The fused kernels compiled for a GPU on this CPU, and what the compiled code says about them.

``triton.compile`` with a ``GPUTarget`` builds a kernel's TTGIR, PTX and cubin without a GPU
(Triton 3.8 bundles ``ptxas``, ``cuobjdump`` and ``nvdisasm``). A :class:`Spec` is one launch as
the dispatcher makes it (``kernel_reach.py`` records them: the kernel, the types of its
arguments, its constexprs, the table's warps and stages); :func:`compile_spec` compiles it for
its architecture and reads:

* **ptxas' report** (Triton prints it with ``knobs.nvidia.dump_ptxas_log``, the
  ``TRITON_DUMP_PTXAS_LOG`` knob; its warnings are in the same ``-v`` log, on ptxas' stderr,
  and nowhere else): registers, spill stores and loads, and every coded message, among them
  ``C7515`` (and its siblings), "wgmma.mma_async instructions are serialized": each
  ``wgmma`` waits for the one before it (a ``WARPGROUP.DEPBAR`` after each ``HGMMA``);
* **the PTX**: the tensor-core family, ``wgmma.mma_async`` (Hopper's warpgroup MMA, operands
  from shared memory) or ``mma.sync`` (Ampere's warp MMA, which sm_90 runs at a fraction of
  its rate), or none;
* **the SASS** (``cuobjdump -sass`` on the cubin): the main loop, found by its back-edge (the
  branch to a lower address spanning the most code: the loop over column blocks, or over anchor
  blocks in ``dk``), and on its shortest path from head to back-edge (the tiles that skip every
  conditional block, such as the masks of the columns no row excludes: nearly all of them) the
  instructions, ``MUFU`` operations (exp2, reciprocal, log2, ...) and MMA instructions. Per
  tile element means: **thread instructions per element of the ``BM x BN`` tile per
  iteration**, ``path x 32 x warps / (BM x BN)`` (each warp issues the path once per
  iteration for its 32 threads; one ``MUFU.EX2`` per element is exactly 1.0). A nested loop
  (the feature chunks of a width beyond one resident chunk) is counted once per iteration of
  the main loop, so at chunked widths the count is a lower bound; ``loops`` says how many;
* **the TTGIR**: each ``dot``'s accumulator layout (``#ttg.nvidia_mma``: ``warpsPerCTA`` and
  the instruction shape) against the dot's shape. The warps of a CTA cover
  ``warpsPerCTA[0] x instrShape[0]`` rows and ``warpsPerCTA[1] x instrShape[1]`` columns of
  the accumulator (on sm_90 a warpgroup is four warps along the rows, 64 rows of ``wgmma``);
  where that exceeds the dot's own ``M x N``, the layout wraps and several warps hold, and
  compute, the same elements: ``copies`` is that factor (2: the same tile in two warpgroups).
  And whether the kernel is warp-specialised (``ttg.warp_specialize``).

CTAs per SM follow CUDA's occupancy rules (``cuda_occupancy.h``): registers per warp are the
per-thread count times 32 rounded up to 256; each of the 4 sub-partitions has 16,384 of the
SM's 65,536 registers and holds whole warps; shared memory per CTA is Triton's plus the 1 KiB
the driver reserves since Ampere, rounded up to 128 bytes, against 164 KiB per SM on sm_80
(163 KiB per block) and 228 KiB on sm_90 (227 KiB per block); at most 64 warps per SM.

:func:`compile_all` compiles in parallel processes, each with an empty Triton cache (a cached
kernel prints no ptxas report). ``benchmarks/kernel_report.py`` prints the table;
``tests/plugins/test_kernel_compile.py`` asserts on it.

Example (the enumeration about 20 s, the compile a few)::

    >>> from benchmarks.kernel_reach import reachable
    >>> spec = next(s for s in reachable("--gate") if s.kernel == "dk" and s.arch == 90
    ...             and s.precision == "bf16" and s.width == 128)
    >>> compile_spec(spec).serialised   # at main: each wgmma waits for the previous one
    ['C7515']
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import os
import re
import resource
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

#: registers per SM, per sub-partition count, the allocation unit per warp, warps per SM
REGISTERS_PER_SM = 65536
SUB_PARTITIONS = 4
REGISTER_UNIT = 256
WARPS_PER_SM = 64
#: shared memory per SM and per block (bytes), by architecture; the driver's reservation
#: per block and the allocation unit
SHARED_PER_SM = {80: 164 * 1024, 90: 228 * 1024}
SHARED_PER_BLOCK = {80: 163 * 1024, 90: 227 * 1024}
SHARED_RESERVED = 1024
SHARED_UNIT = 128


@dataclass(frozen=True)
class Spec:
    """One launch to compile: the kernel (``function``, ``"module:name"``), the types of its
    runtime arguments in order (``signature``: ``(name, "*bf16" | "i32" | "fp32" ...)``), its
    constexprs (``constexprs``, the block's ``BM`` / ``BN`` included), Triton's ``warps`` and
    ``stages``; and what it is: the architecture (80, 90), the table's kernel name, the
    products' precision, the padded feature width the table keys on and the flags (the
    constexprs the loss's math sets, not the layout)."""

    arch: int
    kernel: str
    precision: str
    width: int
    flags: tuple[tuple[str, object], ...]
    function: str
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, object], ...]
    warps: int
    stages: int
    #: the first loss configuration that launched it (``kernel_reach.Configuration.text``)
    reached_by: str = field(default="", compare=False)
    #: the same launch of InfoNCE in the same form (the kernel of the same pass for AMCL's
    #: pair kernels), the denominator of the ratios (``None``: not enumerated)
    reference: Spec | None = field(default=None, compare=False)

    @property
    def operands(self) -> str:
        """``half`` (bf16, fp16), ``tf32`` or ``ieee``: what the table keys on."""
        return "half" if self.precision in ("bf16", "fp16") else self.precision

    @property
    def block(self) -> tuple[int, int, int, int]:
        c = dict(self.constexprs)
        return c["BM"], c["BN"], self.warps, self.stages

    def flag_text(self) -> str:
        return ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in self.flags)

    def name(self) -> str:
        return f"sm_{self.arch} {self.kernel} {self.precision} D={self.width} [{self.flag_text()}]"


@dataclass(frozen=True)
class Dot:
    """One ``dot`` of the TTGIR: its accumulator shape, MMA version, ``warpsPerCTA`` and
    instruction shape, and how many warps hold each of its elements (:func:`dot_layouts`)."""

    shape: tuple[int, int]
    version: int
    warps: tuple[int, int]
    instr: tuple[int, int]

    @property
    def copies(self) -> int:
        rows = max(1, self.warps[0] * self.instr[0] // self.shape[0])
        cols = max(1, self.warps[1] * self.instr[1] // self.shape[1])
        return rows * cols


@dataclass
class Compiled:
    """What :func:`compile_spec` read from one compile (``error`` set: nothing else is)."""

    spec: Spec
    seconds: float = 0.0
    #: CPU seconds of the compile and its tools (ptxas, cuobjdump): the wall time on an idle core
    cpu_seconds: float = 0.0
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    shared: int | None = None
    messages: dict[str, str] = field(default_factory=dict)
    wgmma: int = 0
    mma_sync: int = 0
    loop_instructions: int | None = None
    loop_mufu: dict[str, int] = field(default_factory=dict)
    #: float32 additions, multiplications and multiply-adds on the path (the FMA pipe)
    loop_fp32: int = 0
    #: tensor-core flops per CTA and iteration (:func:`mma_flops`)
    loop_mma_flops: int = 0
    loops: int = 0
    dots: list[Dot] = field(default_factory=list)
    warp_specialized: bool = False
    error: str | None = None

    @property
    def mma_family(self) -> str:
        """``wgmma``, ``mma.sync``, ``both`` or ``none`` (from the PTX)."""
        if self.wgmma and self.mma_sync:
            return "both"
        return "wgmma" if self.wgmma else "mma.sync" if self.mma_sync else "none"

    @property
    def serialised(self) -> list[str]:
        """ptxas' codes saying that ``wgmma`` instructions are serialised (C7515 and kin)."""
        return sorted(code for code, text in self.messages.items()
                      if "serialized" in text and "wgmma" in text)

    @property
    def tile(self) -> int:
        bm, bn, _, _ = self.spec.block
        return bm * bn

    def per_element(self, count: int | None) -> float | None:
        """``count`` instructions per warp and iteration as thread instructions per tile
        element (module docstring)."""
        if count is None:
            return None
        return count * 32 * self.spec.warps / self.tile

    @property
    def instructions_per_element(self) -> float | None:
        return self.per_element(self.loop_instructions)

    @property
    def fp32_per_element(self) -> float | None:
        return self.per_element(self.loop_fp32 if self.loop_instructions is not None else None)

    @property
    def flops_per_element(self) -> float | None:
        """Tensor-core flops per tile element and iteration (``2 D`` per product of width
        ``D``)."""
        if self.loop_instructions is None:
            return None
        return self.loop_mma_flops / self.tile

    @property
    def mufu_per_element(self) -> float | None:
        return self.per_element(sum(self.loop_mufu.values())
                                if self.loop_instructions is not None else None)

    @property
    def copies(self) -> int:
        """The most warps holding one accumulator element of any dot (1: none twice)."""
        return max((d.copies for d in self.dots), default=1)

    def ctas(self) -> dict[str, int]:
        """CTAs per SM: ``{"registers", "shared", "warps", "ctas"}`` (module docstring)."""
        return occupancy(self.spec.arch, self.registers or 0, self.spec.warps, self.shared or 0)


def occupancy(arch: int, registers: int, warps: int, shared: int) -> dict[str, int]:
    """CTAs per SM of a kernel of ``registers`` per thread, ``warps`` per CTA and ``shared``
    bytes of shared memory, by each limit and overall (``cuda_occupancy.h``'s rules for
    sm_80 / sm_90)."""
    per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
    if per_warp:
        warps_by_registers = (REGISTERS_PER_SM // SUB_PARTITIONS // per_warp) * SUB_PARTITIONS
        by_registers = warps_by_registers // warps
    else:
        by_registers = WARPS_PER_SM // warps
    per_cta = -(-(shared + SHARED_RESERVED) // SHARED_UNIT) * SHARED_UNIT
    by_shared = 0 if per_cta > SHARED_PER_BLOCK[arch] + SHARED_RESERVED else (
        SHARED_PER_SM[arch] // per_cta)
    by_warps = WARPS_PER_SM // warps
    return {"registers": by_registers, "shared": by_shared, "warps": by_warps,
            "ctas": min(by_registers, by_shared, by_warps)}


# --------------------------------------------------------------------------------------------
# Reading the compiler's output
# --------------------------------------------------------------------------------------------

_REGISTERS = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_MESSAGE = re.compile(r"ptxas (?:info|warning)\s*:\s*\((C\d+)\)\s*(.*)")


def ptxas_report(log: str) -> tuple[int | None, int | None, int | None, dict[str, str]]:
    """``(registers, spill stores, spill loads, {code: message})`` of a ``ptxas -v`` log."""
    regs, spills = _REGISTERS.search(log), _SPILLS.search(log)
    messages = {m.group(1): m.group(2).strip() for m in _MESSAGE.finditer(log)}
    return (int(regs.group(1)) if regs else None,
            int(spills.group(1)) if spills else None,
            int(spills.group(2)) if spills else None, messages)


_SASS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);")
_TARGET = re.compile(r"0x([0-9a-f]+)\s*$")
_JUMPS = ("BRA", "JMP")
_ENDS = ("EXIT", "RET", "BRA", "JMP")


@dataclass(frozen=True)
class Instruction:
    address: int
    predicated: bool
    opcode: str
    target: int | None

    @property
    def jump(self) -> bool:
        return self.opcode.split(".")[0] in _JUMPS


#: the float32 arithmetic that runs on the FMA pipe (128 lanes per SM on sm_90, 64 on sm_80)
FP32_PIPE = ("FFMA", "FMUL", "FADD")
_HGMMA_SHAPE = re.compile(r"HGMMA\.(\d+)x(\d+)x(\d+)\b")
_HMMA_SHAPE = {"16816": (16, 8, 16), "1688": (16, 8, 8), "1684": (16, 8, 4)}


def mma_flops(opcode: str, warps: int) -> int:
    """Tensor-core flops one CTA of ``warps`` warps does for one MMA instruction of its path:
    ``HGMMA.MxNxK`` is one per warpgroup (its four warps issue it together), ``HMMA.MNK`` one
    per warp (``16816``: m16 n8 k16)."""
    m = _HGMMA_SHAPE.match(opcode)
    if m:
        rows, cols, depth = map(int, m.groups())
        return 2 * rows * cols * depth * max(1, warps // 4)
    shape = _HMMA_SHAPE.get(opcode.split(".")[1] if "." in opcode else "")
    if shape is None:
        raise ValueError(f"an MMA instruction of unknown shape: {opcode}")
    rows, cols, depth = shape
    return 2 * rows * cols * depth * warps


def parse_sass(text: str) -> list[Instruction]:
    """The instructions of ``cuobjdump -sass`` output (one function), with branch targets."""
    out = []
    for m in _SASS.finditer(text):
        opcode, operands = m.group(3), m.group(4)
        target = None
        if opcode.split(".")[0] in _JUMPS:
            t = _TARGET.search(operands.strip())
            target = int(t.group(1), 16) if t else None
        out.append(Instruction(int(m.group(1), 16), bool(m.group(2)), opcode, target))
    return out


@dataclass(frozen=True)
class Loop:
    """The main loop of a kernel's SASS: its shortest iteration path's instructions and the
    number of loops nested in it."""

    path: list[Instruction]
    nested: int


def main_loop(instructions: list[Instruction]) -> Loop | None:
    """The loop whose back-edge (a branch to a lower address) spans the most code, and the
    shortest path through its body from head to back-edge: branches that leave the body are
    not taken, nested loops are run once (module docstring). Where no such path exists (ptxas
    versioned the loop, its common iteration leaving the back-edge's range), the shortest
    cycle through the head (:func:`_shortest_cycle`)."""
    edges = [(i.target, i.address) for i in instructions
             if i.jump and i.target is not None and i.target < i.address]
    if not edges:
        return None
    head, tail = max(edges, key=lambda e: e[1] - e[0])
    nested = sum(1 for h, t in edges if head <= h and t <= tail and (h, t) != (head, tail))
    body = [i for i in instructions if head <= i.address <= tail]
    index = {i.address: n for n, i in enumerate(body)}
    # shortest distance (in instructions) from the head to each instruction, forward only
    # (a DAG: back-edges are the nested loops, run once)
    dist = [None] * len(body)
    prev = [None] * len(body)
    dist[0] = 1
    for n, ins in enumerate(body):
        if dist[n] is None:
            continue
        successors = []
        ends = ins.opcode.split(".")[0] in _ENDS and not ins.predicated
        if not ends and n + 1 < len(body):
            successors.append(n + 1)
        if ins.jump and ins.target is not None and ins.target > ins.address \
                and ins.target in index:
            successors.append(index[ins.target])
        for s in successors:
            if dist[s] is None or dist[n] + 1 < dist[s]:
                dist[s], prev[s] = dist[n] + 1, n
    last = len(body) - 1
    if dist[last] is None:  # the body leaves its range and comes back (a versioned loop)
        cycle = _shortest_cycle(instructions, head)
        return None if cycle is None else Loop(cycle, nested)
    path, n = [], last
    while n is not None:
        path.append(body[n])
        n = prev[n]
    return Loop(path[::-1], nested)


def _shortest_cycle(instructions: list[Instruction], head: int) -> list[Instruction] | None:
    """The shortest path (in instructions) from ``head`` back to it over the whole function's
    control flow: for a main loop that ptxas versioned (the common tile's code placed after
    the loop's back-edge, jumping back into it), whose iteration leaves the back-edge's range
    and returns. Breadth-first, so a nested loop on the way is not run at all."""
    index = {i.address: n for n, i in enumerate(instructions)}
    start = index[head]
    prev: dict[int, int] = {}
    frontier = [start]
    while frontier:
        following = []
        for n in frontier:
            ins = instructions[n]
            successors = []
            if not (ins.opcode.split(".")[0] in _ENDS and not ins.predicated) \
                    and n + 1 < len(instructions):
                successors.append(n + 1)
            if ins.jump and ins.target in index:
                successors.append(index[ins.target])
            for m in successors:
                if m == start:
                    path = [n]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [instructions[k] for k in reversed(path)]
                if m not in prev:
                    prev[m] = n
                    following.append(m)
        frontier = following
    return None


_LAYOUT = re.compile(r"^(#\w+) = #ttg\.nvidia_mma<\{([^}]*)\}>", re.M)
_DOT = re.compile(r"(?:ttng\.warp_group_dot|tt\.dot)\b[^\n]*->\s*tensor<(\d+)x(\d+)x\w+,\s*"
                  r"(#\w+)>")
_INTS = re.compile(r"(\w+) = \[([\d,\s]+)\]")


def dot_layouts(ttgir: str) -> list[Dot]:
    """Every ``dot`` of a TTGIR module with its accumulator's MMA layout (module docstring)."""
    layouts = {}
    for m in _LAYOUT.finditer(ttgir):
        fields = {k: tuple(int(x) for x in v.split(",")) for k, v in _INTS.findall(m.group(2))}
        version = int(re.search(r"versionMajor = (\d+)", m.group(2)).group(1))
        layouts[m.group(1)] = (version, fields["warpsPerCTA"], fields["instrShape"])
    dots = []
    for m in _DOT.finditer(ttgir):
        if m.group(3) in layouts:
            version, warps, instr = layouts[m.group(3)]
            dots.append(Dot((int(m.group(1)), int(m.group(2))), version,
                            (warps[0], warps[1]), (instr[0], instr[1])))
    return dots


# --------------------------------------------------------------------------------------------
# Compiling
# --------------------------------------------------------------------------------------------


def _attrs(fn, signature: dict[str, str]) -> dict:
    """What a launch at large aligned sizes specialises: 16-aligned pointers, sizes divisible
    by 16."""
    return {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
            if name in signature and (signature[name].startswith("*")
                                      or signature[name] in ("i32", "i64"))}


def kernel_function(spec: Spec):
    module, name = spec.function.split(":")
    return getattr(importlib.import_module(module), name)


def compile_spec(spec: Spec, read_sass: bool = True) -> Compiled:
    """Compile ``spec`` for its architecture and read it (module docstring; ``read_sass``:
    also disassemble the main loop, a third of the time); never raises (a failure is in
    ``error``)."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cpu = _cpu_seconds()
    fn = kernel_function(spec)
    constexprs = dict(spec.constexprs)
    signature = {name: "constexpr" for name in constexprs} | dict(spec.signature)
    log = io.StringIO()
    start = time.perf_counter()
    try:
        previous = knobs.nvidia.dump_ptxas_log
        knobs.nvidia.dump_ptxas_log = True
        try:
            with contextlib.redirect_stdout(log):
                kernel = triton.compile(
                    ASTSource(fn=fn, signature=signature, constexprs=constexprs,
                              attrs=_attrs(fn, signature)),
                    target=GPUTarget("cuda", spec.arch, 32),
                    options={"num_warps": spec.warps, "num_stages": spec.stages})
        finally:
            knobs.nvidia.dump_ptxas_log = previous
    except Exception as error:  # noqa: BLE001 - reported, the gate fails on it
        return Compiled(spec, time.perf_counter() - start, _cpu_seconds() - cpu,
                        error=_cause(error))
    seconds = time.perf_counter() - start
    regs, stores, loads, messages = ptxas_report(log.getvalue())
    ptx, ttgir = kernel.asm["ptx"], kernel.asm["ttgir"]
    result = Compiled(spec, seconds, 0.0, regs, stores, loads,
                      getattr(kernel.metadata, "shared", None), messages, len(re.findall(r"\bwgmma\.mma_async", ptx)),
                      len(re.findall(r"\bmma\.sync", ptx)), dots=dot_layouts(ttgir),
                      warp_specialized="ttg.warp_specialize" in ttgir)
    loop = main_loop(parse_sass(sass(kernel.asm["cubin"]))) if read_sass else None
    try:
        _count(result, loop)
    except ValueError as error:  # an MMA instruction the model does not know: the gate fails
        result.error = str(error)
    result.cpu_seconds = _cpu_seconds() - cpu
    return result


def _count(result: Compiled, loop: Loop | None) -> None:
    """What the main loop's path issues (module docstring), into ``result``."""
    if loop is not None:
        result.loop_instructions = len(loop.path)
        result.loops = loop.nested
        for ins in loop.path:
            family = ins.opcode.split(".")[0]
            if family == "MUFU":
                op = ins.opcode.split(".")[1]
                result.loop_mufu[op] = result.loop_mufu.get(op, 0) + 1
            elif family in ("HGMMA", "HMMA"):
                result.loop_mma_flops += mma_flops(ins.opcode, result.spec.warps)
            elif family in FP32_PIPE:
                result.loop_fp32 += 1


def _cpu_seconds() -> float:
    """User and system CPU seconds of this process and its finished children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def sass(cubin: bytes) -> str:
    """``cuobjdump -sass`` of a cubin (Triton's bundled ``cuobjdump``)."""
    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([knobs.nvidia.cuobjdump.path, "-sass", f.name], check=True,
                              capture_output=True, text=True).stdout


def _cause(error: BaseException) -> str:
    """The innermost error of a compile's chain (Triton wraps the cause in each caller's
    frame), with its type, on one line."""
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__
    lines = [ln.strip() for ln in str(error).strip().splitlines() if ln.strip()]
    return f"{type(error).__name__}: {' | '.join(lines[-4:])}"


def _init_worker(cache: str) -> None:
    os.environ["TRITON_CACHE_DIR"] = cache  # a fresh cache: ptxas runs (and reports) each time


def compile_all(specs: list[Spec], jobs: int = 2, read_sass: bool = True) -> list[Compiled]:
    """Compile ``specs`` (each once) in ``jobs`` processes with an empty Triton cache; the
    results in the order of ``specs``."""
    unique = list(dict.fromkeys(specs))
    with tempfile.TemporaryDirectory() as cache, ProcessPoolExecutor(
            max_workers=jobs, initializer=_init_worker, initargs=(cache,)) as pool:
        done = dict(zip(unique, pool.map(functools.partial(compile_spec, read_sass=read_sass),
                                         unique, chunksize=1), strict=True))
    return [done[s] for s in specs]
