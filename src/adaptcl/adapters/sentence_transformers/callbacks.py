"""``LossStateCallback``: the loss's own trainable state in every checkpoint of
``SentenceTransformerTrainer``, restored when the trainer resumes."""

from __future__ import annotations

import os
from pathlib import Path

from adaptcl.adapters import require

require("sentence_transformers", "text")

from transformers import TrainerCallback  # noqa: E402
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR  # noqa: E402

from .base import LOSS_STATE_FILE, AdaptiveContrastiveLoss  # noqa: E402

__all__ = ["LossStateCallback"]


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
