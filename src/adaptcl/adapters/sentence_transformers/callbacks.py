"""``LossStateCallback``: the loss's own trainable state in every checkpoint of
``SentenceTransformerTrainer``, restored from the checkpoint the trainer resumes from, and the
trainer's step for a scheduled temperature; :func:`quiet_model_card`, the model card's own
progress bar off."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from adaptcl.adapters import require

require("sentence_transformers", "text")

from transformers import TrainerCallback  # noqa: E402
from transformers.trainer_callback import ExportableState  # noqa: E402
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR  # noqa: E402

from adaptcl.plugins import set_schedule_step  # noqa: E402

from .base import (  # noqa: E402
    LOSS_STATE_FILE,
    AdaptiveContrastiveLoss,
    LossStateMismatchError,
    loss_state_digest,
)
from .checkpoints import RECORD, read_trainer_state, recorded_loss_state  # noqa: E402

__all__ = ["LossStateCallback", "quiet_model_card"]


class LossStateCallback(TrainerCallback, ExportableState):
    """Save a loss's own trainable state into every checkpoint and the final output directory,
    and restore it from the checkpoint the trainer resumes from.

    ``trainer.train(resume_from_checkpoint=...)`` restores the model, the optimiser and the
    scheduler, but the loss's own parameters (AMCL's heads and temperature network, SimCSE's
    training MLP) are not part of the model. With this callback each checkpoint holds them in
    ``adaptcl_loss_state.pt``, and its ``trainer_state.json`` records which state that is (where
    it was written and its :func:`~adaptcl.adapters.sentence_transformers.base.loss_state_digest`;
    transformers saves this record with every checkpoint, as for its own stateful callbacks). The
    trainer does not tell callbacks which checkpoint it resumes from, but the trainer state it
    hands them at ``on_train_begin`` is the one loaded from that checkpoint: the callback loads the
    loss state with the recorded digest from the folder the record names, else from
    ``TrainingArguments(resume_from_checkpoint=...)``, else from ``output_dir/checkpoint-<step>``,
    and never a state with another digest. When none holds it (a checkpoint moved away from where
    it was written, its state file deleted, a checkpoint written without this callback), the
    resume fails with one line instead of training on from fresh or foreign heads.

    With ``load_best_model_at_end`` the trainer reloads the best checkpoint's model when training
    ends; the callback then loads that checkpoint's loss state too, so the model and the loss
    state in ``output_dir`` belong together.

    Works with the plain ``SentenceTransformerTrainer``. Leave
    ``TrainingArguments(restore_callback_states_from_checkpoint=...)`` off (the default): it
    rebuilds callbacks from JSON, without their loss.

    It also drives a scheduled temperature
    (:class:`~adaptcl.adapters.sentence_transformers.TemperatureScheduleLoss`): at
    ``on_step_begin`` (the first micro-batch of each optimisation step) the schedule's step
    becomes the trainer's ``state.global_step``, which the trainer restores on resume.

    Example:
        >>> trainer = SentenceTransformerTrainer(model=model, loss=loss, ...,
        ...                                      callbacks=[LossStateCallback(loss)])
        >>> trainer.train(resume_from_checkpoint=True)   # model, optimiser and loss state
    """

    def __init__(self, loss: AdaptiveContrastiveLoss) -> None:
        if not isinstance(loss, AdaptiveContrastiveLoss):
            raise TypeError(
                f"loss must be the adaptcl loss whose state to save, got {type(loss).__name__}"
                + (": TrainingArguments(restore_callback_states_from_checkpoint=True) rebuilds "
                   "callbacks without it; leave that option off, LossStateCallback restores the "
                   "loss state itself" if loss is None else ""))
        self.loss = loss
        self._args: Any = None
        self._state: Any = None

    @staticmethod
    def _checkpoint_dir(args, state) -> Path:
        """The trainer's checkpoint folder of the current step (``output_dir/checkpoint-N``)."""
        return Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"

    def state(self) -> dict[str, Any]:
        """transformers' ``ExportableState``: called as a checkpoint is saved, stored in its
        ``trainer_state.json``. The loss has no JSON form, hence ``loss=None`` (see
        ``__init__``)."""
        record = None
        if self._state is not None and self.loss.loss_state_dict():
            record = {"checkpoint": str(self._checkpoint_dir(self._args, self._state).resolve()),
                      "sha256": loss_state_digest(self.loss.loss_state_dict())}
        return {"args": {"loss": None}, "attributes": {RECORD: record}}

    def on_train_begin(self, args, state, control, **kwargs):
        self._args, self._state = args, state
        if state.global_step > 0 and self.loss.loss_state_dict():
            self._load_resumed(args, state)
        return control

    def _load_resumed(self, args, state) -> None:
        step, name = state.global_step, type(self.loss).__name__
        record = recorded_loss_state(state.stateful_callbacks)
        if record is None or record.get("sha256") is None:
            raise FileNotFoundError(
                f"LossStateCallback: the trainer resumes at step {step} from a checkpoint "
                f"written without LossStateCallback (its trainer_state.json records no loss "
                f"state), so {name}'s own parameters cannot be restored: resume from a "
                f"checkpoint written with LossStateCallback(loss) among the callbacks")
        named = getattr(args, "resume_from_checkpoint", None)
        candidates = [Path(record["checkpoint"])]
        if isinstance(named, (str, os.PathLike)) and Path(named).is_dir():
            candidates.append(Path(named))
        candidates.append(self._checkpoint_dir(args, state))
        seen: list[str] = []
        for folder in dict.fromkeys(candidates):
            try:
                self.loss.load_loss_state(folder, digest=record["sha256"])
                return
            except FileNotFoundError:
                seen.append(f"{str(folder)!r} (no {LOSS_STATE_FILE})")
            except LossStateMismatchError:
                seen.append(f"{str(folder)!r} (another loss state)")
        raise FileNotFoundError(
            f"LossStateCallback: the trainer resumes at step {step} from a checkpoint whose "
            f"{LOSS_STATE_FILE} (sha256 {record['sha256'][:12]}) is in none of {', '.join(seen)}, "
            f"so {name}'s own parameters cannot be restored: name the checkpoint's folder in "
            f"TrainingArguments(resume_from_checkpoint=...) as well")

    def on_step_begin(self, args, state, control, **kwargs):
        set_schedule_step(self.loss, state.global_step)
        return control

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.loss.save_loss_state(self._checkpoint_dir(args, state))
        return control

    def on_train_end(self, args, state, control, **kwargs):
        best = state.best_model_checkpoint
        if args.load_best_model_at_end and best is not None and self.loss.loss_state_dict():
            # the trainer has just reloaded the best checkpoint's model: its loss state goes with it
            record = recorded_loss_state(read_trainer_state(best).get("stateful_callbacks"))
            self.loss.load_loss_state(best, digest=record["sha256"] if record else None)
        if state.is_world_process_zero:
            self.loss.save_loss_state(args.output_dir)
        return control


@contextlib.contextmanager
def quiet_model_card() -> Iterator[None]:
    """No "Computing widget examples" bar while a trainer is built: sentence-transformers'
    model-card callback draws it with a plain ``tqdm`` of its own module when the trainer
    starts, outside transformers' ``disable_tqdm`` and logging switches. The card is the same."""
    from sentence_transformers.base import model_card

    bar = getattr(model_card, "tqdm", None)
    if bar is None:  # another version draws no bar there
        yield
        return
    model_card.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        model_card.tqdm = bar
