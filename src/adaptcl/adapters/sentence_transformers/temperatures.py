"""The temperature rules as sentence-transformers losses: a cosine schedule of the trainer's step
and a learned temperature.

Both are InfoNCE in the direction anchor -> candidates (``MultipleNegativesRankingLoss``'s
columns: ``(anchor, positive[, negative...])``) with the temperature changed.

What the trainer gives a loss. ``SentenceTransformerTrainer`` hands a loss only the model: it
calls ``loss(features, labels)`` (``compute_loss``), moves the loss to the model's device
(``prepare_loss``) and swaps a wrapped model into it (``override_model_in_loss``); nothing
tells the loss the step. So:

* :class:`TemperatureScheduleLoss` is driven, when possible, by the trainer's
  ``state.global_step`` (the optimisation steps taken, restored on resume):
  :class:`~adaptcl.adapters.sentence_transformers.LossStateCallback` sets it at
  ``on_step_begin`` and :class:`~adaptcl.adapters.sentence_transformers.AdaptiveSentenceTransformerTrainer`
  before every training step, exactly, with gradient accumulation too. When nothing drives it
  (the loss alone passed to ``SentenceTransformerTrainer``) it counts its own training steps:
  one per forward pass with gradients enabled, which is the trainer's step without gradient
  accumulation (with accumulation it counts micro-batches). That count is state of the loss
  (``save_loss_state``); a resumed run restores it only through the callback (or
  ``load_loss_state``), since the trainer does not tell the loss where it resumes.
* :class:`LearnableTemperatureLoss` holds ``s`` as a parameter of the loss:
  ``SentenceTransformerTrainer`` optimises the parameters of its loss (its
  ``get_optimizer_cls_and_kwargs`` builds the parameter groups from ``loss.named_parameters()``)
  and ``save_loss_state`` / ``load_loss_state`` / :class:`LossStateCallback` save and restore it
  with the loss's other state (it is not part of the saved ``SentenceTransformer``).

References: Kukleva et al., "Temperature Schedules for self-supervised contrastive methods on
long-tail data", ICLR 2023; Radford et al., "Learning Transferable Visual Models From Natural
Language Supervision" (CLIP), ICML 2021.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch import Tensor, nn

from adaptcl import plugins
from adaptcl.adapters import require
from adaptcl.plugins.logit_scale import OPEN_CLIP_TEMPERATURE
from adaptcl.plugins.schedule import SCHEDULE_PAPER, ScheduleControls
from adaptcl.plugins.validation import TileSize

require("sentence_transformers", "text")

from ._arguments import _gather_kwargs, _positional_like_the_peer  # noqa: E402
from .base import AdaptiveContrastiveLoss  # noqa: E402
from .citations import CLIP_CITATION, TEMPERATURE_SCHEDULE_CITATION  # noqa: E402
from .losses import _ScalarTemperatureLoss  # noqa: E402

__all__ = ["LearnableTemperatureLoss", "TemperatureScheduleLoss"]


class TemperatureScheduleLoss(ScheduleControls, AdaptiveContrastiveLoss):
    """InfoNCE at Kukleva et al.'s cosine-scheduled temperature, driven by the trainer's step.

    ``tau(step) = tau_min + (tau_max - tau_min) (1 + cos(2 pi step / period)) / 2``
    (:class:`adaptcl.plugins.TemperatureScheduleLoss`: the form and the defaults, 0.1 to 1.0
    with period 400, are the authors'). Who sets the step: the module docstring. With
    ``min_temperature == max_temperature`` it is ``InfoNCELoss(model, temperature=...)``. The
    schedule has no single scale, so every argument after ``model`` is keyword-only.

    Example:
        >>> loss = TemperatureScheduleLoss(model, min_temperature=0.05, max_temperature=0.5,
        ...                                period=1000)
        >>> trainer = SentenceTransformerTrainer(model=model, train_dataset=pairs, loss=loss,
        ...                                      callbacks=[LossStateCallback(loss)])
    """

    citation_text = TEMPERATURE_SCHEDULE_CITATION
    schedule_attribute = "core"

    @_positional_like_the_peer
    def __init__(self, model: nn.Module | None, *,
                 min_temperature: float = SCHEDULE_PAPER["min_temperature"],
                 max_temperature: float = SCHEDULE_PAPER["max_temperature"],
                 period: int = SCHEDULE_PAPER["period"], step: int = 0, symmetric: bool = False,
                 projection: nn.Module | None = None, gather_across_devices: bool = False,
                 tile_size: TileSize = "auto", mini_batch_size: int | None = None,
                 mini_batch_num_tokens: int | None = None, check_finite: bool = True,
                 show_progress_bar: bool = False) -> None:
        self._check_model(model)
        core = plugins.TemperatureScheduleLoss(min_temperature, max_temperature, period,
                                               step=step, form="cross_view",
                                               check_finite=check_finite, tile_size=tile_size,
                                               **_gather_kwargs(gather_across_devices))
        super().__init__(model, core, projection=projection,
                         gather_across_devices=gather_across_devices,
                         mini_batch_size=mini_batch_size,
                         mini_batch_num_tokens=mini_batch_num_tokens, symmetric=symmetric,
                         show_progress_bar=show_progress_bar)

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None) -> Tensor:
        loss = super().forward(sentence_features, labels)
        self.count_training_step()  # nothing drives the schedule: count the training steps
        return loss

    def get_config_dict(self) -> dict[str, Any]:
        c = self.core
        return {"min_temperature": c.min_temperature, "max_temperature": c.max_temperature,
                "period": c.period, "symmetric": self.symmetric, **super().get_config_dict()}


class LearnableTemperatureLoss(_ScalarTemperatureLoss):
    """InfoNCE at a learned temperature ``exp(-s)`` (CLIP's logit scale), ``s`` a parameter of
    the loss that ``SentenceTransformerTrainer`` optimises.

    ``temperature`` (or sentence-transformers' ``scale``, the initial logit scale
    ``exp(s) = 1 / temperature``; positional order ``(model, scale, similarity_fct)`` as
    ``MultipleNegativesRankingLoss``) is where ``s`` starts: 0.05 by default, the other losses'
    temperature (CLIP starts at 0.07). ``s`` stays within
    ``[log(1 / max_temperature), log(1 / min_temperature)]`` (open_clip's ``[0, log 100]``), clamped
    as open_clip clamps it (:class:`adaptcl.plugins.LearnableTemperatureLoss`). Before any update
    it equals ``MultipleNegativesRankingLoss(model, scale=exp(s))``. Save and restore ``s`` with
    :meth:`save_loss_state` / :meth:`load_loss_state` or :class:`LossStateCallback`. The trainer's
    weight decay (``weight_decay``, 0 by default) would reach ``s`` too: leave it at 0 for the
    loss, as open_clip does.

    Example:
        >>> loss = LearnableTemperatureLoss(model, temperature=0.05)
        >>> trainer = SentenceTransformerTrainer(model=model, train_dataset=pairs, loss=loss,
        ...                                      callbacks=[LossStateCallback(loss)])
    """

    citation_text = CLIP_CITATION

    @_positional_like_the_peer
    def __init__(self, model: nn.Module | None, scale: float | None = None,
                 similarity_fct: Callable | None = None, *, temperature: float | None = None,
                 min_temperature: float = OPEN_CLIP_TEMPERATURE["min_temperature"],
                 max_temperature: float = OPEN_CLIP_TEMPERATURE["max_temperature"],
                 symmetric: bool = False, projection: nn.Module | None = None,
                 gather_across_devices: bool = False, tile_size: TileSize = "auto",
                 mini_batch_size: int | None = None, mini_batch_num_tokens: int | None = None,
                 check_finite: bool = True, show_progress_bar: bool = False) -> None:
        super().__init__(model, plugins.LearnableTemperatureLoss, temperature=temperature,
                         scale=scale, similarity_fct=similarity_fct,
                         core_kwargs={"min_temperature": min_temperature,
                                      "max_temperature": max_temperature},
                         gather_across_devices=gather_across_devices, check_finite=check_finite,
                         tile_size=tile_size, projection=projection,
                         mini_batch_size=mini_batch_size,
                         mini_batch_num_tokens=mini_batch_num_tokens, symmetric=symmetric,
                         show_progress_bar=show_progress_bar)

    @property
    def scale(self) -> float:
        """The current logit scale ``exp(s) = 1 / tau`` (learned: read-only)."""
        return 1.0 / float(self.core.temperature)

    @property
    def logit_scale(self) -> nn.Parameter:
        """The learned ``s = log(1 / tau)``."""
        return self.core.logit_scale

    def get_config_dict(self) -> dict[str, Any]:
        c = self.core
        return {"initial_temperature": c.initial_temperature,
                "min_temperature": c.min_temperature, "max_temperature": c.max_temperature,
                "symmetric": self.symmetric, **super().get_config_dict()}
