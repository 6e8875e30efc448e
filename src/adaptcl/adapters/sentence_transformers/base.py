"""The base of the sentence-transformers losses: columns -> embeddings -> core loss, in one pass
or with gradient caching, and the loss's own trainable state (saved next to the model).

Trainable parts of a loss (AMCL's heads and temperature network, SimCSE's training-only MLP)
are optimised by ``SentenceTransformerTrainer`` (it optimises loss parameters) but are not part
of the saved model: save them with :meth:`AdaptiveContrastiveLoss.save_loss_state` (or the
:class:`~adaptcl.adapters.sentence_transformers.LossStateCallback`, which does it at every
checkpoint and restores them when the trainer resumes from one) and restore them with
:meth:`~AdaptiveContrastiveLoss.load_loss_state`. A loss with such state watches its model's
``load_state_dict``: once the model's weights are loaded (``trainer.train(resume_from_checkpoint=
...)`` restores the model and the optimiser, not the loss), a training step refuses to run until
the loss's own state is loaded too.
"""

from __future__ import annotations

import hashlib
import logging
import os
import weakref
from collections.abc import Iterable, Mapping, Sequence
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
from ._directions import (  # noqa: E402
    Direction,
    PartitionMode,
    check_joint,
    hard_negative_owners,
    joint_candidates,
    joint_loss,
    resolve_directions,
    without_hardness,
)
from ._gradient_cache import _apply_loss_parameter_gradients, _forward_is_patched  # noqa: E402
from .citations import INFONCE_CITATION, SUPCON_CITATION  # noqa: E402

__all__ = ["AdaptiveContrastiveLoss", "LOSS_STATE_FILE", "LossStateMismatchError", "embedding_dimension",
           "loss_state_digest"]

logger = logging.getLogger(__name__)

LOSS_STATE_FILE = "adaptcl_loss_state.pt"


class LossStateMismatchError(ValueError):
    """A saved loss state is not the one expected (its :func:`loss_state_digest` differs)."""


