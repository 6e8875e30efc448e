"""The checkpoints of a ``SentenceTransformerTrainer`` run: which loss state belongs to one, and
whether one can be resumed (and so the last one that can).

The trainer writes ``<output_dir>/checkpoint-<step>/`` in order: the model, the optimiser and
scheduler, the RNG states, then ``trainer_state.json``; :class:`LossStateCallback` then writes
the loss state (``adaptcl_loss_state.pt``), after recording its :func:`loss_state_digest` in the
trainer state. A run killed while saving, or a disk that filled up, leaves a checkpoint that
``trainer.train(resume_from_checkpoint=...)`` cannot load, or loads only in part:
:func:`verify_checkpoint` names what is wrong with one, :func:`last_complete_checkpoint` finds
the newest that is whole.

Example:
    >>> from adaptcl.adapters.sentence_transformers import last_complete_checkpoint
    >>> resume = last_complete_checkpoint("out/checkpoints")   # None: start from scratch
    >>> trainer.train(resume_from_checkpoint=str(resume) if resume else None)
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from adaptcl.adapters import require

require("sentence_transformers", "text")

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR  # noqa: E402

from .base import LOSS_STATE_FILE, loss_state_digest  # noqa: E402

__all__ = ["IncompleteCheckpointError", "last_complete_checkpoint", "recorded_loss_state",
           "verify_checkpoint"]

TRAINER_STATE_FILE = "trainer_state.json"  # transformers' TRAINER_STATE_NAME
RECORD = "saved_loss_state"  # LossStateCallback's attribute in the trainer state
_CHECKPOINT = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")  # as transformers' get_last_checkpoint


class IncompleteCheckpointError(RuntimeError):
    """A checkpoint that a resume cannot load whole; the message names the file."""


def recorded_loss_state(stateful_callbacks: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The loss state a checkpoint's trainer state records (``TrainerState.stateful_callbacks``):
    ``{"checkpoint": <folder it was written to>, "sha256": <its digest>}``, or ``None`` when the
    checkpoint was written without :class:`LossStateCallback`."""
    records = []
    for entry in (stateful_callbacks or {}).values():
        for item in entry if isinstance(entry, list) else [entry]:
            attributes = item.get("attributes", {}) if isinstance(item, Mapping) else {}
            if attributes.get(RECORD) is not None:
                records.append(attributes[RECORD])
    if len(records) > 1:
        raise ValueError(f"the trainer state records {len(records)} loss states: one "
                         f"LossStateCallback per trainer (they would share {LOSS_STATE_FILE})")
    return records[0] if records else None


def read_trainer_state(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """``checkpoint/trainer_state.json`` as a dict (raises :class:`IncompleteCheckpointError`)."""
    path = Path(checkpoint) / TRAINER_STATE_FILE
    if not path.is_file():
        raise IncompleteCheckpointError(f"no {TRAINER_STATE_FILE}: the save was cut short")
    try:
        with path.open(encoding="utf-8") as handle:
            state = json.load(handle)
    except (OSError, ValueError) as err:
        raise IncompleteCheckpointError(f"{TRAINER_STATE_FILE}: {err}") from err
    if not isinstance(state, dict) or "global_step" not in state:
        raise IncompleteCheckpointError(f"{TRAINER_STATE_FILE} is not a trainer state")
    return state


def verify_checkpoint(checkpoint: str | os.PathLike) -> None:
    """Raise :class:`IncompleteCheckpointError` unless ``checkpoint`` can be resumed whole.

    Checks: ``trainer_state.json`` (written last by the trainer) is there and reads; every
    ``*.safetensors`` (the model's weights) covers its header, every ``*.pt`` / ``*.pth`` /
    ``*.bin`` (optimiser, scheduler, RNG, training arguments) and ``*.json`` reads; the loss state
    the trainer state records is there and is that one (:func:`loss_state_digest`).
    """
    from safetensors import safe_open

    folder = Path(checkpoint)
    record = recorded_loss_state(read_trainer_state(folder).get("stateful_callbacks"))
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = str(path.relative_to(folder))
        try:
            if path.suffix == ".safetensors":
                with safe_open(str(path), "pt"):
                    pass
            elif path.suffix in (".pt", ".pth", ".bin"):
                # mmap: the files are checked whole (zip directory, pickle) without reading them
                torch.load(path, map_location="cpu", mmap=True, weights_only=False)
            elif path.suffix == ".json":
                with path.open(encoding="utf-8") as handle:
                    json.load(handle)
        except Exception as err:  # noqa: BLE001 - whatever a reader raises, the file is broken
            raise IncompleteCheckpointError(f"{name}: {type(err).__name__}: {err}") from err
    if record is None or record.get("sha256") is None:
        return
    state_file = folder / LOSS_STATE_FILE
    if not state_file.is_file():
        raise IncompleteCheckpointError(f"no {LOSS_STATE_FILE}, which its trainer state records")
    saved = torch.load(state_file, map_location="cpu", weights_only=True)["state"]
    if loss_state_digest(saved) != record["sha256"]:
        raise IncompleteCheckpointError(f"{LOSS_STATE_FILE} is not the loss state its trainer "
                                        "state records")


def last_complete_checkpoint(output_dir: str | os.PathLike, *,
                             on_incomplete: Callable[[Path, Exception], None] | None = None
                             ) -> Path | None:
    """The newest ``checkpoint-<step>`` folder in ``output_dir`` that :func:`verify_checkpoint`
    accepts, or ``None``.

    Newer ones that it refuses are passed, newest first, to ``on_incomplete(folder, error)``
    (e.g. to name them and set them aside; they stay where they are otherwise, and
    ``resume_from_checkpoint=True`` would still pick the newest of them). Older ones are not
    read.
    """
    root = Path(output_dir)
    if not root.is_dir():
        return None
    steps = sorted(((int(m.group(1)), p) for p in root.iterdir()
                    if p.is_dir() and (m := _CHECKPOINT.match(p.name))), reverse=True)
    for _, folder in steps:
        try:
            verify_checkpoint(folder)
        except IncompleteCheckpointError as err:
            if on_incomplete is not None:
                on_incomplete(folder, err)
            continue
        return folder
    return None
