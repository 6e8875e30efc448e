"""Argument handling shared by the sentence-transformers losses (private to this package):
sentence-transformers' ``scale`` and ``similarity_fct``, its positional order, its gather."""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from collections.abc import Callable
from typing import Any

from torch import Tensor

from adaptcl.adapters import require

require("sentence_transformers", "text")

from sentence_transformers.util import all_gather_with_grad, cos_sim, get_world_size  # noqa: E402


def _gather_fn(tensor: Tensor) -> list[Tensor]:
    """sentence-transformers' gradient-carrying all-gather, split back per rank."""
    return list(all_gather_with_grad(tensor).chunk(get_world_size()))


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def _gather_kwargs(gather_across_devices: Any) -> dict[str, Any]:
    """The core's gather arguments: sentence-transformers' gradient-carrying all-gather."""
    gather = _check_bool("gather_across_devices", gather_across_devices)
    return {"gather_distributed": gather, "gather_fn": _gather_fn if gather else None}


def _check_optional_count(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def _resolve_temperature(temperature: float | None, scale: float | None, default: float = 0.05, *,
                         stacklevel: int = 5) -> float:
    """The temperature from ``temperature`` or sentence-transformers' ``scale`` (= 1 / temperature).

    >>> _resolve_temperature(None, 20.0)
    0.05
    """
    if scale is None:
        return default if temperature is None else temperature
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0 or not math.isfinite(scale):
        raise ValueError(f"scale must be a positive finite number (scale = 1 / temperature), got {scale!r}")
    if scale < 1:
        warnings.warn(f"scale={scale} is temperature {1.0 / scale:g} (scale = 1 / temperature, the second "
                      f"positional argument as in MultipleNegativesRankingLoss); pass temperature={scale} "
                      f"if a temperature was meant", UserWarning, stacklevel=stacklevel)
    if temperature is not None and not math.isclose(temperature, 1.0 / scale):
        raise ValueError(f"pass temperature or scale, not both: temperature={temperature} but "
                         f"scale={scale} means temperature={1.0 / scale}")
    return 1.0 / scale


def _check_similarity_fct(similarity_fct: Callable | None) -> None:
    """Only cosine similarity has a meaning here: the cores normalise the embeddings and the
    adaptive temperatures are defined on cosines (MACL's alignment, ASCL's sharpening)."""
    if similarity_fct is None or similarity_fct is cos_sim:
        return
    if not callable(similarity_fct):
        raise TypeError(f"similarity_fct must be a similarity function such as "
                        f"sentence_transformers.util.cos_sim, got {type(similarity_fct).__name__} "
                        f"{similarity_fct!r}: the positional arguments are (model, scale, "
                        f"similarity_fct) as in MultipleNegativesRankingLoss; pass the others by "
                        f"keyword, e.g. temperature=0.05, alpha=2.0")
    name = getattr(similarity_fct, "__name__", type(similarity_fct).__name__)
    raise ValueError(f"similarity_fct={name} is not supported: adaptcl's losses compare cosine "
                     "similarities (sentence_transformers.util.cos_sim, the default); normalise or "
                     "rescale through temperature/scale instead")


def _positional_like_the_peer(init: Callable) -> Callable:
    """Reject positional arguments beyond those of ``init``'s signature with a ``TypeError``
    that names the keywords to use instead.

    The positional order follows ``MultipleNegativesRankingLoss(model, scale, similarity_fct,
    ...)`` (and its cached and symmetric variants, which agree up to ``similarity_fct``) for the
    losses that stand in for it; everything else is keyword-only, so ``InfoNCELoss(model, 20.0)``
    is scale 20 as with the peer and ``AMCLLoss(model, 20.0)`` (no scale: AMCL learns its
    temperatures) is an error rather than 20 heads.
    """
    parameters = list(inspect.signature(init).parameters.values())[1:]  # without self
    positional = [p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    keywords = [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(positional):
            name = type(self).__name__
            extra = ", ".join(repr(a) for a in args[len(positional):])
            takes = (f"({', '.join(positional)}) positionally, in the order of sentence-transformers' "
                     f"MultipleNegativesRankingLoss" if "scale" in positional else
                     f"only {positional[0]} positionally ({name} has no single scale)")
            raise TypeError(
                f"{name} takes {takes}; got {len(args)} positional arguments. Pass {extra} by keyword, "
                f"e.g. {name}(model, {keywords[0]}=...); keywords: {', '.join(keywords)}")
        init(self, *args, **kwargs)

    return checked
