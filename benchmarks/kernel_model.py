"""What a compiled kernel's main loop predicts on a GPU: the busiest pipe per tile element.

The kernel report (``kernel_report.py``) counts, per element of a tile and main-loop
iteration (``kernel_build.py``), the instructions issued, those on the float32 FMA pipe, the
special-function operations (``MUFU``) and the tensor-core flops. Each pipe of an SM has a rate
per clock (CUDA C++ Programming Guide, "Arithmetic Instructions"; NVIDIA's dense tensor-core
peaks over SMs and the clock they are quoted at):

============  ======  ==========  =======  =====================================
architecture  issue   FMA pipe    MUFU     tensor cores (flops per clock)
============  ======  ==========  =======  =====================================
sm_90 (H200)  128     128         16       4,096 bf16 / fp16, 2,048 TF32 (wgmma)
sm_80 (A100)  128     64          16       2,048 bf16 / fp16, 1,024 TF32
============  ======  ==========  =======  =====================================

(issue: four schedulers of one warp instruction each; ``mma.sync`` on sm_90 is taken at
sm_80's rate). A pass's clocks per element are then the busiest pipe's when at least two
CTAs share an SM (one CTA's products overlap another's arithmetic), and the tensor cores'
plus the busiest other pipe's when only one does (its warpgroups move in lockstep: issue
52's diagnosis). That is a **lower bound**: it ignores memory latency, the loop's
synchronisation and the tiles that take the masks. A pass of ``R`` rows against ``C``
columns then takes at least ``R C clocks / (SMs x clock)``: :func:`milliseconds`, on an H200
(132 SMs at 1.83 GHz, the clock of its 989 TFLOP/s) for sm_90 and an A100 (108 SMs at
1.41 GHz) for sm_80. A GPU run checks it: ``benchmarks/bench_gpu.py`` times the passes apart.

Example: InfoNCE's forward at sm_90, bf16, 128 features issues 9.6 instructions per element
(0.075 clocks), one exponential (0.0625) and one 128-wide product (256 flops: 0.0625): it is
bound by issue, 0.075 clocks per element, 1.33 ms for 65,536 x 65,536 on an H200.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.kernel_build import Compiled

#: thread instructions issued per SM and clock (four schedulers, one warp instruction each)
ISSUE = 128
#: float32 additions / multiplications / multiply-adds per SM and clock
FP32 = {90: 128, 80: 64}
#: special-function operations (MUFU: exp2, log2, reciprocal, rsqrt, sin, cos) per SM and clock
MUFU = 16
#: dense tensor-core flops per SM and clock, by architecture and operand kind; sm_90's
#: ``mma.sync`` at sm_80's rate
TENSOR = {(90, "wgmma", "half"): 4096, (90, "wgmma", "tf32"): 2048,
          (90, "mma.sync", "half"): 2048, (90, "mma.sync", "tf32"): 1024,
          (80, "mma.sync", "half"): 2048, (80, "mma.sync", "tf32"): 1024}


@dataclass(frozen=True)
class Gpu:
    """The GPU a prediction is for."""

    name: str
    sms: int
    hertz: float


#: the GPU each architecture's predictions are for
GPUS = {90: Gpu("H200", 132, 1.83e9), 80: Gpu("A100", 108, 1.41e9)}


@dataclass(frozen=True)
class Bound:
    """A pass's clocks per tile element on one SM and the pipe that sets them."""

    clocks: float
    pipe: str  # "issue", "fp32", "mufu", "tensor" or "tensor+issue" (one CTA: no overlap)


def clocks_per_element(result: Compiled) -> Bound | None:
    """The lower bound of ``result``'s clocks per tile element (module docstring); ``None``
    where its main loop was not read or it did not compile."""
    if result.error is not None or result.instructions_per_element is None:
        return None
    arch = result.spec.arch
    pipes = {"issue": result.instructions_per_element / ISSUE,
             "fp32": result.fp32_per_element / FP32[arch],
             "mufu": result.mufu_per_element / MUFU}
    tensor = 0.0
    if result.flops_per_element:
        kind = "tf32" if result.spec.operands == "tf32" else "half"
        family = "wgmma" if result.mma_family in ("wgmma", "both") else "mma.sync"
        tensor = result.flops_per_element / TENSOR[(arch, family, kind)]
    busiest = max(pipes, key=pipes.get)
    if result.ctas().get("ctas", 0) >= 2 or tensor == 0.0:
        if tensor > pipes[busiest]:
            return Bound(tensor, "tensor")
        return Bound(pipes[busiest], busiest)
    return Bound(tensor + pipes[busiest], f"tensor+{busiest}")


def milliseconds(bound: Bound, arch: int, rows: int, columns: int) -> float:
    """The lower bound of one pass over ``rows x columns`` on ``GPUS[arch]``, in ms."""
    gpu = GPUS[arch]
    return rows * columns * bound.clocks / (gpu.sms * gpu.hertz) * 1e3


__all__ = ["GPUS", "Bound", "Gpu", "clocks_per_element", "milliseconds"]
