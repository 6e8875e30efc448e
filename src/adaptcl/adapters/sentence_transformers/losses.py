"""The losses: InfoNCE (as ``MultipleNegativesRankingLoss``), MACL, ASCL, AMCL and DySTreSS.

Where sentence-transformers defines a behaviour the losses follow it: the positional arguments
are ``MultipleNegativesRankingLoss``'s, ``(model, scale, similarity_fct)`` (``InfoNCELoss(model,
20.0)`` is scale 20, temperature 0.05), everything else is keyword-only (``AMCLLoss``, which
learns its temperatures, takes only the model positionally; an extra positional argument is a
``TypeError`` naming the keywords); ``scale`` (1 / temperature) and ``similarity_fct=cos_sim``
are accepted, a batch of one pair gives 0 with zero gradient like
``MultipleNegativesRankingLoss``, and ``symmetric=True`` is the peer's symmetric loss: the
reverse direction (positive -> anchors) does not see the hard-negative columns. The peer's
``hardness_mode`` / ``hardness_strength`` (sentence-transformers 6.2) are accepted by
``InfoNCELoss``, ``MACLLoss``, ``ASCLLoss`` and ``DySTreSSLoss`` with the peer's meaning
(:mod:`adaptcl.plugins.hardness`). ``InfoNCELoss``, ``MACLLoss`` and ``DySTreSSLoss`` take the
peer's ``directions`` / ``partition_mode``: every setting it accepts, with its values (a joint
softmax over several terms is built by ``_directions.joint_candidates``). ``use_labels=True``
reads the dataset's label column as classes (multi-positive targets, SupCon) for InfoNCE, MACL
and DySTreSS.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from adaptcl import plugins
from adaptcl.adapters import require
from adaptcl.plugins.amcl import NegativeTerm, Objective
from adaptcl.plugins.ascl import ASCLMode
from adaptcl.plugins.dystress import Shape
from adaptcl.plugins.hardness import HardnessMode
from adaptcl.plugins.macl import TemperatureForm
from adaptcl.plugins.validation import TileSize

require("sentence_transformers", "text")

from ._arguments import (  # noqa: E402
    _check_similarity_fct,
    _gather_kwargs,
    _positional_like_the_peer,
    _resolve_temperature,
)
from ._directions import DIRECTIONS, PARTITION_MODES, Direction, PartitionMode  # noqa: E402
from .base import AdaptiveContrastiveLoss, embedding_dimension  # noqa: E402
from .citations import (  # noqa: E402
    AMCL_CITATION,
    ASCL_CITATION,
    DYSTRESS_CITATION,
    MACL_CITATION,
)

__all__ = ["AMCLLoss", "ASCLLoss", "DySTreSSLoss", "InfoNCELoss", "MACLLoss", "Direction",
           "DIRECTIONS", "PartitionMode", "PARTITION_MODES"]


class _ScalarTemperatureLoss(AdaptiveContrastiveLoss):
    """A loss with one temperature, given as ``temperature`` or sentence-transformers' ``scale``
    (1 / temperature) and settable as either; the core is ``core_cls(temperature, *core_args,
    **core_kwargs)`` in the cross-view form."""

    def __init__(self, model: nn.Module | None, core_cls: type[nn.Module], *core_args: Any,
                 temperature: float | None, scale: float | None, similarity_fct: Callable | None,
                 core_kwargs: dict[str, Any], gather_across_devices: bool, check_finite: bool,
                 tile_size: TileSize, **base_kwargs: Any) -> None:
        self._check_model(model)
        _check_similarity_fct(similarity_fct)
        core = core_cls(_resolve_temperature(temperature, scale), *core_args, form="cross_view",
                        check_finite=check_finite, tile_size=tile_size,
                        **_gather_kwargs(gather_across_devices), **core_kwargs)
        super().__init__(model, core, gather_across_devices=gather_across_devices, **base_kwargs)

    @property
    def scale(self) -> float:
        return 1.0 / float(self.core.temperature)

    @scale.setter
    def scale(self, value: float) -> None:
        self.core.temperature = _resolve_temperature(None, value, stacklevel=4)


class InfoNCELoss(_ScalarTemperatureLoss):
    """InfoNCE in the direction anchor -> candidates, like ``MultipleNegativesRankingLoss``.

    ``InfoNCELoss(model, temperature=0.05)`` (or ``scale=20``, or ``InfoNCELoss(model, 20.0)``:
    the positional order is the peer's, ``(model, scale, similarity_fct)``, the rest
    keyword-only) equals ``MultipleNegativesRankingLoss(model, scale=20)``; ``symmetric=True``
    (or the peer's ``directions=("query_to_doc", "doc_to_query"),
    partition_mode="per_direction"``) equals its symmetric form
    (``MultipleNegativesSymmetricRankingLoss``), with or without hard negatives; every other
    ``directions`` / ``partition_mode`` the peer accepts (``query_to_query``, ``doc_to_doc``,
    a joint softmax) equals the peer too, and ``hardness_mode`` / ``hardness_strength`` equal
    the peer's in every mode. A batch of one
    pair gives 0, as the peer does. ``use_labels=True``: SupCon on the dataset's classes.

    Example:
        >>> loss = InfoNCELoss(model, 20.0)   # MultipleNegativesRankingLoss(model, 20.0)
        >>> hard = InfoNCELoss(model, hardness_mode="in_batch_negatives", hardness_strength=9.0)
    """

    @_positional_like_the_peer
    def __init__(self, model: nn.Module | None, scale: float | None = None,
                 similarity_fct: Callable | None = None, *, temperature: float | None = None,
                 symmetric: bool = False, directions: Sequence[Direction] | None = None,
                 partition_mode: PartitionMode | None = None,
                 hardness_mode: HardnessMode | None = None,
                 hardness_strength: float = 0.0, use_labels: bool = False,
                 projection: nn.Module | None = None,
                 gather_across_devices: bool = False, tile_size: TileSize = "auto",
                 mini_batch_size: int | None = None, mini_batch_num_tokens: int | None = None,
                 check_finite: bool = True, show_progress_bar: bool = False) -> None:
        super().__init__(model, plugins.InfoNCELoss, temperature=temperature, scale=scale,
                         similarity_fct=similarity_fct,
                         core_kwargs={"hardness_mode": hardness_mode,
                                      "hardness_strength": hardness_strength},
                         gather_across_devices=gather_across_devices,
                         check_finite=check_finite, tile_size=tile_size, projection=projection,
                         mini_batch_size=mini_batch_size, mini_batch_num_tokens=mini_batch_num_tokens,
                         symmetric=symmetric, directions=directions, partition_mode=partition_mode,
                         show_progress_bar=show_progress_bar, use_labels=use_labels)

    def get_config_dict(self) -> dict[str, Any]:
        return {"temperature": self.core.temperature, "symmetric": self.symmetric,
                **super().get_config_dict()}


class MACLLoss(_ScalarTemperatureLoss):
    """MACL (Huang et al., ICML 2023) for sentence embeddings.

    Defaults are the paper's SimCSE setting: tau0 = 0.05, alpha = 2, A0 = 0.8, no reweighting
    ("the results are not sensitive to batch size, so we did not apply reweighting"). The
    adaptive temperature is clamped at ``min_temperature`` (default tau0 / 10). ``scale`` sets
    tau0 as 1 / scale. Positional arguments as ``MultipleNegativesRankingLoss``: ``(model,
    scale, similarity_fct)``; ``temperature``, ``alpha``, ``a0`` and the rest are keyword-only.
    With ``alpha=0`` it equals the peer, ``directions`` / ``partition_mode`` and
    ``hardness_mode`` / ``hardness_strength`` included; ``use_labels=True`` (with
    ``reweight=False``) trains MACL's temperature on SupCon's targets.
    """

    citation_text = MACL_CITATION

    @_positional_like_the_peer
    def __init__(self, model: nn.Module | None, scale: float | None = None,
                 similarity_fct: Callable | None = None, *, temperature: float | None = None,
                 alpha: float = 2.0, a0: float = 0.8, reweight: bool = False, adaptive: bool = True,
                 temperature_form: TemperatureForm = "linear", min_temperature: float | None = None,
                 symmetric: bool = False, directions: Sequence[Direction] | None = None,
                 partition_mode: PartitionMode | None = None,
                 hardness_mode: HardnessMode | None = None,
                 hardness_strength: float = 0.0, use_labels: bool = False,
                 projection: nn.Module | None = None,
                 gather_across_devices: bool = False, tile_size: TileSize = "auto",
                 mini_batch_size: int | None = None, mini_batch_num_tokens: int | None = None,
                 check_finite: bool = True, show_progress_bar: bool = False) -> None:
        super().__init__(model, plugins.MACLLoss, alpha, a0, temperature=temperature, scale=scale,
                         similarity_fct=similarity_fct,
                         core_kwargs={"reweight": reweight, "adaptive": adaptive,
                                      "temperature_form": temperature_form,
                                      "min_temperature": min_temperature,
                                      "hardness_mode": hardness_mode,
                                      "hardness_strength": hardness_strength},
                         gather_across_devices=gather_across_devices, check_finite=check_finite,
                         tile_size=tile_size,
                         projection=projection, mini_batch_size=mini_batch_size,
                         mini_batch_num_tokens=mini_batch_num_tokens,
                         symmetric=symmetric, directions=directions, partition_mode=partition_mode,
                         show_progress_bar=show_progress_bar, use_labels=use_labels)

    def get_config_dict(self) -> dict[str, Any]:
        c = self.core
        return {"temperature": c.temperature, "alpha": c.alpha, "a0": c.a0, "reweight": c.reweight,
                "adaptive": c.adaptive, "temperature_form": c.temperature_form,
                "min_temperature": c.min_temperature, "symmetric": self.symmetric,
                **super().get_config_dict()}


class ASCLLoss(_ScalarTemperatureLoss):
    """ASCL (Feng & Patras, 2022) with in-batch soft labels: the other positives of the batch
    are the negatives, and those closest to an anchor's own positive get soft target mass.

    Positional arguments as ``MultipleNegativesRankingLoss``: ``(model, scale,
    similarity_fct)``; ``temperature`` and the rest are keyword-only. ``hardness_mode`` /
    ``hardness_strength`` are the peer's; the term enters the denominator, the soft targets
    weigh the plain logits.
    """

    citation_text = ASCL_CITATION

    @_positional_like_the_peer
    def __init__(self, model: nn.Module | None, scale: float | None = None,
                 similarity_fct: Callable | None = None, *, temperature: float | None = None,
                 sharpen_temperature: float = 0.025, num_neighbors: int = 1,
                 mode: ASCLMode = "ascl",
                 hardness_mode: HardnessMode | None = None, hardness_strength: float = 0.0,
                 projection: nn.Module | None = None, gather_across_devices: bool = False,
                 tile_size: TileSize = "auto", mini_batch_size: int | None = None,
                 mini_batch_num_tokens: int | None = None, check_finite: bool = True,
                 show_progress_bar: bool = False) -> None:
        super().__init__(model, plugins.ASCLLoss, sharpen_temperature, num_neighbors, mode,
                         temperature=temperature, scale=scale, similarity_fct=similarity_fct,
                         core_kwargs={"hardness_mode": hardness_mode,
                                      "hardness_strength": hardness_strength},
                         gather_across_devices=gather_across_devices, check_finite=check_finite,
                         tile_size=tile_size,
                         projection=projection, mini_batch_size=mini_batch_size,
                         mini_batch_num_tokens=mini_batch_num_tokens, show_progress_bar=show_progress_bar)

    def get_config_dict(self) -> dict[str, Any]:
        c = self.core
        return {"temperature": c.temperature, "sharpen_temperature": c.sharpen_temperature,
                "num_neighbors": c.num_neighbors, "mode": c.mode, **super().get_config_dict()}


class AMCLLoss(AdaptiveContrastiveLoss):
    """AMCL (Wang et al., 2024): C projection heads and a learned pair temperature.

    The heads and the temperature network live in the loss and are used only in training; the
    saved ``SentenceTransformer`` is the encoder. Save/restore them with
    :meth:`save_loss_state` / :meth:`load_loss_state` or :class:`LossStateCallback`. Hard
    negatives are gathered across devices with ``gather_across_devices`` like the other losses.
    AMCL learns its temperatures, so it has no ``scale``: every argument after ``model`` is
    keyword-only (``AMCLLoss(model, 20.0)`` raises a ``TypeError`` naming them).
    """

    citation_text = AMCL_CITATION

    @_positional_like_the_peer
    def __init__(self, model: nn.Module, *, num_heads: int = 2, projection_dim: int = 128,
                 hidden_dim: int | None = None, beta: float = 1e-3, eta: float = 1e-5,
                 iota: float = 2.0, negative_term: NegativeTerm = "softmax", kappa: int = 1,
                 objective: Objective = "infonce", gather_across_devices: bool = False,
                 tile_size: TileSize = "auto", mini_batch_size: int | None = None,
                 mini_batch_num_tokens: int | None = None, check_finite: bool = True,
                 show_progress_bar: bool = False, bound_warning_steps: int | None = 100) -> None:
        self._check_model(model)
        dim = None if model is None else embedding_dimension(model)
        if dim is None:
            raise ValueError("AMCLLoss sizes its heads from the model's sentence embedding dimension, "
                             "which the model does not report")
        hidden = hidden_dim or dim
        core = plugins.AMCLLoss(plugins.PairTemperature(projection_dim, eta=eta, iota=iota),
                                beta=beta, negative_term=negative_term, kappa=kappa,
                                objective=objective, form="cross_view", check_finite=check_finite,
                                tile_size=tile_size,
                                bound_warning_steps=bound_warning_steps,
                                **_gather_kwargs(gather_across_devices))
        super().__init__(model, core, gather_across_devices=gather_across_devices,
                         mini_batch_size=mini_batch_size, mini_batch_num_tokens=mini_batch_num_tokens,
                         show_progress_bar=show_progress_bar)
        self.heads = plugins.MultiHeadProjection(dim, hidden, projection_dim, num_heads=num_heads)
        self._follow_model_device()
        self.config = {"num_heads": num_heads, "projection_dim": projection_dim, "hidden_dim": hidden,
                       "beta": beta, "eta": eta, "iota": iota, "negative_term": negative_term,
                       "kappa": kappa, "objective": objective}

    def project(self, embeddings: Tensor) -> Tensor:
        """The C heads' projections, ``[C, B, d']``."""
        return self.heads(embeddings)

    def project_columns(self, anchors: Tensor, positives: Tensor,
                        negatives: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
        if anchors.shape[0] > 1 or not self.heads.training:
            return super().project_columns(anchors, positives, negatives)
        # A batch of one pair (the last batch of an epoch) leaves the heads' BatchNorm without
        # per-column batch statistics: project its rows together instead.
        columns = [anchors, positives] + ([] if negatives is None else [negatives])
        parts = self.heads(torch.cat(columns)).split([c.shape[0] for c in columns], dim=1)
        return parts[0], parts[1], parts[2] if negatives is not None else None

    @property
    def temperature(self) -> float:
        return float(self.core.last_stats.get("temperature", torch.tensor(float("nan"))))

    def get_config_dict(self) -> dict[str, Any]:
        return {**self.config, **super().get_config_dict()}


class DySTreSSLoss(AdaptiveContrastiveLoss):
    """DySTreSS (Manna et al., IEEE TAI 2025) for sentence embeddings: a temperature per pair
    from its cosine similarity (:class:`adaptcl.plugins.DySTreSSLoss`).

    Defaults are the authors' SimCSE run (their ``--algo 1``): the piecewise shape
    (``threshold=0.4``, ``width=0.7``) between ``min_temperature=0.04`` and
    ``max_temperature=0.05`` (SimCSE's temperature), the temperature computed from detached
    cosines, every pair (the positive included) at its own temperature. ``shape="cosine"`` is
    the paper's function. DySTreSS has no single temperature, so no ``scale``: every argument
    after ``model`` is keyword-only. ``symmetric`` / ``directions`` / ``partition_mode``,
    ``hardness_mode`` / ``hardness_strength`` and ``use_labels`` as in :class:`InfoNCELoss`.
    ``temperature`` is the mean temperature of the last batch's positive pairs.

    Example:
        >>> loss = DySTreSSLoss(model)   # the authors' SimCSE setting
        >>> paper = DySTreSSLoss(model, min_temperature=0.1, max_temperature=0.2, shape="cosine")
    """

    citation_text = DYSTRESS_CITATION

    @_positional_like_the_peer
    def __init__(self, model: nn.Module | None, *, min_temperature: float = 0.04,
                 max_temperature: float = 0.05, shape: Shape = "piecewise", threshold: float = 0.4,
                 width: float = 0.7, detach_temperature: bool = True, symmetric: bool = False,
                 directions: Sequence[Direction] | None = None,
                 partition_mode: PartitionMode | None = None,
                 hardness_mode: HardnessMode | None = None, hardness_strength: float = 0.0,
                 use_labels: bool = False, projection: nn.Module | None = None,
                 gather_across_devices: bool = False, tile_size: TileSize = "auto",
                 mini_batch_size: int | None = None, mini_batch_num_tokens: int | None = None,
                 check_finite: bool = True, show_progress_bar: bool = False) -> None:
        self._check_model(model)
        core = plugins.DySTreSSLoss(min_temperature, max_temperature, shape=shape,
                                    threshold=threshold, width=width,
                                    detach_temperature=detach_temperature,
                                    hardness_mode=hardness_mode,
                                    hardness_strength=hardness_strength, form="cross_view",
                                    check_finite=check_finite, tile_size=tile_size,
                                    **_gather_kwargs(gather_across_devices))
        super().__init__(model, core, projection=projection,
                         gather_across_devices=gather_across_devices,
                         mini_batch_size=mini_batch_size, mini_batch_num_tokens=mini_batch_num_tokens,
                         symmetric=symmetric, directions=directions, partition_mode=partition_mode,
                         show_progress_bar=show_progress_bar, use_labels=use_labels)

    @property
    def temperature(self) -> float:
        return float(self.last_stats.get("temperature", torch.tensor(float("nan"))))

    def get_config_dict(self) -> dict[str, Any]:
        c = self.core
        config = {"min_temperature": c.min_temperature, "max_temperature": c.max_temperature,
                  "shape": c.shape, "detach_temperature": c.detach_temperature,
                  "symmetric": self.symmetric}
        if c.shape == "piecewise":
            config.update(threshold=c.threshold, width=c.width)
        return {**config, **super().get_config_dict()}
