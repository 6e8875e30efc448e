"""The logits budget: when a materialised loss would not fit, take its exact tiled path.

A loss that materialises its ``[A, C]`` logits keeps about three float32 copies of that matrix
alive at its peak (the logits, their softmax in the backward buffer, the gradient). Measured
on the CPU with ``benchmarks/bench_tiled.py``'s peak-RSS method (growth of the peak RSS over
one forward+backward, in ``[A, C]`` float32 matrices, batch 2,048): 3.1-3.3 for InfoNCE, MACL,
FlatNCE, Dual temperature and the learned temperature (NT-Xent and cross-view forms; the
hardness term adds nothing), one more with multi-positive ``labels`` (4.2) and for DySTreSS's
pair temperatures (4.2), ASCL 6.6, ASCL-BYOL 6.7 (two matrices), AMCL 11.3 per head
(``"softmax"``) and 5.3 (``"topk"``), the survey losses 6.4-8.2. Each loss passes its count
(rounded up) to the dispatcher (:mod:`~adaptcl.plugins.tiles._dispatch`), which asks
:func:`tile_over_budget` whether a ``tile_size="auto"`` call fits:

* the estimate is :func:`logits_peak_bytes`, from the problem's shapes alone;
* the budget is the scoped setting's ``max_logits_bytes``
  (:class:`~adaptcl.plugins.execution.tiling`) or, without one, :func:`device_budget`:
  on CUDA :data:`CUDA_BUDGET_FRACTION` of the memory free to PyTorch on the inputs' device
  (``torch.cuda.mem_get_info`` plus what the caching allocator holds unused), on every other
  device none, so the CPU never switches by itself (its numbers stay bit for bit what they
  were);
* over the budget the tile is :func:`auto_tile_size`: the largest power of two whose
  ``[tile, tile]`` float32 temporaries fit the budget, at most 2,048 on the CPU (what
  ``bench_tiled.py`` measures) and 16,384 on CUDA, where per-tile launches dominate below
  8,192 (tile 2,048 -> 956 ms, 4,096 -> 253, 8,192 -> 178, 16,384 -> 168 ms at 65,536 pairs on
  an H200).

When CUDA's budget is read. Not once for the life of the process (it would be read before the
optimiser's state exists): :func:`device_budget` reads the driver again whenever the caching
allocator's reserved bytes changed since its last read on that device (two host-side counters
and ``cudaMemGetInfo``, a driver query that does not synchronise any stream); in a steady
training loop the allocator stops growing after the first steps and nothing is read any more.
A shape that the default budget once switched to tiles stays tiled, at that tile, for the rest
of the process: a run changes path at most once per loss and shape, and never flips back and
forth with the allocator's state from step to step. Pass ``tiling(max_logits_bytes=...)`` for a
decision that depends on nothing but the shapes.

A switch is said once per process for each loss, device and tile (a
:class:`LogitsBudgetWarning`) and in ``last_stats["auto_tile_size"]`` (the tile used) on every
call that took it. The decision reads shapes and host-side counters only, never tensor values:
no host-device synchronisation, and ``torch.compile(fullgraph=True)`` traces it (the device
query and the warning run at trace time, as constants).
"""

from __future__ import annotations

import warnings

import torch

from .._trace import constant_under_compile as _constant_under_compile
from ._backend import Problem

#: float32 copies of the ``[A, C]`` matrix the materialised path holds at its peak
LOGIT_COPIES = 3
#: ``[tile, tile]`` float32 temporaries of one tiled step (logits, weights, term, slope)
TILE_TEMPORARIES = 4
#: the share of free CUDA memory the materialised logits may take by default: the estimate is
#: the loss's own peak; the rest of the step (the encoder's backward, the allocator's
#: fragmentation) needs room beside it, and tiling where the logits would fit costs 1-17 %
CUDA_BUDGET_FRACTION = 0.5
#: largest automatic tile per device type (others: the CPU's)
MAX_TILE = {"cpu": 2048, "cuda": 16384}
#: smallest automatic tile, however small the budget
MIN_TILE = 64

_SAID: set[tuple] = set()
#: per CUDA device index: (the allocator's reserved bytes when the budget was read, the budget)
_CUDA_BUDGETS: dict[int, tuple[int, int]] = {}
#: (loss, device, estimated peak) -> tile: the shapes the default budget switched to tiles
_SWITCHED: dict[tuple, int] = {}


class LogitsBudgetWarning(UserWarning):
    """A loss took its tiled path because its materialised logits exceed the budget."""


def logits_peak_bytes(problem: Problem) -> int:
    """Estimated peak bytes of the materialised path: ``problem.copies`` matrices ``[A, C]`` per
    direction (every direction's graph lives until the backward) and head, one more with
    multi-positive labels (their targets), in the kernel's dtype (float32, or float64 for
    float64 inputs; never narrower under autocast)."""
    size = max(4, problem.dtype.itemsize)
    return (problem.copies + problem.labels) * problem.logits * size * problem.heads


