"""SimCSE's poolers, the losses its training takes, by name, the papers' training settings, and
the one message for a model name that names nothing loadable here.

Imports no framework, so a command line lists them (``--help``) without loading
sentence-transformers; :func:`adaptcl.adapters.sentence_transformers.build_simcse_model` and
:func:`~adaptcl.adapters.sentence_transformers.make_loss` build what they name.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["LOSSES", "PAPER_CONFIGS", "PAPER_FAMILIES", "POOLERS", "model_unavailable",
           "paper_family"]

#: SimCSE's poolers (Gao et al. 2021): the CLS vector with (``cls``) or without
#: (``cls_before_pooler``) the training-only MLP, the mean of the last layer's tokens (``avg``),
#: of the first and last layers' (``avg_first_last``) and of the last two layers' (``avg_top2``).
POOLERS = ("cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2")
#: the losses :func:`~adaptcl.adapters.sentence_transformers.make_loss` builds (InfoNCE is SimCSE)
LOSSES = ("infonce", "macl", "ascl", "amcl", "dystress", "temperature_schedule",
          "learnable_temperature")
#: the SimCSE / MACL paper training settings per model family (Gao et al. 2021; Huang et al.
#: 2023, App. B.4): one flag away for a GPU machine
PAPER_CONFIGS: dict[str, dict[str, float | int]] = {
    "bert": {"learning_rate": 3e-5, "batch_size": 64, "max_seq_length": 32, "epochs": 1.0,
             "eval_steps": 125},
    "roberta": {"learning_rate": 1e-5, "batch_size": 64, "max_seq_length": 32, "epochs": 1.0,
                "eval_steps": 125},
}
#: the model families of :data:`PAPER_CONFIGS`
PAPER_FAMILIES = tuple(PAPER_CONFIGS)


def paper_family(model: str) -> str:
    """``roberta`` when the model (its ``config.json`` or its name) is a RoBERTa, else ``bert``:
    the key of its :data:`PAPER_CONFIGS`."""
    config = Path(model) / "config.json"
    if config.is_file():
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type", "")
        return "roberta" if "roberta" in model_type else "bert"
    return "roberta" if "roberta" in model.lower() else "bert"


def model_unavailable(model: str, err: BaseException) -> FileNotFoundError:
    """The error for a model path or hub name that transformers / sentence-transformers cannot
    load here (a missing folder, a hub name while offline), with the loader's first line.

    >>> model_unavailable("no-such-model", OSError("We couldn't connect to 'https://huggingface.co'"))
    FileNotFoundError("model 'no-such-model' is neither a local model folder nor a hub model available here (offline runs need a local path): We couldn't connect to 'https://huggingface.co'")
    """
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return FileNotFoundError(f"model {model!r} is neither a local model folder nor a hub model "
                             f"available here (offline runs need a local path): {first}")
