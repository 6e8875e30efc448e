"""What stops a run, and how it is said: user errors, non-results, divergences, failed jobs.

A :class:`RecipeError` is the user's to fix: the CLI prints one line ``adaptcl <recipe>: error:
...`` and exits 2. :class:`NonResultError` is a run that produced nothing worth storing (no
optimisation step, no metrics); :class:`DivergedError` one whose loss, metrics or embeddings
became NaN or inf. :class:`CellsFailedError` names the cells whose job crashed (exit 1). Every
message the engine prints that is not an error is one :func:`note` line on stderr.

The bottom layer of the engine: imports only the standard library.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import Any


class RecipeError(ValueError):
    """A user-facing error (bad option, bad or missing data): the CLI prints one line, exit 2."""


class NonResultError(RecipeError):
    """A run that is not a result: no optimisation step, no metrics, constant embeddings."""


class DivergedError(NonResultError):
    """A run whose loss, metrics or embeddings became NaN or inf: it diverged.

    ``step`` and ``loss``: the optimisation step it diverged at and that step's loss, when
    known. In a grid a diverged cell is recorded as such and the other cells go on.
    """

    def __init__(self, message: str, *, step: int | None = None, loss: float | None = None):
        super().__init__(message)
        self.step, self.loss = step, loss


class CellsFailedError(RuntimeError):
    """Cells whose job raised (a crash, not a user error): the CLI prints this one line and
    exits 1; the other cells' records are stored and the table is written."""


class RunStopped(RuntimeError):
    """A run that could not go on through no fault of its own (another process of a run on
    several devices died): every process prints this one line, that a rerun resumes, exit 1."""


#: the largest seed: numpy's ``default_rng`` / ``RandomState`` and scikit-learn take seeds in
#: ``[0, 2**32 - 1]``
SEED_MAX = 2**32 - 1


def note(message: str) -> None:
    """One line on stderr, ``adaptcl: note: <message>``: something the user should know that is
    not an error (a repeated value dropped, a cell another process is computing)."""
    print(f"adaptcl: note: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def warnings_as_notes(category: type[Warning]) -> Iterator[None]:
    """Each warning of ``category`` the block raises as one :func:`note` line (the command
    line's voice, not Python's ``file:line: Warning``): an old loss spelling's
    ``FutureWarning``, a rebuilt cache's ``RuntimeWarning``. Other warnings pass as they would."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", category)
        yield
    for w in caught:
        if issubclass(w.category, category):
            note(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def runs(n: int) -> str:
    """``1 run``, ``2 runs``."""
    return f"{n} run" + ("" if n == 1 else "s")


def first_line(err: BaseException) -> str:
    """The first line of an error's message ("" when it has none)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


def check_seed(seed: Any, where: str = "seed") -> int:
    """``seed`` as an ``int`` if it is an integer in ``[0, 2**32 - 1]``, else :class:`RecipeError`
    naming it (``where`` says whose seed: an option, a cell)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise RecipeError(f"{where}: seed {seed!r} is not an integer; seeds are integers in "
                          f"[0, 2**32 - 1]")
    if not 0 <= int(seed) <= SEED_MAX:
        raise RecipeError(f"{where}: seed {int(seed)} is out of range; seeds are integers in "
                          f"[0, 2**32 - 1] (numpy's range)")
    return int(seed)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn ``ValueError``, ``FileNotFoundError``, ``NotADirectoryError`` and ``PermissionError``
    raised while validating into :class:`RecipeError`."""
    try:
        yield
    except RecipeError:
        raise
    except (ValueError, FileNotFoundError, NotADirectoryError, PermissionError) as err:
        raise RecipeError(str(err)) from err


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def check_record(label: str, record: Mapping[str, Any], *, trains: bool = True) -> None:
    """Refuse a record that is not a result (raises :class:`NonResultError` naming the cell
    ``label``): it needs ``metrics`` (name -> finite number); a training cell (``trains``) at
    least one ``optimisation_steps``, and ``losses`` (if present) must be finite."""
    metrics = record.get("metrics")
    if not isinstance(metrics, Mapping) or not metrics:
        raise NonResultError(f"{label}: the run reported no metrics")
    bad = {k: v for k, v in metrics.items() if v is None or _non_finite(float(v))}
    if bad:
        raise DivergedError(f"{label}: non-finite metrics {bad}; nothing was stored")
    if trains:
        require_steps(record.get("optimisation_steps"), label)
    losses = record.get("losses") or []
    bad_steps = [i for i, v in enumerate(losses, 1) if _non_finite(float(v))]
    if bad_steps:
        step = bad_steps[0]
        raise DivergedError(f"{label}: non-finite training loss at step {step}; nothing was "
                            "stored", step=step, loss=float(losses[step - 1]))


def require_steps(steps: int | None, where: str) -> None:
    """Refuse a training run that took no optimisation step (an untrained model is no result)."""
    if not steps:
        raise NonResultError(
            f"{where}: the run performed no optimisation step (every batch was skipped or there "
            "were no epochs); check --batch-size and --epochs")


def trained_embeddings(x: Any, where: str, *, allow_constant: bool = False) -> None:
    """:func:`adaptcl.evaluation.checks.check_embeddings` on the output of a *trained* model:
    NaN/inf embeddings mean training diverged (:class:`DivergedError`), no or constant ones are
    no result (:class:`NonResultError`); same messages."""
    from adaptcl.evaluation.checks import check_embeddings
    from adaptcl.plugins.validation import NonFiniteError

    try:
        check_embeddings(x, where, allow_constant=allow_constant)
    except NonFiniteError as err:
        raise DivergedError(str(err)) from None
    except ValueError as err:
        raise NonResultError(str(err)) from None
