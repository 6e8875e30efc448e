"""What the dispatcher hands a backend: one loss call as a frozen :class:`Problem`, and the
:class:`Backend` protocol every backend answers.

A backend is one file: a class with a ``name``, the ``ops`` it streams, ``why_not(problem)``
(``None``: it can run this call; else one phrase saying why not) and the ops themselves, plus
one line registering an instance in :mod:`~adaptcl.plugins.tiles._dispatch`. The built-in ones:
the PyTorch tile loop (``"torch"``, :mod:`~adaptcl.plugins.tiles._loop`, the reference, which
runs every op) and the fused Triton kernels (``"triton"``,
:mod:`~adaptcl.plugins.tiles._kernel_backend`). As ``scaled_dot_product_attention`` asks each of
its backends whether it can run the call, the dispatcher asks each of these; nothing else in the
core names a backend.

The ops (``Problem.op``: what the call streams; a backend lists those it has in ``ops``):

* ``"row_stats"``: ``(lse, sum_j u_ij l_ij, sum_j u_ij)`` of ``l = term(a @ k.T)`` (the InfoNCE
  family, ASCL; differentiable in ``a`` and ``k``);
* ``"pair_lse"``: AMCL's ``logsumexp_j s_ij / tau(r_ij) - beta Omega(tau(r_ij))``;
* ``"top_columns"``: AMCL's top-kappa selection over every column and the sum of the pair
  temperatures (its gradient flows through ordinary autograd on the gathered columns);
* ``"row_blocks"``: the losses that only chunk their anchors (ASCL-BYOL, the survey losses),
  each block under activation checkpointing.

The gradient-free passes some of them take first (ASCL's sharpened-softmax statistics and top
columns, AMCL's pair sums) are a backend's own where it defines them, else the reference loop's
at the plan's tile (:mod:`~adaptcl.plugins.tiles._dispatch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor

from ..execution import TilePlan
from ._terms import description

#: what one call streams (module docstring)
Op = Literal["row_stats", "pair_lse", "top_columns", "row_blocks"]


@dataclass(frozen=True)
class Problem:
    """One loss call as the dispatcher and every backend see it: shapes, dtypes, device and the
    typed descriptions of the math (:mod:`~adaptcl.plugins.tiles._terms`), never a tensor's
    values (deciding reads nothing from the device).

    A part (``weights``, ``bias``, ``term``, ``pair``) is ``None`` (absent), its description
    (a value of :mod:`~adaptcl.plugins.tiles._terms`), or a string naming a part that describes
    nothing a kernel knows (``"HardnessBias"``, ``"ASCL's soft targets (mode='ascl')"``).
    """

    method: str
    """the loss, as messages name it (``"InfoNCE"``, ``"AMCL"``)"""
    op: Op
    device: torch.device
    dtype: torch.dtype
    """the anchors' dtype (float32, or float64; the keys' is ``key_dtype``)"""
    key_dtype: torch.dtype
    precision: str
    """the products' precision (:mod:`~adaptcl.plugins._products`)"""
    shapes: tuple[tuple[int, int], ...]
    """``(anchors, candidates)`` of each direction"""
    width: int
    """the features of the anchors and keys"""
    form: str
    """the candidate set, as the candidates show it: ``"nt_xent"``, ``"cross_view"``,
    ``"cross_view_symmetric"`` or ``"queue"``"""
    masks: int
    """columns excluded per row (the positive, the anchor itself, extra ones)"""
    labels: bool = False
    """multi-positive targets from labels"""
    weights: object = None
    bias: object = None
    term: object = None
    pair: object = None
    heads: int = 1
    """calls of these shapes alive until the backward (AMCL's heads)"""
    copies: int = 3
    """``[A, C]`` matrices of the materialised path at its peak (the budget's estimate)"""
    tileable: bool = True
    """``False``: this configuration has no tiled path (an AMCL network that cannot be tiled)"""

    @property
    def logits(self) -> int:
        """``[A, C]`` entries over every direction (one head)."""
        return sum(rows * cols for rows, cols in self.shapes)


class Backend(Protocol):
    """What the dispatcher asks of a backend (module docstring)."""

    name: str
    """its name in ``tiling(backend=...)`` and in ``last_stats.plan.path``"""
    ops: frozenset[str]
    """the ops it streams"""
    own_blocks: bool
    """it runs its own blocks: an int ``tile_size`` (a tile of the loop) is not its tile"""

    def why_not(self, problem: Problem) -> str | None:
        """Why it cannot run ``problem`` (one phrase), or ``None``: it can."""
        ...

    def auto_why_not(self, problem: Problem) -> str | None:
        """Why ``backend="auto"`` does not take it for a tiled call it can run (``None``: it
        does), e.g. the kernels off tensor cores."""
        ...

    def pays(self, problem: Problem) -> bool:
        """Whether ``tile_size="auto"`` takes it before materialising (the kernels from
        ``KERNEL_FROM_LOGITS`` logits on)."""
        ...

    def row_stats(self, plan: TilePlan, a: Tensor, k: Tensor, masks: tuple, weights: object,
                  bias: object, term: object) -> tuple[Tensor, Tensor, Tensor]:
        """The ``"row_stats"`` op (:func:`~adaptcl.plugins.tiles._loop.streamed_row_stats`)."""
        ...

    def pair_lse(self, plan: TilePlan, a: Tensor, k: Tensor, pa: Tensor, pk: Tensor,
                 masks: tuple, pair: object) -> tuple[Tensor, Tensor]:
        """The ``"pair_lse"`` op (:func:`~adaptcl.plugins.tiles._loop.streamed_pair_lse`)."""
        ...


def part(obj: object) -> object:
    """What a :class:`Problem` holds of a part: ``None``, its description (``describe()``),
    or its name (a ``name`` attribute, else its type's name) when it describes nothing."""
    if obj is None or isinstance(obj, str):
        return obj
    described = description(obj)
    return getattr(obj, "name", type(obj).__name__) if described is None else described


__all__ = ["Op", "Problem", "Backend", "part"]