def auto_tile_size(budget: int, device_type: str, columns: int | None = None,
                   copies: int = LOGIT_COPIES) -> int:
    """The largest power of two in ``[MIN_TILE, MAX_TILE[device]]`` whose
    ``TILE_TEMPORARIES`` float32 ``[tile, tile]`` temporaries fit ``budget``; with
    ``columns``, whose ``copies`` ``[tile, columns]`` row blocks fit it (the losses that chunk
    anchors only, :func:`~adaptcl.plugins.base.in_row_blocks`)."""
    tile = MAX_TILE.get(device_type, MAX_TILE["cpu"])
    while tile > MIN_TILE and (TILE_TEMPORARIES * 4 * tile * tile if columns is None else
                               copies * 4 * tile * columns) > budget:
        tile //= 2
    return tile


def device_budget(device: torch.device) -> int | None:
    """The default budget on ``device``: a share of CUDA's free memory, ``None`` elsewhere.

    Read again whenever the caching allocator's reserved bytes on the device changed since the
    last read (module docstring) in eager mode; traced as a constant under ``torch.compile``.
    """
    if device.type != "cuda":
        return None
    index = torch.cuda.current_device() if device.index is None else device.index
    if torch.compiler.is_compiling():
        return _cuda_budget(index)
    reserved = torch.cuda.memory_reserved(index)
    read = _CUDA_BUDGETS.get(index)
    if read is None or read[0] != reserved:
        read = _CUDA_BUDGETS[index] = (reserved, _cuda_budget(index))
    return read[1]


@_constant_under_compile
def _cuda_budget(index: int) -> int:
    """A driver query (``cudaMemGetInfo``) and two allocator counters: no stream sync."""
    free, _ = torch.cuda.mem_get_info(index)
    unused = torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
    return int(CUDA_BUDGET_FRACTION * (free + unused))


def tile_over_budget(problem: Problem, max_logits_bytes: int | None) -> int | None:
    """The tile to run ``problem`` with when its materialised logits exceed the budget
    (``max_logits_bytes``, else :func:`device_budget`), or ``None`` when they fit or there is no
    budget. A row-block problem's tile is a number of anchor rows against every column
    (:func:`auto_tile_size`). Says a switch once (:class:`LogitsBudgetWarning`)."""
    device = problem.device
    peak = logits_peak_bytes(problem)
    by_default = max_logits_bytes is None
    known = peak if isinstance(peak, int) else None  # a symbolic size under dynamic shapes
    key = (problem.method, str(device), -1 if known is None else known)
    if by_default and key in _SWITCHED and not torch.compiler.is_compiling():
        return _SWITCHED[key]  # one way: a shape the default budget tiled stays tiled
    budget = device_budget(device) if by_default else max_logits_bytes
    if budget is None or peak <= budget:
        return None
    columns = (max(cols for _, cols in problem.shapes) if problem.op == "row_blocks"
               else None)
    tile = auto_tile_size(budget, device.type, columns, problem.copies)
    if by_default and not torch.compiler.is_compiling():
        _SWITCHED[key] = tile
    _say_once(problem.method, str(device), budget, by_default, tile, known or 0)
    return tile


def _size(n: int) -> str:
    """``n`` bytes as people read them: ``"768 bytes"``, ``"1.5 KiB"``, ``"48 MiB"``,
    ``"3.02 GiB"`` (three significant figures, more for thousands of GiB)."""
    unit, scale = next(((u, s) for u, s in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
                        if n >= s), ("bytes", 1))
    value = n / scale
    return f"{value:,.0f} {unit}" if value >= 1000 or scale == 1 else f"{value:.3g} {unit}"


@_constant_under_compile
def _say_once(method: str, device: str, budget: int, by_default: bool, tile: int,
              peak: int) -> bool:
    """The warning, once per process for each loss, device and tile (a constant under
    ``torch.compile``: it runs while tracing)."""
    key = (method, device, tile)
    if key not in _SAID:
        _SAID.add(key)
        need = f"about {_size(peak)}" if peak else "more"
        given = (f"{CUDA_BUDGET_FRACTION:.0%} of the free memory, the default budget" if by_default
                 else "tiling(max_logits_bytes=...)")
        warnings.warn(
            f"{method}: the materialised logits would take {need} on {device}, over the "
            f"budget of {budget:,} bytes ({given}); computing the exact tiled path with "
            f"tile_size={tile} instead (same value and gradient to float rounding; "
            f"last_stats['auto_tile_size'] says so on each call). Pass tile_size= to choose "
            f"the tile, or a larger tiling(max_logits_bytes=...) to materialise (shown once "
            f"per process).",
            LogitsBudgetWarning, stacklevel=2)
    return True


__all__ = ["LogitsBudgetWarning", "logits_peak_bytes", "auto_tile_size", "device_budget",
           "tile_over_budget"]
