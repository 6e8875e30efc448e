"""The logits budget: when a materialised loss would not fit, take its exact tiled path.

A loss that materialises its ``[A, C]`` logits keeps about three float32 copies of that matrix
alive at its peak (the logits, their softmax in the backward buffer, the gradient). Measured
on the CPU with ``benchmarks/bench_tiled.py``'s peak-RSS method (growth of the peak RSS over
one forward+backward, in ``[A, C]`` float32 matrices, batch 2,048): 3.1-3.3 for InfoNCE, MACL,
FlatNCE, Dual temperature and the learned temperature (NT-Xent and cross-view forms; the
hardness term adds nothing), one more with multi-positive ``labels`` (4.2) and for DySTreSS's
pair temperatures (4.2), ASCL 6.6, ASCL-BYOL 6.7 (two matrices), AMCL 11.3 per head
(``"softmax"``) and 5.3 (``"topk"``), the survey losses 6.4-8.2. Each loss passes its count
(rounded up) to :func:`plan_tiles`. The tiled path (:mod:`adaptcl.plugins.tiles.loop`) computes the
same value and gradient in memory linear in the batch. :func:`plan_tiles` compares the materialised estimate, :func:`logits_peak_bytes`, with a
budget and picks the path:

* ``tile_size=T`` alone: always tiled with ``T`` (the user chose; unchanged behaviour);
* ``max_logits_bytes=B``: tiled when the estimate exceeds ``B``, materialised otherwise; the
  tile is ``T`` when given, else :func:`auto_tile_size` (the largest power of two whose
  ``[tile, tile]`` float32 temporaries fit ``B``, at most 2,048 on the CPU, which
  ``bench_tiled.py`` measures, and 16,384 on CUDA, where per-tile launches dominate below
  8,192: tile 2,048 -> 956 ms, 4,096 -> 253, 8,192 -> 178, 16,384 -> 168 ms at 65,536 pairs
  on an H200);
* neither: on CUDA the budget is :data:`CUDA_BUDGET_FRACTION` of the memory free to PyTorch
  on the inputs' device (``torch.cuda.mem_get_info`` plus what the caching allocator holds
  unused), read once per device and shape; on every other device no budget, so the CPU
  never switches by itself (its numbers stay bit for bit what they were).

A switch is said once per process and loss (a :class:`LogitsBudgetWarning`) and in
``last_stats["auto_tile_size"]`` (the tile used) on every call that took it. The decision
reads shapes only, never tensor values: no host-device synchronisation, and
``torch.compile(fullgraph=True)`` traces it (the device query and the warning run at trace
time, as constants).
"""

from __future__ import annotations

import warnings

import torch

from ..candidates import Candidates
from ._trace import constant_under_compile as _constant_under_compile

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
_CUDA_BUDGETS: dict[tuple[int, int], int] = {}


class LogitsBudgetWarning(UserWarning):
    """A loss took its tiled path because its materialised logits exceed the budget."""


def logits_peak_bytes(cands: list[Candidates], *, heads: int = 1,
                      copies: int = LOGIT_COPIES) -> int:
    """Estimated peak bytes of the materialised path: ``copies`` matrices ``[A, C]`` per
    direction (every direction's graph lives until the backward) and head, one more with
    multi-positive labels (their targets), in the kernel's dtype (float32, or float64 for
    float64 inputs; never narrower under autocast)."""
    size = max(4, cands[0].anchors.element_size())
    entries = sum(c.num_anchors * c.keys.shape[0] for c in cands)
    copies += cands[0].labels is not None
    return copies * entries * size * heads


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


def device_budget(device: torch.device, peak: int) -> int | None:
    """The default budget on ``device``: a share of CUDA's free memory, ``None`` elsewhere.

    Read once per device and estimated peak (that is, per shape) in eager mode; traced as a
    constant under ``torch.compile``.
    """
    if device.type != "cuda":
        return None
    index = 0 if device.index is None else device.index
    if torch.compiler.is_compiling():
        return _cuda_budget(index)
    key = (index, peak if isinstance(peak, int) else -1)
    if key not in _CUDA_BUDGETS:
        _CUDA_BUDGETS[key] = _cuda_budget(index)
    return _CUDA_BUDGETS[key]


@_constant_under_compile
def _cuda_budget(index: int) -> int:
    """A driver query (``cudaMemGetInfo``) and two allocator counters: no stream sync."""
    free, _ = torch.cuda.mem_get_info(index)
    unused = torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
    return int(CUDA_BUDGET_FRACTION * (free + unused))


def plan_tiles(method: str, cands: list[Candidates], tile_size: int | None,
               max_logits_bytes: int | None, *, heads: int = 1, copies: int = LOGIT_COPIES,
               tileable: bool = True, row_blocks: bool = False) -> tuple[int | None, int | None]:
    """``(tile size to run with, the tile the budget chose or None)`` for one call of
    ``method`` on ``cands`` (see the module docstring for the rules). ``tileable=False``
    (a loss whose configuration has no tiled path) never switches; ``row_blocks``: the tile
    is a number of anchor rows against every column (:func:`auto_tile_size`)."""
    if not tileable or (tile_size is not None and max_logits_bytes is None):
        return tile_size, None
    device = cands[0].anchors.device
    peak = logits_peak_bytes(cands, heads=heads, copies=copies)
    budget = max_logits_bytes if max_logits_bytes is not None else device_budget(device, peak)
    if budget is None or peak <= budget:
        return None, None
    if tile_size is not None:
        tile = tile_size
    else:
        columns = max(c.keys.shape[0] for c in cands) if row_blocks else None
        tile = auto_tile_size(budget, device.type, columns, copies)
    _say_once(method, str(device), budget, max_logits_bytes is None, tile,
              peak if isinstance(peak, int) else 0)
    return tile, tile


@_constant_under_compile
def _say_once(method: str, device: str, budget: int, by_default: bool, tile: int,
              peak: int) -> bool:
    """The warning, once per process for each loss, device, budget and tile (a constant
    under ``torch.compile``: it runs while tracing)."""
    key = (method, device, budget, tile)
    if key not in _SAID:
        _SAID.add(key)
        need = f"about {peak / 2**20:,.0f} MiB" if peak else "more"
        given = (f"{CUDA_BUDGET_FRACTION:.0%} of the free memory, the default budget" if by_default
                 else "max_logits_bytes")
        warnings.warn(
            f"{method}: the materialised logits would take {need} on {device}, over the "
            f"budget of {budget:,} bytes ({given}); computing the exact tiled path with "
            f"tile_size={tile} instead (same value and gradient to float rounding; "
            f"last_stats['auto_tile_size'] says so on each call). Pass tile_size= to choose "
            f"the tile or a larger max_logits_bytes= to materialise (shown once per process).",
            LogitsBudgetWarning, stacklevel=2)
    return True


__all__ = ["LogitsBudgetWarning", "logits_peak_bytes",
           "auto_tile_size", "device_budget", "plan_tiles"]
