"""What stops a run, and how it is said: user errors, non-results, divergences, failed jobs;
notes, said by one process of a distributed run.

The bottom layer of the engine: imports only the standard library.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import Any


class RecipeError(ValueError):
    """A user-facing error (bad option, bad or missing data): the CLI prints one line, exit 2."""


class NonResultError(RecipeError):
    """A run that is not a result: no optimisation step, no metrics, constant embeddings."""


class DivergedError(NonResultError):
    """A run whose loss, metrics or embeddings became NaN or inf; ``step`` and ``loss`` where
    known. In a grid a diverged cell is recorded as such and the other cells go on."""

    def __init__(self, message: str, *, step: int | None = None, loss: float | None = None):
        super().__init__(message)
        self.step, self.loss = step, loss


class CellsFailedError(RuntimeError):
    """Cells whose job crashed: the CLI prints this one line, exit 1 (the others are stored)."""


class CellConfigError(RuntimeError):
    """A recipe's bug: a cell's identity or record read ``Recipe.config`` (the sweep's first
    point) instead of the cell's own config."""


class RunStopped(RuntimeError):
    """A run that could not go on through no fault of its own (another process of a run on
    several devices died): every process prints this one line, that a rerun resumes, exit 1."""


def distributed_follower() -> bool:
    """Whether this process is a non-zero rank of a distributed launch (``RANK``,
    ``LOCAL_RANK`` or ``NODE_RANK`` set and not 0): it computes each cell with rank 0 but owns
    no result, so it takes no lock and registers nothing."""
    for name in ("RANK", "LOCAL_RANK", "NODE_RANK"):
        with contextlib.suppress(ValueError):
            if int(os.environ.get(name, "0") or "0") != 0:
                return True
    return False


def note(message: str) -> None:
    """``adaptcl: note: <message>`` on stderr: what the user should know that is no error. A
    non-zero rank of a distributed run (:func:`distributed_follower`) runs the command again
    and would say it again: rank 0 says it."""
    if not distributed_follower():
        print(f"adaptcl: note: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def warnings_as_notes(category: type[Warning]) -> Iterator[None]:
    """Each warning of ``category`` the block raises as one :func:`note` line (the command
    line's voice, not Python's ``file:line: Warning``); other warnings pass as they would."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", category)
        yield
    for w in caught:
        if issubclass(w.category, category):
            note(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def plural(n: int, word: str = "run") -> str:
    """``1 run``, ``2 runs``."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


def check_seed(seed: Any, where: str = "seed") -> int:
    """``seed`` as an ``int`` if it is an integer in ``[0, 2**32 - 1]`` (numpy's and
    scikit-learn's range), else :class:`RecipeError` naming ``where``."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise RecipeError(f"{where}: seed {seed!r} is not an integer; seeds are integers in "
                          f"[0, 2**32 - 1]")
    if not 0 <= int(seed) <= 2**32 - 1:
        raise RecipeError(f"{where}: seed {int(seed)} is out of range; seeds are integers in "
                          f"[0, 2**32 - 1] (numpy's range)")
    return int(seed)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """``ValueError`` and the file errors a check raises, as :class:`RecipeError`."""
    try:
        yield
    except RecipeError:
        raise
    except (ValueError, FileNotFoundError, NotADirectoryError, PermissionError) as err:
        raise RecipeError(str(err)) from err


def check_record(label: str, record: Mapping[str, Any], *, trains: bool = True) -> None:
    """Refuse a record that is no result (:class:`NonResultError` naming the cell ``label``):
    ``metrics`` must be finite numbers; a training cell (``trains``) needs an optimisation
    step; ``losses``, if present, must be finite (else :class:`DivergedError` at that step)."""
    metrics = record.get("metrics")
    if not isinstance(metrics, Mapping) or not metrics:
        raise NonResultError(f"{label}: the run reported no metrics")
    bad = {k: v for k, v in metrics.items() if v is None or not math.isfinite(float(v))}
    if bad:
        raise DivergedError(f"{label}: non-finite metrics {bad}; nothing was stored")
    if trains:
        require_steps(record.get("optimisation_steps"), label)
    losses = record.get("losses") or []
    step = next((i for i, v in enumerate(losses, 1) if not math.isfinite(float(v))), None)
    if step is not None:
        raise DivergedError(f"{label}: non-finite training loss at step {step}; nothing was "
                            "stored", step=step, loss=float(losses[step - 1]))


def require_steps(steps: int | None, where: str) -> None:
    """Refuse a training run that took no optimisation step (an untrained model is no result)."""
    if not steps:
        raise NonResultError(
            f"{where}: the run performed no optimisation step (every batch was skipped or there "
            "were no epochs); check --batch-size and --epochs")


def trained_embeddings(x: Any, where: str, *, allow_constant: bool = False) -> None:
    """:func:`adaptcl.evaluation.checks.check_embeddings` on a *trained* model's output, same
    messages: NaN/inf is :class:`DivergedError`, no or constant embeddings
    :class:`NonResultError`."""
    from adaptcl.evaluation.checks import check_embeddings
    from adaptcl.plugins.validation import NonFiniteError

    try:
        check_embeddings(x, where, allow_constant=allow_constant)
    except NonFiniteError as err:
        raise DivergedError(str(err)) from None
    except ValueError as err:
        raise NonResultError(str(err)) from None
