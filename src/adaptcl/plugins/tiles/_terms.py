"""The math a method hands to the tiles, described as typed values.

A method plugs into the tile loop with objects that compute (a
:class:`~adaptcl.plugins.tiles._loop.TileTerm`, :class:`~adaptcl.plugins.tiles._loop.TileWeights`,
:class:`~adaptcl.plugins.tiles._loop.PairTerm`). The fused kernels cannot run Python per tile, so
the same objects also *describe* what they compute, with the values below (their
``describe()``); the kernels' side (``_fused``) translates a description into its own codes,
and takes the PyTorch loop where a method describes nothing it knows. No method module names a
kernel code, and nothing here imports Triton.

* :class:`SimilarityTemperature`: logits ``s / tau(s)``, a per-pair temperature from the pair's
  cosine (DySTreSS);
* :class:`SameClassTargets`: multi-positive targets ``u_ij = [label_i == key_label_j]``;
* :class:`RegularisedPairTerm`: AMCL's ``s / tau(r) - beta Omega(tau(r))`` with the pair
  temperature ``tau(r)`` of :class:`SigmoidPairTemperature` or :class:`FixedPairTemperature`.

Example:
    >>> SimilarityTemperature("cosine", 0.1, 0.2).detach
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import Tensor

#: the temperature functions of :class:`SimilarityTemperature`
TemperatureShape = Literal["cosine", "piecewise"]


@dataclass(frozen=True)
class SimilarityTemperature:
    """Logits ``s / tau(s)`` of the cosines ``s``.

    ``shape="cosine"``: ``tau(s) = min + (max - min) / 2 (1 + cos(pi (1 + s)))``;
    ``"piecewise"``: ``max`` above ``threshold``, else
    ``min + (max - min) / 2 (1 + cos(pi (s - threshold) / width))``. ``detach``: the gradient
    of the logits is ``1 / tau`` (the temperature computed from detached cosines), else
    ``d (s / tau(s)) / d s``.
    """

    shape: TemperatureShape
    min_temperature: float
    max_temperature: float
    threshold: float = 0.4
    width: float = 0.7
    detach: bool = True


@dataclass(frozen=True, eq=False)
class SameClassTargets:
    """Un-normalised targets ``u_ij = [labels_i == key_labels_j]`` on the unmasked columns
    (``labels [A]``, ``key_labels [C]``; a key label ``-1`` matches no anchor)."""

    labels: Tensor
    key_labels: Tensor


@dataclass(frozen=True)
class SigmoidPairTemperature:
    """``tau(r) = scale * sigmoid(-clamp(r, -bound, bound)) + floor`` of ``r = <phi(a), phi(k)>``
    (AMCL's :class:`~adaptcl.plugins.PairTemperature`: ``scale`` is its ``iota``, ``floor`` its
    ``eta``, ``bound`` its ``clamp``)."""

    scale: float
    floor: float
    bound: float


@dataclass(frozen=True)
class FixedPairTemperature:
    """The same temperature for every pair (AMCL's :class:`~adaptcl.plugins.ConstantTemperature`)."""

    temperature: float


@dataclass(frozen=True)
class RegularisedPairTerm:
    """``s / tau - beta Omega(tau)``, ``Omega(tau) = (dim / 2) log tau + 1 / tau``, with
    ``tau = temperature(r)`` (AMCL's softmax term, Eq. 7)."""

    temperature: SigmoidPairTemperature | FixedPairTemperature
    beta: float
    dim: int


def description(obj: object) -> object | None:
    """What ``obj`` describes (its ``describe()``), or ``None`` when it describes nothing."""
    describe = getattr(obj, "describe", None)
    return None if describe is None else describe()


__all__ = ["TemperatureShape", "SimilarityTemperature", "SameClassTargets",
           "SigmoidPairTemperature", "FixedPairTemperature", "RegularisedPairTerm",
           "description"]
