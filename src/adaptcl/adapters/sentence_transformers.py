"""Adaptive contrastive losses in sentence-transformers' own loss form.

Each loss takes the model first, is called by ``SentenceTransformerTrainer`` as
``loss(sentence_features, labels)``, exposes ``compute_loss_from_embeddings``,
``get_config_dict`` (shown in the model card), ``citation`` and ``gather_across_devices``, and
reads its columns like ``MultipleNegativesRankingLoss``: ``(anchor, positive)`` pairs, optionally
followed by hard-negative columns. The maths lives in :mod:`adaptcl.plugins`.

Trainable parts of a loss (AMCL's heads and temperature network, SimCSE's training-only MLP)
are optimised by ``SentenceTransformerTrainer`` (it optimises loss parameters) but are not part
of the saved model: save them with :meth:`AdaptiveContrastiveLoss.save_loss_state` (or the
:class:`LossStateCallback`, which does it at every checkpoint and restores them when the trainer
resumes from one) and restore them with :meth:`~AdaptiveContrastiveLoss.load_loss_state`.

Large batches: ``tile_size=`` streams the similarity matrix in tiles with an exact backward
(Inf-CL, Cheng et al. 2024; :mod:`adaptcl.plugins.tiled`), so the loss itself needs memory
linear in the batch; ``mini_batch_size=`` adds gradient caching (GradCache, Gao et al. 2021)
through sentence-transformers' own machinery (``CachedLossMixin``, as
``CachedMultipleNegativesRankingLoss``): the texts are embedded in mini-batches without a graph,
the loss and its gradient wrt the embeddings are computed on the full batch, and each mini-batch
is embedded again with gradient in backward (replaying its random state, so dropout masks are
identical). ``MatryoshkaLoss`` decorates such a loss's ``calculate_loss`` and DDP synchronises
once after the replay, exactly as with the peer; under ``AdaptiveLayerLoss``, which patches the
model's forward only during its forward pass, the loss embeds in one pass (the peer raises
there). Together they train with batches whose activations and similarity matrix would not fit.

Where sentence-transformers defines a behaviour the losses follow it: the positional arguments
are ``MultipleNegativesRankingLoss``'s, ``(model, scale, similarity_fct)`` (``InfoNCELoss(model,
20.0)`` is scale 20, temperature 0.05), everything else is keyword-only (``AMCLLoss``, which
learns its temperatures, takes only the model positionally; an extra positional argument is a
``TypeError`` naming the keywords); ``scale`` (1 / temperature) and ``similarity_fct=cos_sim``
are accepted, a batch of one pair gives 0 with zero gradient like
``MultipleNegativesRankingLoss``, and ``symmetric=True`` is the peer's symmetric loss: the
reverse direction (positive -> anchors) does not see the hard-negative columns.

Example:
    >>> from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    >>> from adaptcl.adapters.sentence_transformers import MACLLoss
    >>> model = SentenceTransformer("all-MiniLM-L6-v2")
    >>> loss = MACLLoss(model, temperature=0.05, alpha=2.0, a0=0.8)   # MACL's SimCSE setting
    >>> trainer = SentenceTransformerTrainer(model=model, train_dataset=pairs, loss=loss)
    >>> big = MACLLoss(model, mini_batch_size=64, tile_size=4096)   # batch 65,536 of texts
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from adaptcl import plugins

from . import require

require("sentence_transformers", "text")

from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.base.losses import CachedLossMixin, has_static_embedding_input  # noqa: E402
from sentence_transformers.base.losses.merged_forward import embed_columns  # noqa: E402
from sentence_transformers.util import all_gather_with_grad, cos_sim, get_world_size  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR  # noqa: E402

logger = logging.getLogger(__name__)

LOSS_STATE_FILE = "adaptcl_loss_state.pt"

MACL_CITATION = """
@inproceedings{huang2023macl,
    title = {Model-Aware Contrastive Learning: Towards Escaping the Dilemmas},
    author = {Huang, Zizheng and Chen, Haoxing and Wen, Ziqi and Zhang, Chao and Li, Huaxiong and Wang, Bo and Chen, Chunlin},
    booktitle = {Proceedings of the 40th International Conference on Machine Learning},
    year = {2023},
    url = {https://arxiv.org/abs/2207.07874},
}
"""

ASCL_CITATION = """
@inproceedings{feng2022ascl,
    title = {Adaptive Soft Contrastive Learning},
    author = {Feng, Chen and Patras, Ioannis},
    booktitle = {26th International Conference on Pattern Recognition (ICPR)},
    year = {2022},
    url = {https://arxiv.org/abs/2207.11163},
}
"""

AMCL_CITATION = """
@inproceedings{wang2024amcl,
    title = {Adaptive Multi-head Contrastive Learning},
    author = {Wang, Lei and Koniusz, Piotr and Gedeon, Tom and Zheng, Liang},
    booktitle = {European Conference on Computer Vision (ECCV)},
    year = {2024},
    url = {https://arxiv.org/abs/2310.05615},
}
"""

INFONCE_CITATION = """
@misc{oord2018cpc,
    title = {Representation Learning with Contrastive Predictive Coding},
    author = {van den Oord, Aaron and Li, Yazhe and Vinyals, Oriol},
    year = {2018},
    eprint = {1807.03748},
    archivePrefix = {arXiv},
}
"""


def embedding_dimension(model: nn.Module) -> int | None:
    """The model's sentence-embedding size (``get_embedding_dimension`` in sentence-transformers
    6, ``get_sentence_embedding_dimension`` before)."""
    getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return getter()


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


def _symmetric_from_directions(directions: Sequence[str] | None, partition_mode: str | None,
                               symmetric: bool) -> bool:
    """``symmetric`` from ``MultipleNegativesRankingLoss``'s ``directions`` / ``partition_mode``,
    where they describe one of the two losses offered here."""
    if directions is None and partition_mode is None:
        return symmetric
    directions = tuple(directions or ("query_to_doc",))
    if directions == ("query_to_doc",) and partition_mode in (None, "joint", "per_direction"):
        return symmetric
    if sorted(directions) == ["doc_to_query", "query_to_doc"] and partition_mode == "per_direction":
        return True
    raise ValueError(
        f"directions={directions} with partition_mode={partition_mode!r} is not available: the "
        "losses here offer ('query_to_doc',) and ('query_to_doc', 'doc_to_query') with "
        "partition_mode='per_direction' (that is symmetric=True)")


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
                     f"only {positional[0]} positionally (AMCL learns its temperatures: it has no scale)")
            raise TypeError(
                f"{name} takes {takes}; got {len(args)} positional arguments. Pass {extra} by keyword, "
                f"e.g. {name}(model, {keywords[0]}=...); keywords: {', '.join(keywords)}")
        init(self, *args, **kwargs)

    return checked


def _unwrap_forward(forward: Any) -> Any:
    """The function under a chain of transparent wrappers: bound methods (``__func__``) and
    decorators that declare what they wrap (``__wrapped__``, set by ``functools.wraps``).

    accelerate's mixed precision (``Accelerator.prepare_model`` with ``bf16``/``fp16``) sets
    ``model.forward`` to ``convert_outputs_to_fp32(autocast(type(model).forward))`` bound to the
    instance, each layer declaring ``__wrapped__`` (its own ``unwrap_model`` peels them the same
    way), so this returns the class's ``forward``.
    """
    seen: set[int] = set()
    while id(forward) not in seen:
        seen.add(id(forward))
        forward = getattr(forward, "__func__", forward)
        inner = getattr(forward, "__wrapped__", None)
        if inner is None:
            break
        forward = inner
    return forward


def _forward_is_patched(model: nn.Module) -> bool:
    """Whether a loss modifier has replaced the model's ``forward`` (or its first module's) on
    the instance for the duration of its own forward pass, as ``AdaptiveLayerLoss`` does. A
    gradient-cache replay in backward would run the unpatched forward, so such a call must embed
    in one pass instead.

    A transparent wrapper of the class's own ``forward`` is not such a patch: accelerate's
    autocast wrapper under ``bf16=True`` / ``fp16=True`` stays in place for the whole run (the
    replay in backward runs it too), so gradient caching stays on there, as in
    ``CachedMultipleNegativesRankingLoss``. ``AdaptiveLayerLoss``'s decorators
    (``ForwardDecorator``, ``TransformerDecorator``) declare no ``__wrapped__`` and are patches.
    """
    model = getattr(model, "_orig_mod", model)
    model = getattr(model, "module", model)  # DistributedDataParallel
    modules = [model]
    if isinstance(model, nn.Sequential) and len(model) > 0:
        modules.append(model[0])
    for module in modules:
        override = vars(module).get("forward")
        # a modifier restores the original as an instance attribute: a bound method of the
        # class's own forward (possibly under accelerate's autocast wrapper) is not a patch
        if override is not None and _unwrap_forward(override) is not type(module).forward:
            return True
    return False


def _apply_loss_parameter_gradients(grad_output: Tensor, params: list[nn.Parameter],
                                    grads: Sequence[Tensor | None]) -> None:
    """Backward hook on a cached loss: add the loss's own parameter gradients (computed with the
    loss in forward) scaled by the outer gradient (AMP scaler, gradient accumulation)."""
    for param, grad in zip(params, grads, strict=True):
        if grad is None:
            continue
        grad = grad * grad_output.to(grad.dtype)
        param.grad = grad if param.grad is None else param.grad + grad


class SimCSEProjection(nn.Sequential):
    """SimCSE's training-only MLP over the CLS vector: ``Linear(d, d) -> Tanh`` (Gao et al. 2021)."""

    def __init__(self, dim: int) -> None:
        super().__init__(nn.Linear(dim, dim), nn.Tanh())


