"""The dispatcher: which path computes a loss call's row statistics, decided once per call.

A loss describes its call as one frozen :class:`~adaptcl.plugins.tiles._backend.Problem`
(:func:`describe`: shapes, dtypes, device, form, labels, masks, its parts' typed descriptions)
and hands it to :func:`plan` with its ``tile_size``; every op of the call then runs on the
plan's path through this module (:func:`row_stats`, :func:`pair_lse` and the gradient-free
passes :func:`softmax_stats`, :func:`streamed_top_columns`, :func:`pair_sum`). No method names a
backend, and no backend is asked anything but ``why_not(problem)`` and its ops.

The backends are registered here, in the order ``backend="auto"`` considers them: the fused
Triton kernels (``"triton"``, :mod:`~adaptcl.plugins.tiles._kernel_backend`), then the PyTorch
tile loop (``"torch"``, :mod:`~adaptcl.plugins.tiles._loop`), the reference that runs every op
on every device. A new backend is one file and one entry of :data:`BUILT_IN`.

The rules, from the loss's ``tile_size`` and the setting (:mod:`~adaptcl.plugins.execution`):

* ``tile_size=None`` materialises the ``[A, C]`` logits;
* an int is the PyTorch loop's tile, on every device and dtype (``tile x tile`` tiles; the
  rows of a block for the losses that chunk anchors): the kernels run blocks of their own,
  fixed per GPU architecture, so an int cannot be theirs;
* ``"auto"`` takes the fastest exact path that fits: a backend that pays before materialising
  (the kernels on CUDA, their products on tensor cores, from ``KERNEL_FROM_LOGITS`` logits);
  else the materialised logits while they fit the budget
  (:mod:`~adaptcl.plugins.tiles._budget`); beyond it the first backend ``"auto"`` takes (the
  kernels where they cover the case on CUDA's tensor cores, else the loop at the budget's
  tile). On the CPU, with no budget set, ``"auto"`` materialises: bit for bit what
  ``tile_size=None`` computes;
* ``tiling(backend="torch")`` (or another backend that takes tiles) runs every tiled call on
  it; ``tiling(backend="triton")`` (a backend with its own blocks) runs every call on it, or
  refuses it in one line naming why: a case it does not cover, no tiled path, or an explicit
  ``tile_size`` (``None`` or an int) that asks for something it does not do.

Nothing here reads a tensor's values, so nothing synchronises with the device, and
``torch.compile`` traces the decision (the setting is read and guarded while tracing).

Example:
    >>> import torch
    >>> from adaptcl.plugins import InfoNCELoss, tiling
    >>> z0, z1 = torch.randn(64, 16), torch.randn(64, 16)
    >>> loss_fn = InfoNCELoss(0.1, tile_size=16)
    >>> loss = loss_fn(z0, z1)
    >>> loss_fn.last_stats.plan.path, loss_fn.last_stats.plan.tile
    ('torch', 16)
"""

from __future__ import annotations

import warnings
from dataclasses import replace

from torch import Tensor

from .._trace import constant_under_compile
from ..candidates import Candidates
from ..execution import (
    TilePlan,
    TilingDebugWarning,
    _backend_named,
    _backends,
    _register_backend,
    current_tiling,
)
from ..validation import TileSize
from ._backend import Op, Problem, part
from ._budget import LOGIT_COPIES, auto_tile_size, device_budget, tile_over_budget
from ._kernel_backend import KernelBackend
from ._loop import LoopBackend, Masks, PairTerm, TileBias, TileTerm, TileWeights, top_columns

#: the backends, in the order ``backend="auto"`` considers them; the last is the reference
BUILT_IN = (KernelBackend(), LoopBackend())
for _backend in BUILT_IN:
    _register_backend(_backend)
_REFERENCE = BUILT_IN[-1]
#: the largest tile of a gradient-free pass that a backend leaves to the reference loop
_UNBOUNDED = 2**62


