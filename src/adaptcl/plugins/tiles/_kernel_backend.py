"""The fused Triton kernels as a backend of the dispatcher, ``"triton"``
(:class:`~adaptcl.plugins.tiles._backend.Backend`): the kernels' own answer of what they cover
(:func:`~adaptcl.plugins.tiles._fused.why_not`), when ``backend="auto"`` takes them, and their
two ops. The gradient-free passes it has no kernel for run on the reference loop
(:mod:`~adaptcl.plugins.tiles._dispatch`).
"""

from __future__ import annotations

from torch import Tensor

from .._products import on_tensor_cores
from ..candidates import autocast_off
from ..execution import TilePlan
from . import _fused as fused
from ._backend import Problem

#: ``tile_size="auto"`` takes the kernels on CUDA from this many logits (``[A, C]`` entries
#: over every direction) on. It rests on one measurement (one H200, issue 47): cross-view
#: InfoNCE at 65,536 x 128 in bf16, forward+backward, took 27.5 ms on the kernel against
#: inf-cl's ``cal_flash_loss``, the exact streamed peer, at 121 ms (docs/gpu.md's H200 runs),
#: 4.4x at 2**32 entries. Below that nothing was measured; 2**26 (cross-view at 8,192 pairs,
#: NT-Xent at 4,096) keeps small batches, where materialising is cheap anyway, off the kernel
#: and its first-call compilation. ``benchmarks/bench_gpu.py`` (``make gpu-check``) measures
#: the crossover; set this from its table.
KERNEL_FROM_LOGITS = 2**26


class KernelBackend:
    """The fused kernels: one launch per pass, their own blocks per GPU architecture."""

    name = "triton"
    ops = frozenset({"row_stats", "pair_lse"})
    own_blocks = True

    def why_not(self, problem: Problem) -> str | None:
        return fused.why_not(problem)

    def auto_why_not(self, problem: Problem) -> str | None:
        if problem.device.type != "cuda":
            return f"backend='auto' takes it on CUDA only, the tensors are on {problem.device}"
        if not on_tensor_cores(problem.precision):
            return ("its products would be IEEE float32, off the tensor cores (backend='auto' "
                    "takes it for bf16 / fp16 inputs, or float32 at "
                    "torch.set_float32_matmul_precision('high'))")
        return None

    def pays(self, problem: Problem) -> bool:
        return problem.logits >= KERNEL_FROM_LOGITS

    def row_stats(self, plan: TilePlan, a: Tensor, k: Tensor, masks: tuple, weights: object,
                  bias: object, term: object) -> tuple[Tensor, Tensor, Tensor]:
        with autocast_off(a):
            return fused.fused_row_stats(a, k, masks, weights, term, plan.precision)

    def pair_lse(self, plan: TilePlan, a: Tensor, k: Tensor, pa: Tensor, pk: Tensor,
                 masks: tuple, pair: object) -> tuple[Tensor, Tensor]:
        with autocast_off(a):
            return fused.fused_pair_lse(a, k, pa, pk, masks, pair, plan.precision)


__all__ = ["KERNEL_FROM_LOGITS", "KernelBackend"]