class AdaptiveContrastiveLoss(CachedLossMixin, nn.Module):
    """Base of the sentence-transformers losses: columns -> embeddings -> core loss.

    Args:
        model: the ``SentenceTransformer`` being trained (``None`` is accepted when only
            :meth:`compute_loss_from_embeddings` is called, as with sentence-transformers' losses).
        core: an :mod:`adaptcl.plugins` two-view loss module in the ``"cross_view"`` form, built
            with ``gather_distributed=gather_across_devices`` and sentence-transformers' gather.
        projection: optional module applied to every embedding before the loss and only there
            (SimCSE's training MLP); trained with the loss, not saved with the model.
        gather_across_devices: gather candidates (and hard negatives) from every rank, with
            gradient, before the loss (more negatives per anchor under DDP).
        mini_batch_size: gradient caching with sentence-transformers' ``CachedLossMixin``: embed
            the texts ``mini_batch_size`` at a time without a graph, compute the loss on the whole
            batch, then re-embed each mini-batch with gradient in backward (same dropout masks).
            Same loss and gradients as without it; activation memory of one mini-batch. ``None``
            (default) embeds in one pass.
        mini_batch_num_tokens: as in ``CachedMultipleNegativesRankingLoss``: mini-batches hold
            at most this many non-padding tokens (turns gradient caching on).
        symmetric: also rank the anchors for each positive and average the two directions. As
            sentence-transformers' symmetric loss, the reverse direction ranks the anchors only:
            hard-negative columns are candidates of the forward direction alone.
        check_finite: raise ``ValueError`` on NaN/inf embeddings (costs one host-device
            synchronisation per call; ``False`` skips it).
        show_progress_bar: progress bar over the cached mini-batches.

    The subclasses also take ``tile_size`` (passed to the core loss): see
    :mod:`adaptcl.plugins.tiled`.
    """

    citation_text = INFONCE_CITATION

    def __init__(self, model: nn.Module | None, core: nn.Module, *, projection: nn.Module | None = None,
                 gather_across_devices: bool = False, mini_batch_size: int | None = None,
                 mini_batch_num_tokens: int | None = None, symmetric: bool = False,
                 show_progress_bar: bool = False) -> None:
        self._check_model(model)
        mini_batch_size = _check_optional_count("mini_batch_size", mini_batch_size)
        mini_batch_num_tokens = _check_optional_count("mini_batch_num_tokens", mini_batch_num_tokens)
        super().__init__()
        self.mini_batch_size = mini_batch_size
        self.mini_batch_num_tokens = mini_batch_num_tokens
        # CachedLossMixin's flag, read by MatryoshkaLoss / AdaptiveLayerLoss: per instance, as
        # sentence-transformers' losses that can turn the caching off do.
        self.uses_gradient_cache = mini_batch_size is not None or mini_batch_num_tokens is not None
        if self.uses_gradient_cache and isinstance(model, SentenceTransformer) and has_static_embedding_input(model):
            raise ValueError(
                f"mini_batch_size / mini_batch_num_tokens: {type(self).__name__} cannot cache gradients "
                "for a model based on a StaticEmbedding, whose inputs cannot be split into mini-batches")
        self.show_progress_bar = _check_bool("show_progress_bar", show_progress_bar)
        self.model = model
        self.core = core
        self.projection = projection
        self.symmetric = _check_bool("symmetric", symmetric)
        self.gather_across_devices = _check_bool("gather_across_devices", gather_across_devices)
        self.last_stats: dict[str, Tensor] = {}
        self._pending_parameter_grads: list[tuple[list[nn.Parameter], tuple[Tensor | None, ...]]] = []
        self._warned_patched_forward = False

    def _check_model(self, model: Any) -> None:
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(
                f"model must be the SentenceTransformer being trained (or None when only "
                f"compute_loss_from_embeddings is called), got {type(model).__name__} {model!r}: "
                f"the model comes first, as in sentence-transformers' losses, e.g. "
                f"{type(self).__name__}(model, temperature=0.05)")

    # --- forward: one pass, or gradient caching on sentence-transformers' machinery -----------

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None) -> Tensor:
        sentence_features = list(sentence_features)
        if self.uses_gradient_cache and _forward_is_patched(self.model):
            if not self._warned_patched_forward:
                logger.warning("%s: the model's forward is patched by a loss modifier (e.g. "
                               "AdaptiveLayerLoss) for this call only; embedding in one pass "
                               "without gradient caching", type(self).__name__)
                self._warned_patched_forward = True
        elif self.uses_gradient_cache:
            self._pending_parameter_grads = []
            loss = self.forward_cached(sentence_features, labels)
            pending, self._pending_parameter_grads = self._pending_parameter_grads, []
            if loss.requires_grad:
                for params, grads in pending:
                    loss.register_hook(partial(_apply_loss_parameter_gradients, params=params, grads=grads))
            return loss
        embeddings = embed_columns(self.model, sentence_features)
        return self.compute_loss_from_embeddings(embeddings, labels)

    def calculate_loss(self, reps: list[list[Tensor]], labels: Tensor | None = None, *,
                       with_backward: bool = False) -> Tensor:
        """``CachedLossMixin``'s hook: the loss of the whole batch from per-mini-batch embeddings.

        With ``with_backward`` the gradients wrt the embeddings land in their ``.grad`` (the
        cache); those of the loss's own parameters (projection, AMCL heads) are held back and
        added in backward, scaled like every other gradient.
        """
        loss = self.compute_loss_from_embeddings([torch.cat(column) for column in reps], labels)
        if not with_backward:
            return loss
        leaves = [rep for column in reps for rep in column]
        params = [p for name, p in self.named_parameters() if p.requires_grad and not name.startswith("model.")]
        grads = torch.autograd.grad(loss, leaves + params, allow_unused=True)
        for leaf, grad in zip(leaves, grads, strict=False):
            if grad is not None:
                leaf.grad = grad if leaf.grad is None else leaf.grad + grad
        if params:
            self._pending_parameter_grads.append((params, grads[len(leaves):]))
        return loss.detach()

    # --- the loss on embeddings -----------------------------------------------------------

    def project(self, embeddings: Tensor) -> Tensor:
        """What the core loss sees of one column: the training-only projection, if any."""
        return embeddings if self.projection is None else self.projection(embeddings)

    def project_columns(self, anchors: Tensor, positives: Tensor,
                        negatives: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
        return (self.project(anchors), self.project(positives),
                None if negatives is None else self.project(negatives))

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        """Loss of ``(anchor, positive[, negative...])`` embedding columns; ``labels`` unused."""
        if len(embeddings) < 2:
            raise ValueError(
                f"{type(self).__name__} needs at least 2 columns (anchor, positive), got {len(embeddings)}"
            )
        negatives = torch.cat(embeddings[2:]) if len(embeddings) > 2 else None
        if negatives is not None and self.gather_across_devices and get_world_size() > 1:
            negatives = all_gather_with_grad(negatives)
        anchors, positives, negatives = self.project_columns(embeddings[0], embeddings[1], negatives)
        loss = self.core(anchors, positives, negatives)
        stats = dict(self.core.last_stats)
        if self.symmetric:
            reverse = self.core(positives, anchors)
            loss = (loss + reverse) / 2
            stats = {k: (v + self.core.last_stats[k]) / 2 if k in self.core.last_stats else v
                     for k, v in stats.items()}
        self.last_stats = stats
        return loss

    @property
    def temperature(self) -> float:
        return float(self.core.temperature)

    @property
    def check_finite(self) -> bool:
        return self.core.check_finite

    @check_finite.setter
    def check_finite(self, value: bool) -> None:
        self.core.check_finite = _check_bool("check_finite", value)

    def get_config_dict(self) -> dict[str, Any]:
        config: dict[str, Any] = {"gather_across_devices": self.gather_across_devices}
        if self.symmetric:
            config["symmetric"] = True
        if getattr(self.core, "tile_size", None) is not None:
            config["tile_size"] = self.core.tile_size
        if self.mini_batch_size is not None:
            config["mini_batch_size"] = self.mini_batch_size
        if self.mini_batch_num_tokens is not None:
            config["mini_batch_num_tokens"] = self.mini_batch_num_tokens
        if self.projection is not None:
            config["projection"] = type(self.projection).__name__
        if not self.check_finite:
            config["check_finite"] = False
        return config

    @property
    def citation(self) -> str:
        return self.citation_text

    # --- trainable loss state (not part of the SentenceTransformer) ------------------------

    def loss_state_dict(self) -> dict[str, Tensor]:
        """Parameters and buffers of the loss itself, without the model's."""
        return {k: v.detach().cpu() for k, v in self.state_dict().items() if not k.startswith("model.")}

    def save_loss_state(self, directory: str | os.PathLike) -> Path | None:
        """Write the loss's own trainable state to ``directory/adaptcl_loss_state.pt``.

        Returns the path, or ``None`` when the loss has no state of its own.
        """
        state = self.loss_state_dict()
        if not state:
            return None
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / LOSS_STATE_FILE
        tmp = path.with_suffix(".tmp")
        torch.save({"class": type(self).__name__, "config": self.get_config_dict(), "state": state}, tmp)
        os.replace(tmp, path)
        return path

    def load_loss_state(self, directory: str | os.PathLike) -> None:
        """Restore what :meth:`save_loss_state` wrote (raises ``FileNotFoundError`` if absent)."""
        path = Path(directory) / LOSS_STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no saved loss state at {str(path)!r}")
        payload = torch.load(path, map_location="cpu", weights_only=True)
        if payload["class"] != type(self).__name__:
            raise ValueError(f"{str(path)!r} holds the state of {payload['class']}, not {type(self).__name__}")
        missing, unexpected = self.load_state_dict(payload["state"], strict=False)
        missing = [k for k in missing if not k.startswith("model.")]
        if missing or unexpected:
            raise ValueError(f"loss state mismatch: missing {missing}, unexpected {unexpected}")


class _ScalarTemperatureLoss(AdaptiveContrastiveLoss):
    """A loss with one temperature, given as ``temperature`` or sentence-transformers' ``scale``
    (1 / temperature) and settable as either; the core is ``core_cls(temperature, *core_args,
    **core_kwargs)`` in the cross-view form."""

    def __init__(self, model: nn.Module | None, core_cls: type[nn.Module], *core_args: Any,
                 temperature: float | None, scale: float | None, similarity_fct: Callable | None,
                 core_kwargs: dict[str, Any], gather_across_devices: bool, check_finite: bool,
                 tile_size: int | None, **base_kwargs: Any) -> None:
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
    (``MultipleNegativesSymmetricRankingLoss``), with or without hard negatives. A batch of one
    pair gives 0, as the peer does.

    Example:
        >>> loss = InfoNCELoss(model, 20.0)   # MultipleNegativesRankingLoss(model, 20.0)
    """

    @_positional_like_the_peer
    def __init__(self, model: nn.Module | None, scale: float | None = None,
                 similarity_fct: Callable | None = None, *, temperature: float | None = None,
                 symmetric: bool = False, directions: Sequence[str] | None = None,
                 partition_mode: str | None = None, projection: nn.Module | None = None,
                 gather_across_devices: bool = False, tile_size: int | None = None,
                 mini_batch_size: int | None = None, mini_batch_num_tokens: int | None = None,
                 check_finite: bool = True, show_progress_bar: bool = False) -> None:
        super().__init__(model, plugins.InfoNCELoss, temperature=temperature, scale=scale,
                         similarity_fct=similarity_fct,
                         core_kwargs={}, gather_across_devices=gather_across_devices,
                         check_finite=check_finite, tile_size=tile_size, projection=projection,
                         mini_batch_size=mini_batch_size, mini_batch_num_tokens=mini_batch_num_tokens,
                         symmetric=_symmetric_from_directions(directions, partition_mode, symmetric),
                         show_progress_bar=show_progress_bar)

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
    """

    citation_text = MACL_CITATION

    @_positional_like_the_peer
    def __init__(self, model: nn.Module | None, scale: float | None = None,
                 similarity_fct: Callable | None = None, *, temperature: float | None = None,
                 alpha: float = 2.0, a0: float = 0.8, reweight: bool = False, adaptive: bool = True,
                 temperature_form: str = "linear", min_temperature: float | None = None,
                 symmetric: bool = False, projection: nn.Module | None = None,
                 gather_across_devices: bool = False, tile_size: int | None = None,
                 mini_batch_size: int | None = None, mini_batch_num_tokens: int | None = None,
                 check_finite: bool = True, show_progress_bar: bool = False) -> None:
        super().__init__(model, plugins.MACLLoss, alpha, a0, temperature=temperature, scale=scale,
                         similarity_fct=similarity_fct,
                         core_kwargs={"reweight": reweight, "adaptive": adaptive,
                                      "temperature_form": temperature_form,
                                      "min_temperature": min_temperature},
                         gather_across_devices=gather_across_devices, check_finite=check_finite,
                         tile_size=tile_size, projection=projection, mini_batch_size=mini_batch_size,
                         mini_batch_num_tokens=mini_batch_num_tokens, symmetric=symmetric,
                         show_progress_bar=show_progress_bar)

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
    similarity_fct)``; ``temperature`` and the rest are keyword-only.
    """

    citation_text = ASCL_CITATION

    @_positional_like_the_peer
    def __init__(self, model: nn.Module | None, scale: float | None = None,
                 similarity_fct: Callable | None = None, *, temperature: float | None = None,
                 sharpen_temperature: float = 0.025, num_neighbors: int = 1, mode: str = "ascl",
                 projection: nn.Module | None = None, gather_across_devices: bool = False,
                 tile_size: int | None = None, mini_batch_size: int | None = None,
                 mini_batch_num_tokens: int | None = None, check_finite: bool = True,
                 show_progress_bar: bool = False) -> None:
        super().__init__(model, plugins.ASCLLoss, sharpen_temperature, num_neighbors, mode,
                         temperature=temperature, scale=scale, similarity_fct=similarity_fct, core_kwargs={},
                         gather_across_devices=gather_across_devices, check_finite=check_finite,
                         tile_size=tile_size, projection=projection, mini_batch_size=mini_batch_size,
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
                 iota: float = 2.0, negative_term: str = "softmax", kappa: int = 1,
                 objective: str = "infonce", gather_across_devices: bool = False,
                 tile_size: int | None = None, mini_batch_size: int | None = None,
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
                                tile_size=tile_size, bound_warning_steps=bound_warning_steps,
                                **_gather_kwargs(gather_across_devices))
        super().__init__(model, core, gather_across_devices=gather_across_devices,
                         mini_batch_size=mini_batch_size, mini_batch_num_tokens=mini_batch_num_tokens,
                         show_progress_bar=show_progress_bar)
        self.heads = plugins.MultiHeadProjection(dim, hidden, projection_dim, num_heads=num_heads)
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


class LossStateCallback(TrainerCallback):
    """Save a loss's own trainable state into every checkpoint and the final output directory,
    and restore it when the trainer resumes from a checkpoint.

    ``trainer.train(resume_from_checkpoint=...)`` restores the model, the optimiser and the
    scheduler, but the loss's own parameters (AMCL's heads and temperature network, SimCSE's
    training MLP) are not part of the model: at ``on_train_begin`` of a resumed run (the trainer
    state loaded from the checkpoint has ``global_step > 0``) this callback loads them from the
    checkpoint's ``adaptcl_loss_state.pt``. The trainer does not hand callbacks the checkpoint's
    path, so it is ``args.resume_from_checkpoint`` when that names a directory (as in
    transformers' example scripts) and otherwise ``output_dir/checkpoint-<global_step>``, the
    directory ``resume_from_checkpoint=True`` and the trainer's own checkpoints use. A resumed
    run whose checkpoint holds no loss state raises ``FileNotFoundError`` instead of training on
    from freshly initialised heads.

    Example:
        >>> trainer = SentenceTransformerTrainer(model=model, loss=loss, ...,
        ...                                      callbacks=[LossStateCallback(loss)])
        >>> trainer.train(resume_from_checkpoint=True)   # model, optimiser and loss state
    """

    def __init__(self, loss: AdaptiveContrastiveLoss) -> None:
        self.loss = loss

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step > 0 and self.loss.loss_state_dict():
            self.loss.load_loss_state(self._resumed_checkpoint(args, state))
        return control

    @staticmethod
    def _checkpoint_dir(args, state) -> Path:
        """The trainer's checkpoint folder of the current step (``output_dir/checkpoint-N``)."""
        return Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"

    def _resumed_checkpoint(self, args, state) -> Path:
        candidates = []
        named = getattr(args, "resume_from_checkpoint", None)
        if isinstance(named, (str, os.PathLike)) and Path(named).is_dir():
            candidates.append(Path(named))
        candidates.append(self._checkpoint_dir(args, state))
        for candidate in candidates:
            if (candidate / LOSS_STATE_FILE).is_file():
                return candidate
        raise FileNotFoundError(
            f"LossStateCallback: the trainer resumes at step {state.global_step} but no "
            f"{LOSS_STATE_FILE} was found in {', '.join(repr(str(c)) for c in candidates)}, so "
            f"{type(self.loss).__name__}'s own parameters would start fresh. Resume from a "
            f"checkpoint written with LossStateCallback, name one outside output_dir with "
            f"TrainingArguments(resume_from_checkpoint=path), or restore the loss with "
            f"loss.load_loss_state(path) and train without this callback")

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.loss.save_loss_state(self._checkpoint_dir(args, state))
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.loss.save_loss_state(args.output_dir)
        return control