def describe(method: str, cands: list[Candidates], *, op: Op = "row_stats",
             weights: object = None, bias: object = None, term: object = None,
             pair: object = None, heads: int = 1, copies: int = LOGIT_COPIES,
             tileable: bool = True) -> Problem:
    """``method``'s call on ``cands`` (every direction) as a :class:`Problem`. ``weights``,
    ``bias``, ``term``, ``pair``: the parts (objects with a ``describe()``, or a string naming a
    part no kernel knows); ``heads`` calls of these shapes alive until the backward; ``copies``
    ``[A, C]`` matrices at the materialised peak; ``tileable=False``: no tiled path."""
    c = cands[0]
    if c.positive_index is None:
        form = "queue"
    elif c.self_index is not None:
        form = "nt_xent"
    else:
        form = "cross_view_symmetric" if len(cands) == 2 else "cross_view"
    return Problem(
        method=method, op=op, device=c.anchors.device, dtype=c.anchors.dtype,
        key_dtype=c.keys.dtype, precision=c.product_precision,
        shapes=tuple((d.num_anchors, d.keys.shape[0]) for d in cands),
        width=c.anchors.shape[1], form=form, masks=max(len(d.excluded) for d in cands),
        labels=c.labels is not None, weights=part(weights), bias=part(bias), term=part(term),
        pair=part(pair), heads=heads, copies=copies, tileable=tileable)


def plan(problem: Problem, tile_size: TileSize) -> TilePlan:
    """The path, tile and precision of ``problem`` by the rules of the module docstring; said
    as a :class:`~adaptcl.plugins.execution.TilingDebugWarning` under ``tiling(debug=True)``."""
    setting = current_tiling()
    chosen = _decide(problem, tile_size, setting.backend, setting.max_logits_bytes)
    if setting.debug:
        _say(problem.method, str(chosen))
    return chosen


def _decide(p: Problem, tile_size: TileSize, backend: str,
            max_logits_bytes: int | None) -> TilePlan:
    everyone = _backends()
    named = None if backend == "auto" else _backend_named(backend)

    def refuse(why: str) -> ValueError:
        return ValueError(f"tiling(backend={backend!r}) cannot run {p.method} here: {why}; use "
                          f"backend='auto' or 'torch'")

    def materialised(why: str) -> TilePlan:
        return TilePlan("materialise", precision=p.precision,
                        declined=tuple((b.name, why) for b in everyone))

    def on(b, tile: int | None = None, chosen: int | None = None,
           declined: tuple = ()) -> TilePlan:
        return TilePlan(b.name, None if b.own_blocks else tile, chosen, p.precision, declined)

    if tile_size is None:
        if named is not None and named.own_blocks:
            raise refuse("tile_size=None materialises the logits (pass tile_size='auto')")
        return materialised("tile_size=None materialises the logits")
    if isinstance(tile_size, int):
        if named is not None:
            if named.own_blocks:
                raise refuse(f"tile_size={tile_size} is a tile of the PyTorch loop, and it runs "
                             f"its own blocks (pass tile_size='auto')")
            why = _why_not(named, p)
            if why is not None:
                raise refuse(why)
            return on(named, tile_size)
        declined = []
        for b in everyone:
            why = (f"tile_size={tile_size} is the PyTorch loop's tile; it runs its own blocks "
                   f"(tile_size='auto' takes it)" if b.own_blocks else _why_not(b, p))
            if why is None:
                return on(b, tile_size, declined=tuple(declined))
            declined.append((b.name, why))
        raise AssertionError("the reference loop runs every problem")  # pragma: no cover
    if not p.tileable:
        if named is not None and named.own_blocks:
            raise refuse("this configuration has no tiled path")
        return materialised("this configuration has no tiled path")
    if named is not None:
        why = _why_not(named, p)
        if why is not None:
            raise refuse(why)
        if named.own_blocks:
            return on(named)
        tile = tile_over_budget(p, max_logits_bytes)
        if tile is None:
            return materialised("tile_size='auto' materialises: the logits fit the budget")
        return on(named, tile, tile)
    declined, ready = [], []
    for b in everyone:
        why = _why_not(b, p) or b.auto_why_not(p)
        if why is not None:
            declined.append((b.name, why))
        elif b.pays(p):
            return on(b, declined=tuple(declined))
        else:
            ready.append(b)
    tile = tile_over_budget(p, max_logits_bytes)
    if tile is None:
        fits = ("tile_size='auto' materialises: the logits fit the budget"
                if max_logits_bytes is not None or p.device.type == "cuda" else
                f"tile_size='auto' materialises: no budget is set on {p.device.type}")
        return TilePlan("materialise", precision=p.precision,
                        declined=(*declined, *((b.name, fits) for b in ready)))
    return on(ready[0], tile, tile, tuple(declined))


