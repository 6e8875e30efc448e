"""The run store: each cell's record kept with the identity it was computed with.

A cell's *identity* is everything that determines its result (settings, data fingerprint, code
version). A stored record is reused only under the same identity; otherwise it is moved aside
(``runs/superseded/``) and the cell recomputed. A record that is no result is refused before it
is stored; a cell whose training diverged is recorded in :attr:`GridRun.diverged`, nothing is
stored for it, and the other cells go on.

Several processes may share one output folder (local disk: ``flock`` locks through
:mod:`filelock`, which network file systems may not honour). A cell is computed under its own
lock, so a second process waits, then reuses the record; each process registers its grid's
identities in ``runs/.active/``
(:class:`~adaptcl.recipes.engine.active_runs.ActiveRuns`), and one whose grid shares a cell with a
live run of *other* settings is refused before it computes or supersedes anything.

Example:
    >>> import tempfile
    >>> store = RunStore(tempfile.mkdtemp())
    >>> cell = Cell((("dataset", "toy"), ("loss", "base")), seed=0)
    >>> grid = GridRun(cells=[cell], identities={cell: {"lr": 0.1}})
    >>> compute_one(store, grid, cell, lambda c: {"metrics": {"acc": 0.5},
    ...             "optimisation_steps": 3, "train_seconds": 0.0}, trains=True)
    'computed'
    >>> store.load(cell, {"lr": 0.1})["metrics"], store.load(cell, {"lr": 0.2})
    ({'acc': 0.5}, None)
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptcl.recipes.engine.active_runs import ActiveRuns, describe_run
from adaptcl.recipes.engine.cells import Cell, RunLayout
from adaptcl.recipes.engine.errors import (
    CellsFailedError,
    DivergedError,
    NonResultError,
    check_record,
    distributed_follower,
    first_line,
    note,
    plural,
)
from adaptcl.recipes.engine.files import note_corrupt, read_json, write_json_atomic
from adaptcl.recipes.engine.provenance import stable_hash


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


class RunStore:
    """Records under ``<out_dir>/runs``: ``runs/<cell>.json`` holds ``{"identity",
    "identity_hash", "record"}``, written atomically; one of another identity, or unreadable,
    is moved to ``runs/superseded/<time>/`` and never reused."""

    def __init__(self, out_dir: str | os.PathLike) -> None:
        self.layout = RunLayout(out_dir)
        self.superseded: list[str] = []
        #: how many records of another identity (settings, data or code) were set aside
        self.stale = 0
        self._stamp = _now().strftime("%Y%m%dT%H%M%S")
        self._read: dict[Path, dict[str, Any] | None] = {}  # other cells' records, by path

    def path(self, cell: Cell) -> Path:
        return self.layout.record(cell)

    def load(self, cell: Cell, identity: Mapping[str, Any]) -> dict[str, Any] | None:
        """The stored record of ``cell`` if computed with ``identity``, else ``None`` (an
        unreadable one is also named on stderr).

        Where ``cell``'s own file holds none, a record of the same run stored for the cell in
        another layout of the grid is found by its identity: a setting given one value there
        and swept here, or the reverse (``runs/MUTAG/macl/seed0.json`` of ``--temperature
        0.2`` is the cell ``MUTAG/macl/temperature=0.2/seed0`` of ``--temperature 0.2 0.3``).
        It is stored at ``cell``'s path too, marked ``same_as`` (its label there)."""
        wanted = stable_hash(identity)
        record = self._load_own(cell, wanted)
        if record is None:
            record = self._same_run(cell, wanted)
            if record is not None and not distributed_follower():  # rank 0 stores
                self.save(cell, identity, record)
        return record

    def _load_own(self, cell: Cell, wanted: str) -> dict[str, Any] | None:
        """The record at ``cell``'s own path if its identity hash is ``wanted``; one of another
        identity, or unreadable, is set aside."""
        path = self.path(cell)
        if not path.is_file():
            return None
        try:
            stored = _read_record(path)
        except FileNotFoundError:  # another process set it aside meanwhile
            return None
        except (ValueError, OSError) as err:
            target = self._set_aside(path)
            if target is not None:
                note_corrupt("run record", path, err, f"moved to {target} and recomputed")
            return None
        if stored["identity_hash"] == wanted:
            return stored["record"]
        self.stale += self._set_aside(path) is not None
        return None

    def _same_run(self, cell: Cell, wanted: str) -> dict[str, Any] | None:
        """A record of identity hash ``wanted`` stored for ``cell``'s axes and seed under other
        swept settings' folders (``<row>/<column>/[<setting>=<value>/...]seed<k>.json``), with
        ``same_as``; each file is read once per store."""
        *_, last = cell.parts()
        folder = self.layout.runs.joinpath(*cell.parts()[:len(cell.axes)])
        own = self.path(cell)
        for path in sorted(folder.rglob(f"{last}.json")) if folder.is_dir() else ():
            between = path.relative_to(folder).parts[:-1]
            if path == own or not all("=" in part for part in between):
                continue
            if path not in self._read:
                try:
                    self._read[path] = _read_record(path)
                except (ValueError, OSError):  # its own cell's to set aside, not this one's
                    self._read[path] = None
            stored = self._read[path]
            if stored is not None and stored["identity_hash"] == wanted:
                label = path.relative_to(self.layout.runs).with_suffix("").as_posix()
                return {**stored["record"], "same_as": stored["record"].get("same_as", label)}
        return None

    @contextlib.contextmanager
    def cell_lock(self, cell: Cell, *, waiting: Callable[[], None]) -> Iterator[None]:
        """Hold ``cell``'s lock across processes; ``waiting()`` first if another holds it. Lock
        files stay (removing one another process may be opening would let two hold it)."""
        from filelock import FileLock, Timeout

        path = self.layout.lock(cell)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            waiting()
            lock.acquire()
        try:
            yield
        finally:
            lock.release()

    def save(self, cell: Cell, identity: Mapping[str, Any], record: Mapping[str, Any]) -> Path:
        """Store ``record``, moving aside one already there (never overwritten)."""
        if self.path(cell).exists():
            self._set_aside(self.path(cell))
        return write_json_atomic(self.path(cell), {"identity": dict(identity),
                                                   "identity_hash": stable_hash(identity),
                                                   "record": dict(record)})

    def _set_aside(self, path: Path) -> Path | None:
        """Move ``path`` under ``runs/superseded/<time>/``; ``None`` if it is gone already."""
        target = self.layout.superseded(self._stamp) / path.relative_to(self.layout.runs)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(path, target)
        except FileNotFoundError:  # another process (same settings) set it aside first
            return None
        self.superseded.append(str(target))
        return target


