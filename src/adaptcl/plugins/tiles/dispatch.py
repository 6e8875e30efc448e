"""The dispatcher: which path computes a loss's row statistics, planned once per call.

A loss's logits can be materialised (the ``[A, C]`` matrix, autograd's backward), or streamed
in tiles by the PyTorch tile loop (:mod:`~adaptcl.plugins.tiles.loop`) or by the fused Triton
kernel (private ``_fused``). Two controls choose, and nothing else:

* **the loss's** ``tile_size`` (``None``, an int or ``"auto"``, the default): ``None``
  materialises; an int tiles at that size; ``"auto"`` takes the fastest exact path that fits:
  on CUDA the kernel wherever it covers the case, its products run on tensor cores
  (:mod:`~adaptcl.plugins.tiles.precision`) and the logits are at least
  :data:`KERNEL_FROM_LOGITS` entries; otherwise the materialised logits while they fit the
  budget (:mod:`~adaptcl.plugins.tiles.budget`), and beyond it the tiled path at a tile chosen
  for the device. On the CPU, with no budget set, ``"auto"`` materialises: bit for bit what
  ``tile_size=None`` computes;
* **the scoped setting** :class:`tiling` (``backend``, ``max_logits_bytes``), as
  ``torch.nn.attention.sdpa_kernel`` chooses attention backends: ``backend="auto"`` (default)
  takes the kernel on CUDA where it covers the case and the products run on tensor cores, the
  loop elsewhere; ``"triton"`` the kernel for every tiled call or a one-line ``ValueError``
  naming why it cannot run (on CPU tensors only under Triton's interpreter,
  ``TRITON_INTERPRET=1``); ``"torch"`` the loop. ``max_logits_bytes`` is the budget of
  ``tile_size="auto"`` (``None``: half the free memory on CUDA, none elsewhere).

:func:`plan_tiles` makes the decision once per loss call, for every direction and head, from
the shapes, dtypes and devices alone (no tensor value is read: nothing synchronises with the
device) and returns a :class:`TilePlan`; :func:`row_stats` and :func:`pair_lse` then run it.
The losses describe their math (label targets, a bias, a term, a pair temperature) and never
name a backend; whether the kernel covers that math is the kernel's answer
(``_fused.unsupported`` / ``pair_unsupported``), asked here only.

Example:
    >>> import torch
    >>> from adaptcl.plugins import InfoNCELoss, tiling
    >>> z0, z1 = torch.randn(64, 16), torch.randn(64, 16)
    >>> with tiling(max_logits_bytes=2**30):   # this block only
    ...     loss = InfoNCELoss(0.1)(z0, z1)
    >>> current_tiling()
    TilingSetting(backend='auto', max_logits_bytes=None)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

from torch import Tensor

from ..candidates import Candidates, autocast_off
from ..validation import TileSize, check_choice, check_max_logits_bytes
from . import _fused as fused
from . import loop
from .budget import LOGIT_COPIES, tile_over_budget
from .precision import ProductPrecision, on_tensor_cores

#: what computes a tiled call: ``"auto"`` the fused Triton kernel on CUDA where it covers the
#: case and the products run on tensor cores, else the PyTorch loop; ``"triton"`` the kernel or
#: a one-line refusal; ``"torch"`` the loop
TileBackend = Literal["auto", "triton", "torch"]
TILE_BACKENDS: tuple[TileBackend, ...] = get_args(TileBackend)
#: how a call's row statistics are computed
TilePath = Literal["materialise", "loop", "kernel"]

#: ``tile_size="auto"`` takes the kernel on CUDA from this many logits (``[A, C]`` entries over
#: every direction) on. It rests on one measurement (one H200, issue 47): cross-view InfoNCE at
#: 65,536 x 128 in bf16, forward+backward, took 27.5 ms on the kernel against 120.8 ms for
#: cuBLAS on the whole matrix, 4.4x at 2**32 entries. Below that nothing was measured; 2**26
#: (cross-view at 8,192 pairs, NT-Xent at 4,096) keeps small batches, where materialising is
#: cheap anyway, off the kernel and its first-call compilation. ``benchmarks/bench_gpu.py``
#: (``make gpu-check``) measures the crossover; set this from its table.
KERNEL_FROM_LOGITS = 2**26


@dataclass(frozen=True)
class TilingSetting:
    """The scoped setting :class:`tiling` sets (:func:`current_tiling` reads it)."""

    backend: TileBackend = "auto"
    max_logits_bytes: int | None = None


_SETTING = TilingSetting()


class tiling:  # noqa: N801 - a function and a context manager, as torch.set_grad_enabled
    """Set what computes the tiles and the logits budget, process-wide or for a ``with`` block.

    Called, it sets the setting for the whole process (every thread: it is not thread-local,
    like ``sdpa_kernel``'s backends); used as a context manager, it also restores the setting
    it replaced on exit (exceptions included), so blocks nest, as ``torch.set_grad_enabled``.
    Each call sets both: an argument left out takes its default.

    Args:
        backend: ``"auto"`` (default), ``"triton"`` or ``"torch"`` (module docstring).
        max_logits_bytes: the bytes a ``tile_size="auto"`` loss's materialised logits may take
            (about three float32 ``[A, C]`` matrices at the peak) before it takes its exact
            tiled path; ``None`` (default): half the free memory on CUDA, no budget elsewhere
            (:mod:`~adaptcl.plugins.tiles.budget`).

    Under ``torch.compile`` the setting is read while tracing and guarded: a compiled loss
    recompiles when it changes. Set it outside the compiled function.

    Examples:
        >>> tiling(backend="torch")            # process-wide: the PyTorch loop from now on
        <...tiling object at ...>
        >>> with tiling(max_logits_bytes=2**30):  # restored on exit
        ...     pass
        >>> tiling()                           # back to the defaults
        <...tiling object at ...>
    """

    def __init__(self, backend: TileBackend = "auto", max_logits_bytes: int | None = None
                 ) -> None:
        global _SETTING
        setting = TilingSetting(check_choice("backend", backend, TILE_BACKENDS),
                                check_max_logits_bytes(max_logits_bytes))
        self.previous = _SETTING
        _SETTING = setting

    def __enter__(self) -> tiling:
        return self

    def __exit__(self, *exc: object) -> None:
        global _SETTING
        _SETTING = self.previous


def current_tiling() -> TilingSetting:
    """The setting :class:`tiling` set last (the defaults before any call)."""
    return _SETTING


@dataclass(frozen=True)
class TilePlan:
    """How one loss call computes its row statistics (:func:`plan_tiles`)."""

    path: TilePath
    """``"materialise"``, ``"loop"`` (the PyTorch tile loop) or ``"kernel"`` (fused Triton)"""
    tile: int | None = None
    """the loop's tile (rows of a row block for the losses that chunk anchors); ``None`` when
    materialised; the kernel runs its own blocks"""
    chosen: int | None = None
    """the tile the budget chose for ``tile_size="auto"`` (``last_stats["auto_tile_size"]``)"""
    precision: ProductPrecision = "ieee"
    """the products' precision on a tiled path (:mod:`~adaptcl.plugins.tiles.precision`: the
    candidates' :attr:`~adaptcl.plugins.candidates.Candidates.product_precision`)"""

    @property
    def tiled(self) -> bool:
        return self.path != "materialise"


MATERIALISED = TilePlan("materialise")


def plan_tiles(method: str, cands: list[Candidates], tile_size: TileSize, *,
               kernel: Callable[[], str | None] | None = None, heads: int = 1,
               copies: int = LOGIT_COPIES, tileable: bool = True,
               row_blocks: bool = False) -> TilePlan:
    """The path and tile of one call of ``method`` on ``cands`` (every direction; ``heads``
    calls on candidates of these shapes), by the rules of the module docstring.

    Args:
        kernel: says why the kernel cannot compute this call (``None``: it can), asked only
            where the answer matters; ``None``: the loss has no kernel path.
        copies: ``[A, C]`` matrices of the materialised path at its peak (the budget's
            estimate, :func:`~adaptcl.plugins.tiles.budget.logits_peak_bytes`).
        tileable: ``False``: this configuration has no tiled path; ``"auto"`` materialises.
        row_blocks: the tile is a number of anchor rows against every column (the losses that
            chunk anchors, :func:`~adaptcl.plugins.base.in_row_blocks`).
    """
    if tile_size is None or (tile_size == "auto" and not tileable):
        return MATERIALISED
    backend = _SETTING.backend
    why = _once(kernel if kernel is not None else lambda: f"{method} has no kernel path")
    precision = cands[0].product_precision
    if tile_size != "auto":
        return TilePlan(_tiled_path(backend, cands, why), tile_size, precision=precision)
    if backend == "triton" or (backend == "auto" and _kernel_pays(cands, why)):
        return TilePlan(_tiled_path(backend, cands, why), precision=precision)
    tile = tile_over_budget(method, cands, _SETTING.max_logits_bytes, heads=heads,
                            copies=copies, row_blocks=row_blocks)
    if tile is None:
        return MATERIALISED
    return TilePlan(_tiled_path(backend, cands, why), tile, chosen=tile, precision=precision)


def _once(fn: Callable[[], str | None]) -> Callable[[], str | None]:
    """``fn``, called at most once (a closure, which ``torch.compile`` traces)."""
    answer: list[str | None] = []

    def once() -> str | None:
        if not answer:
            answer.append(fn())
        return answer[0]
    return once


def _on_tensor_cores(c: Candidates) -> bool:
    return on_tensor_cores(c.product_precision)


def _kernel_pays(cands: list[Candidates], why: Callable[[], str | None]) -> bool:
    """``"auto"``'s test for taking the kernel before asking the budget: CUDA, tensor cores,
    logits large enough that it beats materialising, and a case it covers."""
    c = cands[0]
    return (c.anchors.device.type == "cuda" and _on_tensor_cores(c)
            and sum(d.num_anchors * d.keys.shape[0] for d in cands) >= KERNEL_FROM_LOGITS
            and why() is None)


def _tiled_path(backend: str, cands: list[Candidates],
                why: Callable[[], str | None]) -> TilePath:
    """The backend of a tiled call: the loop or the kernel (``"triton"`` refuses in one line
    what the kernel cannot compute)."""
    if backend == "torch":
        return "loop"
    if backend == "triton":
        reason = why()
        if reason is not None:
            raise ValueError(f"tiling(backend='triton') cannot run here: {reason}; use "
                             f"backend='auto' or 'torch'")
        return "kernel"
    c = cands[0]
    on_kernel = c.anchors.device.type == "cuda" and _on_tensor_cores(c) and why() is None
    return "kernel" if on_kernel else "loop"


def why_not_kernel(c: Candidates, weights: object = None, bias: object = None,
                   term: object = None) -> str | None:
    """Why the kernel cannot stream ``c``'s row statistics with these parts (``weights`` a
    :class:`~adaptcl.plugins.tiles.loop.TileWeights`, ``bias`` a ``TileBias``, ``term`` a
    ``TileTerm``), or ``None``: the kernel's own answer."""
    return fused.unsupported(c.anchors, c.keys, c.excluded, weights, bias, term)


def why_not_pair_kernel(c: Candidates, pair: object) -> str | None:
    """:func:`why_not_kernel` for AMCL's pair log-sum-exp with the pair term ``pair``. The
    temperature network's features enter the kernel in the anchors' dtype (the loss casts
    them), so the anchors and keys stand for them here."""
    return fused.pair_unsupported(c.anchors, c.keys, c.anchors, c.keys, c.excluded, pair,
                                  c.product_precision)


def row_stats(plan: TilePlan, a: Tensor, k: Tensor, masks: loop.Masks,
              weights: loop.TileWeights | None = None, *, bias: loop.TileBias | None = None,
              term: loop.TileTerm | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`~adaptcl.plugins.tiles.loop.streamed_row_stats` on ``plan``'s path (the kernel
    or the loop; ``plan`` is tiled)."""
    if plan.path == "kernel":
        with autocast_off(a):
            return fused.fused_row_stats(a, k, masks, weights, term, plan.precision)
    return loop.streamed_row_stats(a, k, plan.tile, masks, weights, bias=bias, term=term,
                                   precision=plan.precision)


def pair_lse(plan: TilePlan, a: Tensor, k: Tensor, pa: Tensor, pk: Tensor, masks: loop.Masks,
             pair: loop.PairTerm) -> tuple[Tensor, Tensor]:
    """:func:`~adaptcl.plugins.tiles.loop.streamed_pair_lse` on ``plan``'s path."""
    if plan.path == "kernel":
        with autocast_off(a):
            return fused.fused_pair_lse(a, k, pa, pk, masks, pair, plan.precision)
    return loop.streamed_pair_lse(a, k, pa, pk, plan.tile, masks, pair, plan.precision)


__all__ = ["TileBackend", "TILE_BACKENDS", "TilePath", "KERNEL_FROM_LOGITS", "TilingSetting",
           "tiling", "current_tiling", "TilePlan", "plan_tiles", "why_not_kernel",
           "why_not_pair_kernel", "row_stats", "pair_lse"]