def loss_state_digest(state: Mapping[str, Tensor]) -> str:
    """SHA-256 (hex) of a loss state: every entry's name, dtype, shape and bytes, in name order.

    :class:`~adaptcl.adapters.sentence_transformers.LossStateCallback` records it in each
    checkpoint's trainer state, so that a resume loads the loss state written with that
    checkpoint and no other.
    """
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class _ModelLoadWatch:
    """A ``load_state_dict`` post-hook on the model: tells the loss that the model's weights were
    replaced. It holds the loss weakly, and a copy of the model (``copy.deepcopy`` and pickling
    both go through ``__reduce__``) gets an inert watch: the copy is not the model that loss
    trains."""

    def __init__(self, loss: AdaptiveContrastiveLoss | None) -> None:
        self._loss = weakref.ref(loss) if loss is not None else None

    def __call__(self, module: nn.Module, incompatible_keys: Any) -> None:
        loss = self._loss() if self._loss is not None else None
        if loss is not None:
            loss._model_loaded_without_loss_state = True

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _ModelLoadWatch, (None,)


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
            hard-negative columns are candidates of the forward direction alone. The same as
            ``directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction"``.
        directions, partition_mode: ``MultipleNegativesRankingLoss``'s (6.2), with its
            defaults, checks and values; the core's temperature rule applies to every term
            (a joint softmax needs a core with ``compute_from_candidates``).
        check_finite: NaN/inf embeddings are a ``ValueError`` on the CPU; on a GPU a NaN
            loss, which the trainer's ``GradScaler`` skips under fp16, and a
            ``NonFiniteWarning``, never a wait (the core's
            :func:`~adaptcl.plugins.validation.check_all_finite`); ``False`` skips the check.
        show_progress_bar: progress bar over the cached mini-batches.
        use_labels: read the ``labels`` sentence-transformers passes to ``forward`` (the
            dataset's ``label`` column) as the class of each pair: every in-batch candidate of
            the anchor's class is a positive (SupCon's ``L_out``,
            :mod:`adaptcl.plugins.targets`); hard-negative columns stay negatives. ``False``
            (default) ignores them, as ``MultipleNegativesRankingLoss`` does, so a dataset that
            carries a label column (NLI) trains as before. Needs a core that takes labels.

    The hardness term of the core (``hardness_mode``, :mod:`adaptcl.plugins.hardness`) gets the
    owners of the hard-negative columns from here (column ``k`` row ``i`` is anchor ``i``'s,
    across ranks too) and, as in ``MultipleNegativesRankingLoss``, touches the anchor -> candidates
    direction only: the reverse direction of ``symmetric=True`` runs without it.

    The subclasses also take ``tile_size`` (``"auto"``, ``None`` or an int, passed to the core
    loss): see :mod:`adaptcl.plugins.execution`.
    """

    citation_text = INFONCE_CITATION

    def __init__(self, model: nn.Module | None, core: nn.Module, *, projection: nn.Module | None = None,
                 gather_across_devices: bool = False, mini_batch_size: int | None = None,
                 mini_batch_num_tokens: int | None = None, symmetric: bool = False,
                 directions: Sequence[Direction] | None = None,
                 partition_mode: PartitionMode | None = None,
                 show_progress_bar: bool = False, use_labels: bool = False) -> None:
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
        self.directions, self.partition_mode = resolve_directions(directions, partition_mode,
                                                                  symmetric)
        self.symmetric = self.partition_mode == "per_direction" and len(self.directions) == 2
        self.joint = self.partition_mode == "joint" and len(self.directions) > 1
        self.gather_across_devices = _check_bool("gather_across_devices", gather_across_devices)
        self.use_labels = _check_bool("use_labels", use_labels)
        if self.use_labels and not getattr(core, "takes_labels", False):
            raise ValueError(f"use_labels=True: the core loss {type(core).__name__} takes no labels")
        if self.joint:
            check_joint(self.directions, core, use_labels=self.use_labels)
        self.last_stats: dict[str, Tensor] = {}
        self._pending_parameter_grads: list[tuple[list[nn.Parameter], tuple[Tensor | None, ...]]] = []
        self._warned_patched_forward = False
        # a resumed trainer restores the model, not the loss: see _refuse_stale_loss_state
        self._model_loaded_without_loss_state = False
        if model is not None:
            model.register_load_state_dict_post_hook(_ModelLoadWatch(self))
        self.register_load_state_dict_post_hook(_loss_state_loaded)
        self._follow_model_device()

    def _follow_model_device(self) -> None:
        """The loss's own modules (built on the CPU: the same initial values on every device) to
        the model's device, as ``SoftmaxLoss`` builds its classifier, so the loss runs outside
        the trainer too (whose ``prepare_loss`` moves it there)."""
        device = getattr(self.model, "device", None)
        if isinstance(device, torch.device):
            for name, child in self.named_children():
                if name != "model":
                    child.to(device)

    def _check_model(self, model: Any) -> None:
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(
                f"model must be the SentenceTransformer being trained (or None when only "
                f"compute_loss_from_embeddings is called), got {type(model).__name__} {model!r}: "
                f"the model comes first, as in sentence-transformers' losses, e.g. "
                f"{type(self).__name__}(model, temperature=0.05)")

    # --- forward: one pass, or gradient caching on sentence-transformers' machinery -----------

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None) -> Tensor:
        if self._model_loaded_without_loss_state and torch.is_grad_enabled():
            self._refuse_stale_loss_state()
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
        """Loss of ``(anchor, positive[, negative...])`` embedding columns; ``labels`` are the
        pairs' classes with ``use_labels=True``, unused otherwise."""
        if len(embeddings) < 2:
            raise ValueError(
                f"{type(self).__name__} needs at least 2 columns (anchor, positive), got {len(embeddings)}"
            )
        negatives = torch.cat(embeddings[2:]) if len(embeddings) > 2 else None
        gathers = self.gather_across_devices and get_world_size() > 1
        pairs: dict[str, Tensor] = {}
        if self.use_labels:
            if labels is None:
                raise ValueError(f"{type(self).__name__}(use_labels=True) needs the class of each pair: "
                                 "a 'label' column in the dataset")
            pairs["labels"] = labels.to(embeddings[0].device, non_blocking=True)
        if negatives is not None and (self.joint or getattr(self.core, "hardness_mode", None)):
            pairs["negative_owners"] = hard_negative_owners(
                embeddings[0].shape[0], len(embeddings) - 2, embeddings[0].device,
                get_world_size() if gathers else 1)
        if negatives is not None and gathers:
            negatives = all_gather_with_grad(negatives)
        anchors, positives, negatives = self.project_columns(embeddings[0], embeddings[1], negatives)
        if self.joint:
            rows = joint_candidates(anchors, positives, negatives, self.directions,
                                    gather=all_gather_with_grad if gathers else None,
                                    negative_owners=pairs.get("negative_owners"),
                                    check_finite=self.core.check_finite)
            loss = joint_loss(self.core, rows)
            self.last_stats = dict(self.core.last_stats)
            return loss
        loss = self.core(anchors, positives, negatives, **pairs)
        stats = dict(self.core.last_stats)
        if self.symmetric:
            with without_hardness(self.core):
                reverse = self.core(positives, anchors, **{k: v for k, v in pairs.items()
                                                           if k == "labels"})
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
        if self.joint:
            config.update(directions=self.directions, partition_mode="joint")
        if getattr(self.core, "tile_size", "auto") != "auto":
            config["tile_size"] = self.core.tile_size
        if self.mini_batch_size is not None:
            config["mini_batch_size"] = self.mini_batch_size
        if self.mini_batch_num_tokens is not None:
            config["mini_batch_num_tokens"] = self.mini_batch_num_tokens
        if self.projection is not None:
            config["projection"] = type(self.projection).__name__
        if not self.check_finite:
            config["check_finite"] = False
        if getattr(self.core, "hardness_mode", None) is not None:
            config["hardness_mode"] = self.core.hardness_mode
            config["hardness_strength"] = self.core.hardness_strength
        if self.use_labels:
            config["use_labels"] = True
        return config

    @property
    def citation(self) -> str:
        return self.citation_text + (SUPCON_CITATION if self.use_labels else "")

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

    def load_loss_state(self, directory: str | os.PathLike, *, digest: str | None = None) -> None:
        """Restore what :meth:`save_loss_state` wrote (raises ``FileNotFoundError`` if absent).

        ``digest``: the :func:`loss_state_digest` the saved state must have; another state
        raises :class:`LossStateMismatchError` and nothing is loaded.
        """
        path = Path(directory) / LOSS_STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no saved loss state at {str(path)!r}")
        payload = torch.load(path, map_location="cpu", weights_only=True)
        if digest is not None and (found := loss_state_digest(payload["state"])) != digest:
            raise LossStateMismatchError(
                f"{str(path)!r} holds another loss state (sha256 {found[:12]}) than the one "
                f"expected (sha256 {digest[:12]})")
        if payload["class"] != type(self).__name__:
            raise ValueError(f"{str(path)!r} holds the state of {payload['class']}, not {type(self).__name__}")
        missing, unexpected = self.load_state_dict(payload["state"], strict=False)
        missing = [k for k in missing if not k.startswith("model.")]
        if missing or unexpected:
            raise ValueError(f"loss state mismatch: missing {missing}, unexpected {unexpected}")

    def _refuse_stale_loss_state(self) -> None:
        """A training step after the model's weights were loaded but not the loss's own state:
        the trainer resumed without :class:`LossStateCallback`, and the heads would train on
        from fresh values while the model, optimiser and scheduler continue the old run."""
        own = self.loss_state_dict()
        if not own:  # nothing of its own to restore
            self._model_loaded_without_loss_state = False
            return
        # name the parts, e.g. "core.temperature_net, heads" for AMCL, "projection" for SimCSE's MLP
        parts = sorted({".".join(k.split(".")[:2 if k.startswith("core.") else 1]) for k in own})
        raise RuntimeError(
            f"{type(self).__name__}: the model's weights were loaded after the loss was built "
            f"(trainer.train(resume_from_checkpoint=...) restores the model and the optimiser), "
            f"but the loss's own parameters ({', '.join(parts)}) were not, so this step would "
            f"train on from values that do not belong to them: pass "
            f"callbacks=[LossStateCallback(loss)] to the trainer, or call "
            f"loss.load_loss_state(checkpoint) before training (to start the loss afresh on "
            f"loaded weights, build it after loading them)")


def _loss_state_loaded(loss: AdaptiveContrastiveLoss, incompatible_keys: Any) -> None:
    """``load_state_dict`` post-hook on the loss: its own state was loaded (the model's watch,
    which fires first for the model inside it, set the flag)."""
    loss._model_loaded_without_loss_state = False
