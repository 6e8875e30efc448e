"""The base of the sentence-transformers losses: columns -> embeddings -> core loss, in one pass
or with gradient caching, and the loss's own trainable state (saved next to the model).

Trainable parts of a loss (AMCL's heads and temperature network, SimCSE's training-only MLP)
are optimised by ``SentenceTransformerTrainer`` (it optimises loss parameters) but are not part
of the saved model: save them with :meth:`AdaptiveContrastiveLoss.save_loss_state` (or the
:class:`~adaptcl.adapters.sentence_transformers.LossStateCallback`, which does it at every
checkpoint and restores them when the trainer resumes from one) and restore them with
:meth:`~AdaptiveContrastiveLoss.load_loss_state`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from adaptcl.adapters import require

require("sentence_transformers", "text")

from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.base.losses import CachedLossMixin, has_static_embedding_input  # noqa: E402
from sentence_transformers.base.losses.merged_forward import embed_columns  # noqa: E402
from sentence_transformers.util import all_gather_with_grad, get_world_size  # noqa: E402

from ._arguments import _check_bool, _check_optional_count  # noqa: E402
from ._gradient_cache import _apply_loss_parameter_gradients, _forward_is_patched  # noqa: E402
from .citations import INFONCE_CITATION  # noqa: E402

__all__ = ["AdaptiveContrastiveLoss", "LOSS_STATE_FILE", "embedding_dimension"]

logger = logging.getLogger(__name__)

LOSS_STATE_FILE = "adaptcl_loss_state.pt"


def embedding_dimension(model: nn.Module) -> int | None:
    """The model's sentence-embedding size (``get_embedding_dimension`` in sentence-transformers
    6, ``get_sentence_embedding_dimension`` before)."""
    getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return getter()


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