def _read_record(path: Path) -> dict[str, Any]:
    """A stored run record (``{"identity", "identity_hash", "record"}``), or ``ValueError``."""
    stored = read_json(path)
    if not (isinstance(stored, dict) and isinstance(stored.get("record"), dict)
            and isinstance(stored.get("identity_hash"), str)):
        raise ValueError("not a run record")
    return stored


@dataclass
class GridRun:
    """What a grid's run did: every record by cell, which were reused and which computed.

    ``diverged``: ``{cell: {"step", "loss", "message"}}`` (step from 1 and loss where known,
    else ``None``); ``failed``: ``{cell: {"error", "log", "job_id"}}`` of cells whose job
    failed (``--jobs``). Neither has a record.
    """

    cells: list[Cell]
    records: dict[Cell, dict[str, Any]] = field(default_factory=dict)
    reused: list[Cell] = field(default_factory=list)
    computed: list[Cell] = field(default_factory=list)
    superseded: list[str] = field(default_factory=list)
    seconds_this_invocation: float = 0.0
    identities: dict[Cell, Mapping[str, Any]] = field(default_factory=dict)
    diverged: dict[Cell, dict[str, Any]] = field(default_factory=dict)
    failed: dict[Cell, dict[str, Any]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return all(c in self.records for c in self.cells)

    def reuse(self, cell: Cell, record: dict[str, Any]) -> None:
        self.records[cell] = record
        self.reused.append(cell)

    def in_grid_order(self) -> None:
        """Records and lists in the order of :attr:`cells`, whatever order jobs finished in."""
        order = {c: i for i, c in enumerate(self.cells)}
        self.computed.sort(key=order.__getitem__)
        self.reused.sort(key=order.__getitem__)
        for name in ("records", "diverged", "failed"):
            held = getattr(self, name)
            setattr(self, name, {c: held[c] for c in self.cells if c in held})

    def progress_note(self, *head: str) -> str:
        """The progress bar's note: ``head``, then how many failed and diverged so far."""
        counts = [f"{len(self.failed)} failed"] * bool(self.failed) + [
            f"{len(self.diverged)} diverged"] * bool(self.diverged)
        return ", ".join([*head, *counts])

    def diverged_error(self) -> DivergedError | None:
        """One :class:`DivergedError` naming every diverged cell (``None`` when none did), e.g.
        ``2 of 8 runs diverged (...): MUTAG/macl/seed0 at step 7 (loss nan), MUTAG/macl/seed1``;
        its ``step`` and ``loss`` are the first cell's."""
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
        return DivergedError(f"{len(self.diverged)} of {plural(len(self.cells))} diverged (NaN or "
                             f"inf; nothing stored for them): {', '.join(parts)}",
                             step=first.get("step"), loss=first.get("loss"))

    def failed_error(self) -> CellsFailedError | None:
        """One error naming every cell whose job failed (``None`` when none did), then the
        diverged ones."""
        if not self.failed:
            return None
        names = ", ".join(f"{c.label()} ({info['error']})" for c, info in self.failed.items())
        diverged = self.diverged_error()
        return CellsFailedError(
            f"{len(self.failed)} of {plural(len(self.cells))} failed: {names}; their logs are "
            "named above; rerun the same command to retry them (finished runs are reused)"
            + (f". Also: {diverged}" if diverged is not None else ""))

    def bookkeeping(self) -> dict[str, Any]:
        """What this invocation did, for the result file (cells as :meth:`Cell.as_dict`):
        ``missing`` (planned, neither record nor divergence), ``failed``, ``diverged`` (the loss
        JSON-safe: a finite float, ``"nan"``, ``"inf"``, ``"-inf"`` or ``None``), ..."""
        def json_number(value: float | None) -> float | str | None:
            return None if value is None else (float(value) if math.isfinite(float(value))
                                               else str(float(value)))

        codes: dict[str, Any] = {}  # the distinct code versions of the records
        for cell in self.records:
            if (code := (self.identities.get(cell) or {}).get("code")) is not None:
                codes.setdefault(stable_hash(code), code)
        return {"complete": self.complete, "partial": not self.complete,
                "reused": [c.as_dict() for c in self.reused],
                "computed": [c.as_dict() for c in self.computed],
                "missing": [c.as_dict() for c in self.cells
                            if c not in self.records and c not in self.diverged],
                "diverged": [{"cell": c.as_dict(), "step": info.get("step"),
                              "loss": json_number(info.get("loss")),
                              "message": info.get("message")}
                             for c, info in self.diverged.items()],
                "failed": [{"cell": c.as_dict(), "label": c.label()} | dict(info)
                           for c, info in self.failed.items()],
                "superseded": list(self.superseded),
                "code": list(codes.values()),
                "total_train_seconds": sum(float(r.get("train_seconds") or 0.0)
                                           for r in self.records.values()),
                "seconds_this_invocation": self.seconds_this_invocation}


def collect(store: RunStore, grid: GridRun, *, reuse: bool = True) -> list[Cell]:
    """Take every cell of ``grid`` whose record of the same identity is stored into
    ``grid.records``; return the others, to compute (``reuse=False``: every cell; the stored
    records are set aside only when their cell is stored anew)."""
    todo = []
    for cell in grid.cells:
        record = store.load(cell, grid.identities[cell]) if reuse else None
        if record is not None:
            grid.reuse(cell, record)
        else:
            todo.append(cell)
    grid.superseded = store.superseded
    return todo


def compute_one(store: RunStore, grid: GridRun, cell: Cell,
                compute: Callable[[Cell], dict[str, Any] | None],
                trains: Callable[[Cell], bool] | bool, *, reuse: bool = True,
                active: ActiveRuns | None = None, locked: bool = True) -> str:
    """Compute, check and store one cell under its lock (``locked``), or reuse the record
    another process stored meanwhile (``reuse``): ``"computed"``, ``"reused"``,
    ``"diverged"`` or ``"none"`` (this process owns no result: ``compute`` returned None)."""
    training = trains(cell) if callable(trains) else trains
    lock = (store.cell_lock(cell, waiting=lambda: _waiting_note(active, cell)) if locked
            else contextlib.nullcontext())
    with lock:
        if reuse and locked and (record := store.load(cell, grid.identities[cell])) is not None:
            grid.reuse(cell, record)  # another process stored it meanwhile
            return "reused"
        try:
            record = compute(cell)
            if record is None:  # computed and stored by another process (rank 0 of DDP)
                return "none"
            check_record(cell.label(), record, trains=training)
        except _diverged_errors() as err:  # evaluated after compute, which may load the core
            if not training:  # NaN from a frozen encoder is a broken input, not a divergence
                raise err if isinstance(err, NonResultError) else NonResultError(
                    f"{cell.label()}: {err}") from err
            grid.diverged[cell] = {"step": err.step, "loss": err.loss,
                                   "message": first_line(err) or type(err).__name__}
            return "diverged"
        store.save(cell, grid.identities[cell], record)
    grid.records[cell] = record
    grid.computed.append(cell)
    return "computed"


def _diverged_errors() -> tuple[type[Exception], ...]:
    """:class:`DivergedError`, and the core's ``NonFiniteError`` if the core is loaded (importing
    it here would import torch for every reader of the store; unloaded, nothing raised it)."""
    validation = sys.modules.get("adaptcl.plugins.validation")
    return (DivergedError,) + ((validation.NonFiniteError,) if validation is not None else ())


def _waiting_note(active: ActiveRuns | None, cell: Cell) -> None:
    owner = active.owner(cell.label()) if active is not None else None
    who = f" ({describe_run(owner)})" if owner else ""
    note(f"{cell.label()} is being computed by another run with the same settings{who}; "
         "waiting for it, then reusing its record")
