"""Adaptive contrastive losses in sentence-transformers' own loss form.

Each loss takes the model first, is called by ``SentenceTransformerTrainer`` as
``loss(sentence_features, labels)``, exposes ``compute_loss_from_embeddings``,
``get_config_dict`` (shown in the model card), ``citation`` and ``gather_across_devices``, and
reads its columns like ``MultipleNegativesRankingLoss``: ``(anchor, positive)`` pairs, optionally
followed by hard-negative columns. The maths lives in :mod:`adaptcl.plugins`.

Trainable parts of a loss (AMCL's heads and temperature network, SimCSE's training-only MLP)
are optimised by ``SentenceTransformerTrainer`` (it optimises loss parameters) but are not part
of the saved model: save them with :meth:`AdaptiveContrastiveLoss.save_loss_state` (or the
:class:`LossStateCallback`, which does it at every checkpoint) and restore them with
:meth:`~AdaptiveContrastiveLoss.load_loss_state`.

Large batches: ``tile_size=`` streams the similarity matrix in tiles with an exact backward
(Inf-CL, Cheng et al. 2024; :mod:`adaptcl.plugins.tiled`), so the loss itself needs memory
linear in the batch; ``mini_batch_size=`` adds gradient caching (GradCache, Gao et al. 2021, as
sentence-transformers' ``CachedMultipleNegativesRankingLoss``): the texts are embedded in
mini-batches without a graph, the loss and its gradient wrt the embeddings are computed on the
full batch, and each mini-batch is embedded again with gradient in backward (replaying its
random state, so dropout masks are identical) to push the cached gradient into the encoder.
Together they train with batches whose activations and similarity matrix would not fit.

Example:
    >>> from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    >>> from adaptcl.adapters.sentence_transformers import MACLLoss
    >>> model = SentenceTransformer("all-MiniLM-L6-v2")
    >>> loss = MACLLoss(model, temperature=0.05, alpha=2.0, a0=0.8)   # MACL's SimCSE setting
    >>> trainer = SentenceTransformerTrainer(model=model, train_dataset=pairs, loss=loss)
    >>> big = MACLLoss(model, mini_batch_size=64, tile_size=4096)   # batch 65,536 of texts
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from adaptcl import plugins

from . import require

require("sentence_transformers", "text")

from sentence_transformers.base.losses.gradcache import RandContext, _create_minibatch  # noqa: E402
from sentence_transformers.base.losses.merged_forward import embed_columns  # noqa: E402
from sentence_transformers.util import all_gather_with_grad, get_world_size  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

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


class SimCSEProjection(nn.Sequential):
    """SimCSE's training-only MLP over the CLS vector: ``Linear(d, d) -> Tanh`` (Gao et al. 2021)."""

    def __init__(self, dim: int) -> None:
        super().__init__(nn.Linear(dim, dim), nn.Tanh())


class _CachedColumn(torch.autograd.Function):
    """One column's embeddings computed without a graph; backward re-embeds each mini-batch with
    gradient under the random state of its first pass and back-propagates the cached gradient.

    ``dummy`` is an empty leaf requiring grad that puts this node into the loss's graph; the
    gradients of the loss's own parameters (projection, heads) flow the ordinary way, and the
    incoming gradient already carries any outer scaling (AMP scaler, accumulation).
    """

    @staticmethod
    def forward(ctx, dummy: Tensor, loss: AdaptiveContrastiveLoss, features: dict,
                mini_batch_size: int) -> Tensor:  # type: ignore[override]
        parts, states, ranges = [], [], []
        batch = _batch_size(features)
        with torch.no_grad():
            for begin in range(0, batch, mini_batch_size):
                end = min(begin + mini_batch_size, batch)
                mb = _create_minibatch(features, begin, end)
                states.append(RandContext(*(v for v in mb.values() if isinstance(v, Tensor))))
                parts.append(loss.model(mb)["sentence_embedding"])
                ranges.append((begin, end))
        ctx.loss, ctx.features, ctx.states, ctx.ranges = loss, features, states, ranges
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        with torch.enable_grad():
            for (begin, end), state in zip(ctx.ranges, ctx.states, strict=True):
                with state:
                    reps = ctx.loss.model(_create_minibatch(ctx.features, begin, end))["sentence_embedding"]
                if reps.requires_grad:
                    torch.autograd.backward(reps, grad[begin:end].to(reps.dtype))
        return None, None, None, None