def _why_not(backend, problem: Problem) -> str | None:
    """``backend``'s answer; an op it does not stream is said for it where it does not."""
    why = backend.why_not(problem)
    if why is None and problem.op not in backend.ops:
        why = f"it has no {problem.op} op"
    return why


@constant_under_compile
def _say(method: str, plan: str) -> bool:
    """The debug switch's line (a constant under ``torch.compile``: said while tracing)."""
    warnings.warn(f"{method}: {plan}", TilingDebugWarning, stacklevel=4)
    return True


# --------------------------------------------------------------------------------------------
# The ops, each on the plan's backend
# --------------------------------------------------------------------------------------------

def row_stats(plan: TilePlan, a: Tensor, k: Tensor, masks: Masks,
              weights: TileWeights | None = None, *, bias: TileBias | None = None,
              term: TileTerm | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``(lse, sum_j u_ij l_ij, sum_j u_ij)`` of the masked ``term(a @ k.T)`` on ``plan``'s
    backend (:func:`~adaptcl.plugins.tiles._loop.streamed_row_stats`; ``plan`` is tiled)."""
    return _backend_named(plan.path).row_stats(plan, a, k, masks, weights, bias, term)


def pair_lse(plan: TilePlan, a: Tensor, k: Tensor, pa: Tensor, pk: Tensor, masks: Masks,
             pair: PairTerm) -> tuple[Tensor, Tensor]:
    """AMCL's pair log-sum-exp on ``plan``'s backend
    (:func:`~adaptcl.plugins.tiles._loop.streamed_pair_lse`)."""
    return _backend_named(plan.path).pair_lse(plan, a, k, pa, pk, masks, pair)


def softmax_stats(plan: TilePlan, q: Tensor, k: Tensor, temperature: float, masks: Masks, *,
                  top: int = 0) -> tuple[Tensor, Tensor, Tensor | None]:
    """ASCL's gradient-free first pass
    (:func:`~adaptcl.plugins.tiles._loop.streamed_softmax_stats`) for ``plan``."""
    backend, plan = _pass(plan, "softmax_stats", q)
    return backend.softmax_stats(plan, q, k, temperature, masks, top=top)


def streamed_top_columns(plan: TilePlan, a: Tensor, k: Tensor, masks: Masks, kappa: int,
                         extra: Tensor | None = None) -> Tensor:
    """AMCL's top-kappa columns (:func:`~adaptcl.plugins.tiles._loop.streamed_top_columns`)
    for ``plan``."""
    backend, plan = _pass(plan, "top_columns", a)
    return backend.top_columns(plan, a, k, masks, kappa, extra)


def pair_sum(plan: TilePlan, fn, a: Tensor, b: Tensor) -> Tensor:
    """``fn(a @ b.T).sum()`` without gradient (:func:`~adaptcl.plugins.tiles._loop.streamed_sum`)
    for ``plan``."""
    backend, plan = _pass(plan, "pair_sum", a)
    return backend.pair_sum(plan, fn, a, b)


def _pass(plan: TilePlan, op: str, like: Tensor) -> tuple[object, TilePlan]:
    """The backend of a gradient-free pass: the plan's where it has the op, else the reference
    loop, at the plan's tile, the budget's, or the largest the budget of the device allows."""
    backend = _backend_named(plan.path)
    if hasattr(backend, op):
        return backend, plan
    tile = plan.tile or plan.chosen
    if tile is None:
        budget = current_tiling().max_logits_bytes or device_budget(like.device) or _UNBOUNDED
        tile = auto_tile_size(budget, like.device.type)
    return _REFERENCE, replace(plan, tile=tile)


__all__ = ["BUILT_IN", "describe", "plan", "row_stats", "pair_lse", "softmax_stats",
           "streamed_top_columns", "pair_sum", "top_columns"]
