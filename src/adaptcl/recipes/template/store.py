"""The run store: a grid of cells, each record kept with the identity it was computed with.

A recipe is a grid of *cells* ``(dataset, method, seed)``. For each cell the recipe states its
*identity* (everything that determines the result: the resolved settings, a fingerprint of the
input data, the code version) and a function computing its *record*. :func:`run_grid` reuses a
stored record only when the stored identity equals the current one; otherwise the old record is
moved aside (``runs/superseded/``, never mixed into a table) and the cell is recomputed. A record
that is not a result is refused with :class:`~adaptcl.recipes.template.errors.NonResultError`
before it is stored. A cell whose training diverged (a NaN or infinite loss, metric or
embedding: :class:`~adaptcl.recipes.template.errors.DivergedError` or the core's
:class:`~adaptcl.plugins.validation.NonFiniteError`) is recorded in :attr:`GridRun.diverged`,
nothing is stored for it, and the other cells go on.

Example:
    >>> import tempfile
    >>> out = tempfile.mkdtemp()
    >>> cells = [Cell("toy", "base", s) for s in (0, 1)]
    >>> grid = run_grid("toy", out, cells, identity=lambda c: {"lr": 0.1},
    ...                 compute=lambda c: {"metrics": {"acc": 0.5 + c.seed / 10},
    ...                                    "optimisation_steps": 3, "train_seconds": 0.0},
    ...                 progress_bar=False)
    >>> [c.seed for c in grid.computed], grid.reused
    ([0, 1], [])
    >>> run_grid("toy", out, cells, identity=lambda c: {"lr": 0.1}, compute=None,
    ...          progress_bar=False).reused == cells
    True
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from adaptcl.recipes.template.errors import DivergedError, NonResultError, check_record
from adaptcl.recipes.template.files import read_json, write_json_atomic
from adaptcl.recipes.template.progress import progress
from adaptcl.recipes.template.provenance import git_commit, stable_hash


class Cell(NamedTuple):
    """One run of a grid: ``dataset`` x ``method`` (loss, init, encoder) x ``seed``."""

    dataset: str
    method: str
    seed: int

    def label(self) -> str:
        return f"{self.dataset}/{self.method}/seed{self.seed}"




class RunStore:
    """Records of finished cells under ``<out_dir>/runs``, each with the identity it was computed with.

    ``runs/<dataset>/<method>/seed<k>.json`` holds ``{"identity", "identity_hash", "record"}``,
    written atomically. A record whose identity differs from the current one (or that cannot be
    read) is moved to ``runs/superseded/<timestamp>/...`` and reported, never reused.
    """

    def __init__(self, out_dir: str | os.PathLike) -> None:
        self.root = Path(out_dir) / "runs"
        self.superseded: list[str] = []
        self._stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")

    def path(self, cell: Cell) -> Path:
        return self.root / cell.dataset / cell.method / f"seed{cell.seed}.json"

    def load(self, cell: Cell, identity: Mapping[str, Any]) -> dict[str, Any] | None:
        """The stored record of ``cell`` if it was computed with ``identity``; else ``None``."""
        path = self.path(cell)
        if not path.is_file():
            return None
        try:
            stored = read_json(path)
            matches = stored.get("identity_hash") == stable_hash(identity)
        except (ValueError, OSError, AttributeError):
            matches, stored = False, None
        if matches and stored is not None:
            return stored["record"]
        self._set_aside(path)
        return None

    def save(self, cell: Cell, identity: Mapping[str, Any], record: Mapping[str, Any]) -> Path:
        return write_json_atomic(self.path(cell), {"identity": dict(identity),
                                                   "identity_hash": stable_hash(identity),
                                                   "record": dict(record)})

    def _set_aside(self, path: Path) -> None:
        target = self.root / "superseded" / self._stamp / path.relative_to(self.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        self.superseded.append(str(target))


def _json_number(value: float | None) -> float | str | None:
    """A loss for a JSON file: finite floats as they are, NaN/inf as ``"nan"``/``"inf"``/``"-inf"``
    (strict JSON has no NaN; the result writer refuses it), ``None`` when unknown."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else str(value)