def _batch_size(features: dict[str, Any]) -> int:
    for key in ("input_ids", "attention_mask"):
        if isinstance(features.get(key), Tensor):
            return features[key].shape[0]
    return next(v.shape[0] for v in features.values() if isinstance(v, Tensor) and v.ndim > 0)


class AdaptiveContrastiveLoss(nn.Module):
    """Base of the sentence-transformers losses: columns -> embeddings -> core loss.

    Args:
        model: the ``SentenceTransformer`` being trained.
        core: an :mod:`adaptcl.plugins` two-view loss module.
        projection: optional module applied to every embedding before the loss and only there
            (SimCSE's training MLP); trained with the loss, not saved with the model.
        gather_across_devices: gather candidates (and hard negatives) from every rank, with
            gradient, before the loss (more negatives per anchor under DDP).
        mini_batch_size: gradient caching: embed the texts ``mini_batch_size`` at a time without
            a graph, compute the loss on the whole batch, then re-embed each mini-batch with
            gradient in backward (same dropout masks). Same loss and gradients as without it;
            activation memory of one mini-batch. ``None`` (default) embeds in one pass.

    The subclasses also take ``tile_size`` (passed to the core loss): see
    :mod:`adaptcl.plugins.tiled`.
    """

    citation_text = INFONCE_CITATION

    def __init__(self, model: nn.Module, core: nn.Module, *, projection: nn.Module | None = None,
                 gather_across_devices: bool = False, mini_batch_size: int | None = None) -> None:
        super().__init__()
        if mini_batch_size is not None:
            if isinstance(mini_batch_size, bool) or not isinstance(mini_batch_size, int):
                raise TypeError(f"mini_batch_size must be an int or None, got {type(mini_batch_size).__name__}")
            if mini_batch_size < 1:
                raise ValueError(f"mini_batch_size must be >= 1, got {mini_batch_size}")
        self.mini_batch_size = mini_batch_size
        self.model = model
        self.core = core
        self.projection = projection
        self.gather_across_devices = bool(gather_across_devices)
        if self.gather_across_devices and hasattr(core, "gather_distributed"):
            core.gather_distributed = True
            core.gather_fn = _gather_fn
        self.last_stats: dict[str, Tensor] = {}

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None) -> Tensor:
        if self.mini_batch_size is not None and torch.is_grad_enabled():
            embeddings = self.embed_cached(sentence_features)
        else:
            embeddings = embed_columns(self.model, sentence_features)
        return self.compute_loss_from_embeddings(embeddings, labels)

    def embed_cached(self, sentence_features: Iterable[dict[str, Tensor]]) -> list[Tensor]:
        """Column embeddings whose backward re-embeds mini-batches (gradient caching)."""
        dummy = torch.empty(0, requires_grad=True)
        return [_CachedColumn.apply(dummy, self, dict(features), self.mini_batch_size)
                for features in sentence_features]

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        """Loss of ``(anchor, positive[, negative...])`` embedding columns; ``labels`` unused."""
        if len(embeddings) < 2:
            raise ValueError(
                f"{type(self).__name__} needs at least 2 columns (anchor, positive), got {len(embeddings)}"
            )
        if self.projection is not None:
            embeddings = [self.projection(e) for e in embeddings]
        anchors, positives = embeddings[0], embeddings[1]
        negatives = torch.cat(embeddings[2:]) if len(embeddings) > 2 else None
        if negatives is not None and self.gather_across_devices and get_world_size() > 1:
            negatives = all_gather_with_grad(negatives)
        loss = self.core(anchors, positives, negatives)
        self.last_stats = dict(self.core.last_stats)
        return loss

    @property
    def temperature(self) -> float:
        return float(self.core.temperature)

    def get_config_dict(self) -> dict[str, Any]:
        config = {"gather_across_devices": self.gather_across_devices}
        if getattr(self.core, "tile_size", None) is not None:
            config["tile_size"] = self.core.tile_size
        if self.mini_batch_size is not None:
            config["mini_batch_size"] = self.mini_batch_size
        if self.projection is not None:
            config["projection"] = type(self.projection).__name__
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


class InfoNCELoss(AdaptiveContrastiveLoss):
    """InfoNCE in the direction anchor -> candidates, like ``MultipleNegativesRankingLoss``.

    ``InfoNCELoss(model, temperature=0.05)`` equals ``MultipleNegativesRankingLoss(model,
    scale=20)``; ``symmetric=True`` averages both directions.
    """

    def __init__(self, model: nn.Module, temperature: float = 0.05, *, symmetric: bool = False,
                 projection: nn.Module | None = None, gather_across_devices: bool = False,
                 tile_size: int | None = None, mini_batch_size: int | None = None) -> None:
        core = plugins.InfoNCELoss(temperature, form="cross_view_symmetric" if symmetric else "cross_view",
                                   tile_size=tile_size)
        super().__init__(model, core, projection=projection, gather_across_devices=gather_across_devices,
                         mini_batch_size=mini_batch_size)
        self.symmetric = symmetric

    def get_config_dict(self) -> dict[str, Any]:
        return {"temperature": self.core.temperature, "symmetric": self.symmetric,
                **super().get_config_dict()}


class MACLLoss(AdaptiveContrastiveLoss):
    """MACL (Huang et al., ICML 2023) for sentence embeddings.

    Defaults are the paper's SimCSE setting: tau0 = 0.05, alpha = 2, A0 = 0.8, no reweighting
    ("the results are not sensitive to batch size, so we did not apply reweighting"). The
    adaptive temperature is clamped at ``min_temperature`` (default tau0 / 10).
    """

    citation_text = MACL_CITATION

    def __init__(self, model: nn.Module, temperature: float = 0.05, alpha: float = 2.0,
                 a0: float = 0.8, *, reweight: bool = False, adaptive: bool = True,
                 temperature_form: str = "linear", min_temperature: float | None = None,
                 symmetric: bool = False, projection: nn.Module | None = None,
                 gather_across_devices: bool = False, tile_size: int | None = None,
                 mini_batch_size: int | None = None) -> None:
        core = plugins.MACLLoss(temperature, alpha, a0, reweight=reweight, adaptive=adaptive,
                                temperature_form=temperature_form, min_temperature=min_temperature,
                                form="cross_view_symmetric" if symmetric else "cross_view",
                                tile_size=tile_size)
        super().__init__(model, core, projection=projection, gather_across_devices=gather_across_devices,
                         mini_batch_size=mini_batch_size)
        self.symmetric = symmetric

    def get_config_dict(self) -> dict[str, Any]:
        c = self.core
        return {"temperature": c.temperature, "alpha": c.alpha, "a0": c.a0, "reweight": c.reweight,
                "adaptive": c.adaptive, "temperature_form": c.temperature_form,
                "min_temperature": c.min_temperature, "symmetric": self.symmetric,
                **super().get_config_dict()}


class ASCLLoss(AdaptiveContrastiveLoss):
    """ASCL (Feng & Patras, 2022) with in-batch soft labels: the other positives of the batch
    are the negatives, and those closest to an anchor's own positive get soft target mass."""

    citation_text = ASCL_CITATION

    def __init__(self, model: nn.Module, temperature: float = 0.05,
                 sharpen_temperature: float = 0.025, num_neighbors: int = 1, mode: str = "ascl", *,
                 projection: nn.Module | None = None, gather_across_devices: bool = False,
                 tile_size: int | None = None, mini_batch_size: int | None = None) -> None:
        core = plugins.ASCLLoss(temperature, sharpen_temperature, num_neighbors, mode, form="cross_view",
                                tile_size=tile_size)
        super().__init__(model, core, projection=projection, gather_across_devices=gather_across_devices,
                         mini_batch_size=mini_batch_size)

    def get_config_dict(self) -> dict[str, Any]:
        c = self.core
        return {"temperature": c.temperature, "sharpen_temperature": c.sharpen_temperature,
                "num_neighbors": c.num_neighbors, "mode": c.mode, **super().get_config_dict()}