@dataclass
class GridRun:
    """What :func:`run_grid` did: every record by cell, which were reused and which computed.

    ``diverged`` maps each cell whose training diverged to ``{"step", "loss", "message"}``: the
    optimisation step (from 1) and its loss where known (else ``None``; the loss is a float, NaN
    or inf as raised), and the error's one-line text. Those cells have no record.
    """

    cells: list[Cell]
    records: dict[Cell, dict[str, Any]] = field(default_factory=dict)
    reused: list[Cell] = field(default_factory=list)
    computed: list[Cell] = field(default_factory=list)
    superseded: list[str] = field(default_factory=list)
    seconds_this_invocation: float = 0.0
    identities: dict[Cell, Mapping[str, Any]] = field(default_factory=dict)
    diverged: dict[Cell, dict[str, Any]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return all(c in self.records for c in self.cells)

    def code_versions(self) -> list[Any]:
        """The distinct code versions (``identity["code"]``) of the cells with a record."""
        seen: dict[str, Any] = {}
        for cell in self.records:
            code = (self.identities.get(cell) or {}).get("code")
            if code is not None:
                seen.setdefault(stable_hash(code), code)
        return list(seen.values())

    def diverged_error(self) -> DivergedError | None:
        """One :class:`DivergedError` naming every diverged cell (``None`` when none diverged),
        e.g. ``2 of 8 runs diverged (NaN or inf; nothing stored for them): MUTAG/macl/seed0 at
        step 7 (loss nan), MUTAG/macl/seed1``; its ``step``/``loss`` are the first cell's."""
        if not self.diverged:
            return None
        parts = []
        for cell, info in self.diverged.items():
            text = cell.label()
            if info.get("step") is not None:
                text += f" at step {info['step']}"
            if info.get("loss") is not None:
                text += f" (loss {info['loss']:.4g})"
            parts.append(text)
        first = next(iter(self.diverged.values()))
        return DivergedError(f"{len(self.diverged)} of {len(self.cells)} runs diverged (NaN or "
                             f"inf; nothing stored for them): {', '.join(parts)}",
                             step=first.get("step"), loss=first.get("loss"))

    def bookkeeping(self) -> dict[str, Any]:
        """The part of a result file that says what this invocation did.

        ``missing``: planned cells with neither a record nor a divergence (never ran);
        ``diverged``: ``[{"cell": [dataset, method, seed], "step", "loss", "message"}]`` in grid
        order, the loss JSON-safe (a finite float, ``"nan"``, ``"inf"``, ``"-inf"`` or ``None``).
        """
        return {"complete": self.complete, "partial": not self.complete,
                "reused": [list(c) for c in self.reused],
                "computed": [list(c) for c in self.computed],
                "missing": [list(c) for c in self.cells
                            if c not in self.records and c not in self.diverged],
                "diverged": [{"cell": list(c), "step": info.get("step"),
                              "loss": _json_number(info.get("loss")),
                              "message": info.get("message")}
                             for c, info in self.diverged.items()],
                "superseded": list(self.superseded),
                "code": self.code_versions(),
                "total_train_seconds": sum(float(r.get("train_seconds") or 0.0)
                                           for r in self.records.values()),
                "seconds_this_invocation": self.seconds_this_invocation}


def _postfix(cell: Cell | None, grid: GridRun) -> str:
    """The progress bar's note: the cell at work, and how many diverged so far."""
    parts = [cell.label()] if cell is not None else []
    if grid.diverged:
        parts.append(f"{len(grid.diverged)} diverged")
    return ", ".join(parts)


def run_grid(recipe: str, out_dir: str | os.PathLike, cells: Sequence[Cell], *,
             identity: Callable[[Cell], Mapping[str, Any]],
             compute: Callable[[Cell], dict[str, Any] | None] | None,
             trains: Callable[[Cell], bool] | bool = True,
             on_record: Callable[[GridRun], None] | None = None,
             progress_bar: bool = True) -> GridRun:
    """Compute every cell whose stored record is missing or stale; reuse the others.

    ``identity(cell)`` returns everything that determines the cell's result (JSON-able);
    ``compute(cell)`` returns its record (``metrics``, ``optimisation_steps``, ``train_seconds``
    and anything else), or ``None`` on a process that does not own the result (a non-zero
    rank of a distributed run); ``compute=None`` only collects what is stored. Each record is checked
    with :func:`check_record` before it is stored. A cell whose ``compute`` raises
    :class:`~adaptcl.recipes.template.errors.DivergedError` or
    :class:`~adaptcl.plugins.validation.NonFiniteError`, or whose record ``check_record`` refuses
    as non-finite, goes to :attr:`GridRun.diverged` (nothing stored) and the grid goes on; any
    other :class:`~adaptcl.recipes.template.errors.NonResultError` (no optimisation step, no
    metrics) stops the run. ``on_record`` is called after each cell computed or diverged while
    there is at least one record (to rewrite partial result files).
    """
    git_commit()  # the commit the runs start from (cached for the result's environment)
    store = RunStore(out_dir)
    grid = GridRun(cells=list(cells))
    start = time.perf_counter()
    todo: list[Cell] = []
    for cell in grid.cells:
        grid.identities[cell] = identity(cell)
        record = store.load(cell, grid.identities[cell])
        if record is not None:
            grid.records[cell] = record
            grid.reused.append(cell)
        else:
            todo.append(cell)
    grid.superseded = store.superseded
    if compute is not None and todo:
        from adaptcl.plugins.validation import NonFiniteError  # torch: only when computing

        bar = progress(total=len(grid.cells), initial=len(grid.reused), desc=f"{recipe} runs",
                       enabled=progress_bar, leave=True)
        try:
            for cell in todo:
                bar.set_postfix_str(_postfix(cell, grid))
                training = trains(cell) if callable(trains) else trains
                try:
                    record = compute(cell)
                    if record is None:  # computed and stored by another process (rank 0 of DDP)
                        bar.update(1)
                        continue
                    check_record(cell, record, trains=training)
                except (DivergedError, NonFiniteError) as err:
                    if not training:  # NaN from a frozen encoder is a broken input, not divergence
                        raise err if isinstance(err, NonResultError) else NonResultError(
                            f"{cell.label()}: {err}") from err
                    grid.diverged[cell] = {"step": err.step, "loss": err.loss,
                                           "message": str(err).splitlines()[0] if str(err)
                                           else type(err).__name__}
                else:
                    store.save(cell, grid.identities[cell], record)
                    grid.records[cell] = record
                    grid.computed.append(cell)
                grid.seconds_this_invocation = time.perf_counter() - start
                if on_record is not None and grid.records:
                    on_record(grid)
                bar.update(1)
            bar.set_postfix_str(_postfix(None, grid))
        finally:
            bar.close()
    grid.records = {c: grid.records[c] for c in grid.cells if c in grid.records}  # grid order
    grid.seconds_this_invocation = time.perf_counter() - start
    return grid