class AMCLLoss(AdaptiveContrastiveLoss):
    """AMCL (Wang et al., 2024): C projection heads and a learned pair temperature.

    The heads and the temperature network live in the loss and are used only in training; the
    saved ``SentenceTransformer`` is the encoder. Save/restore them with
    :meth:`save_loss_state` / :meth:`load_loss_state` or :class:`LossStateCallback`.
    """

    citation_text = AMCL_CITATION

    def __init__(self, model: nn.Module, num_heads: int = 2, projection_dim: int = 128,
                 hidden_dim: int | None = None, beta: float = 1e-3, eta: float = 1e-5,
                 iota: float = 2.0, *, negative_term: str = "softmax", kappa: int = 1,
                 objective: str = "infonce", gather_across_devices: bool = False,
                 tile_size: int | None = None, mini_batch_size: int | None = None) -> None:
        dim = embedding_dimension(model)
        if dim is None:
            raise ValueError("the model does not report its sentence embedding dimension")
        hidden = hidden_dim or dim
        core = plugins.AMCLLoss(plugins.PairTemperature(projection_dim, eta=eta, iota=iota),
                                beta=beta, negative_term=negative_term, kappa=kappa,
                                objective=objective, form="cross_view",
                                gather_distributed=gather_across_devices, tile_size=tile_size)
        super().__init__(model, core, gather_across_devices=gather_across_devices,
                         mini_batch_size=mini_batch_size)
        self.heads = plugins.MultiHeadProjection(dim, hidden, projection_dim, num_heads=num_heads)
        self.config = {"num_heads": num_heads, "projection_dim": projection_dim, "hidden_dim": hidden,
                       "beta": beta, "eta": eta, "iota": iota, "negative_term": negative_term,
                       "kappa": kappa, "objective": objective}

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        if len(embeddings) < 2:
            raise ValueError(f"AMCLLoss needs at least 2 columns (anchor, positive), got {len(embeddings)}")
        heads = [self.heads(e) for e in embeddings]  # [C, B, d'] each
        negatives = torch.cat(heads[2:], dim=1) if len(heads) > 2 else None
        loss = self.core(heads[0], heads[1], negatives)
        self.last_stats = dict(self.core.last_stats)
        return loss

    @property
    def temperature(self) -> float:
        return float(self.core.last_stats.get("temperature", torch.tensor(float("nan"))))

    def get_config_dict(self) -> dict[str, Any]:
        return {**self.config, **super().get_config_dict()}


class LossStateCallback(TrainerCallback):
    """Save a loss's own trainable state into every checkpoint and the final output directory.

    Example:
        >>> trainer = SentenceTransformerTrainer(model=model, loss=loss, ...,
        ...                                      callbacks=[LossStateCallback(loss)])
    """

    def __init__(self, loss: AdaptiveContrastiveLoss) -> None:
        self.loss = loss

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.loss.save_loss_state(Path(args.output_dir) / f"checkpoint-{state.global_step}")
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.loss.save_loss_state(args.output_dir)
        return control


class AdaptiveStatsCallback(TrainerCallback):
    """Add the loss's adaptive quantities (temperature, alignment, mean W, confidence) to the
    trainer's logs, so they reach the console, TensorBoard or W&B with the loss value."""

    def __init__(self, loss: AdaptiveContrastiveLoss, prefix: str = "adaptcl/") -> None:
        self.loss = loss
        self.prefix = prefix
        self.history: list[dict[str, float]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and self.loss.last_stats:
            stats = {f"{self.prefix}{k}": float(v) for k, v in self.loss.last_stats.items()}
            logs.update(stats)
            self.history.append({"step": state.global_step, **stats})
        return control


def describe(loss: AdaptiveContrastiveLoss) -> str:
    """One-line JSON description (class + config), e.g. for run logs."""
    return json.dumps({"loss": type(loss).__name__, **loss.get_config_dict()}, default=str)
