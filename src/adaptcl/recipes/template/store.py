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

Several processes may share one output folder (local disk; locks are ``flock`` locks through
:mod:`filelock`, which network file systems may not honour). A cell is computed and saved under
its own lock (``runs/.locks/<dataset>/<method>/seed<k>.lock``), so two processes never compute
the same cell at once: the second waits, then reuses the record the first stored. Different
cells run in parallel. Each process also registers the identity of every cell of its grid in
``runs/.active/`` (:class:`ActiveRuns`); a process whose grid shares a cell with a live run of
*other* settings is refused before it computes or supersedes anything.

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

import contextlib
import datetime as _dt
import math
import os
import re
import secrets
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from adaptcl.recipes.template.errors import (
    DivergedError,
    NonResultError,
    RecipeError,
    check_record,
    check_seed,
)
from adaptcl.recipes.template.files import first_line, note_corrupt, read_json, write_json_atomic
from adaptcl.recipes.template.options import note
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
        """The stored record of ``cell`` if it was computed with ``identity``; else ``None``.

        A record of another identity is moved to ``runs/superseded/``; one that cannot be read
        (truncated, not JSON, not a run record) too, and it is named on stderr in one line.
        """
        path = self.path(cell)
        if not path.is_file():
            return None
        try:
            stored = read_json(path)
            if not (isinstance(stored, dict) and isinstance(stored.get("record"), dict)
                    and isinstance(stored.get("identity_hash"), str)):
                raise ValueError("not a run record")
        except FileNotFoundError:  # another process set it aside meanwhile
            return None
        except (ValueError, OSError) as err:
            target = self._set_aside(path)
            if target is not None:
                note_corrupt("run record", path, err, f"moved to {target} and recomputed")
            return None
        if stored["identity_hash"] == stable_hash(identity):
            return stored["record"]
        self._set_aside(path)
        return None

    def lock_path(self, cell: Cell) -> Path:
        return self.root / LOCKS_DIR / cell.dataset / cell.method / f"seed{cell.seed}.lock"

    @contextlib.contextmanager
    def cell_lock(self, cell: Cell, *, waiting: Callable[[], None] | None = None
                  ) -> Iterator[None]:
        """Hold ``cell``'s lock (across processes) for the block; ``waiting()`` is called once
        if another process holds it, before waiting for it. Lock files are left in place
        (removing a lock file another process may be opening would let two hold it)."""
        from filelock import FileLock, Timeout

        path = self.lock_path(cell)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            if waiting is not None:
                waiting()
            lock.acquire()
        try:
            yield
        finally:
            lock.release()

    def save(self, cell: Cell, identity: Mapping[str, Any], record: Mapping[str, Any]) -> Path:
        """Store ``record``; a record already there (a forced recompute) is moved aside first,
        so no record is ever overwritten."""
        if self.path(cell).exists():
            self._set_aside(self.path(cell))
        return write_json_atomic(self.path(cell), {"identity": dict(identity),
                                                   "identity_hash": stable_hash(identity),
                                                   "record": dict(record)})

    def _set_aside(self, path: Path) -> Path | None:
        """Move ``path`` under ``runs/superseded/<time>/``; ``None`` if it is gone already."""
        target = self.root / "superseded" / self._stamp / path.relative_to(self.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(path, target)
        except FileNotFoundError:  # another process (same settings) set it aside first
            return None
        self.superseded.append(str(target))
        return target


LOCKS_DIR = ".locks"
ACTIVE_DIR = ".active"


def distributed_follower() -> bool:
    """Whether this process is a non-zero rank of a distributed launch (``RANK``,
    ``LOCAL_RANK`` or ``NODE_RANK`` set and not 0, as torchrun and Lightning's launcher set
    them). Such a rank computes each cell together with rank 0 but owns no result: it takes no
    lock and registers nothing (rank 0 does both for the whole group)."""
    for name in ("RANK", "LOCAL_RANK", "NODE_RANK"):
        try:
            if int(os.environ.get(name, "0") or "0") != 0:
                return True
        except ValueError:
            continue
    return False


class ActiveRuns:
    """The live runs of one store: ``runs/.active/<host>-<pid>-<token>.json``.

    An entry holds the process (``pid``, ``host``, ``recipe``, ``argv``, ``started``) and the
    identity hash of every cell of its grid (``cells``: label -> hash). Its process holds the
    entry's ``.lock`` for as long as the grid runs, so an entry whose lock can be taken belongs
    to a process that died (killed, power cut): it is stale and removed. Entries are read and
    written under ``runs/.active/.registry.lock``, so of two runs that start together with
    conflicting settings the second is refused.
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.dir = Path(root) / ACTIVE_DIR
        self.entry: Path | None = None
        self._hold: Any = None

    @contextlib.contextmanager
    def _registry(self) -> Iterator[None]:
        from filelock import FileLock

        self.dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.dir / ".registry.lock")):
            yield

    def _live(self) -> list[dict[str, Any]]:
        """Every live entry but this process's own (stale ones removed); under the registry lock."""
        from filelock import FileLock, Timeout

        entries = []
        for path in sorted(self.dir.glob("*.json")):
            if path == self.entry:
                continue
            lock = FileLock(str(path.with_suffix(".lock")))
            try:
                lock.acquire(timeout=0)
            except Timeout:  # its process is alive and holds it
                with contextlib.suppress(OSError, ValueError):
                    entries.append(read_json(path) | {"entry": str(path)})
                continue
            lock.release()  # nobody held it: the process is gone
            path.unlink(missing_ok=True)
            path.with_suffix(".lock").unlink(missing_ok=True)
        return entries

    def register(self, recipe: str, cells: Mapping[str, str]) -> None:
        """Record this process's grid (cell label -> identity hash), or raise :class:`RecipeError`
        naming the first cell a live run computes with other settings."""
        from filelock import FileLock

        with self._registry():
            for entry in self._live():
                theirs = entry.get("cells") or {}
                for label, identity_hash in cells.items():
                    if label in theirs and theirs[label] != identity_hash:
                        raise RecipeError(
                            f"{label} in {self.dir.parent.parent} is being computed with other "
                            f"settings by another run ({_describe(entry)}); use another "
                            "--output-dir or wait for it")
            host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"
            name = f"{host}-{os.getpid()}-{secrets.token_hex(3)}"
            self._hold = FileLock(str(self.dir / f"{name}.lock"))
            self._hold.acquire(timeout=0)
            self.entry = write_json_atomic(self.dir / f"{name}.json", {
                "pid": os.getpid(), "host": socket.gethostname(), "recipe": recipe,
                "argv": " ".join(sys.argv)[:500],
                "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "cells": dict(cells)})

    def owner(self, label: str) -> dict[str, Any] | None:
        """The live run (not this one) whose grid holds the cell ``label``, if any."""
        with self._registry():
            return next((e for e in self._live() if label in (e.get("cells") or {})), None)

    def unregister(self) -> None:
        if self.entry is None:
            return
        with self._registry():
            self.entry.unlink(missing_ok=True)
            lock_file = Path(self._hold.lock_file)
            self._hold.release()
            lock_file.unlink(missing_ok=True)
        self.entry = self._hold = None


def _describe(entry: Mapping[str, Any]) -> str:
    return (f"adaptcl {entry.get('recipe')}, process {entry.get('pid')} on {entry.get('host')}, "
            f"started {entry.get('started')}")


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
    #: cells whose job failed (``--jobs``/``--cluster``): ``{"error", "log", "job_id"}``
    failed: dict[Cell, dict[str, Any]] = field(default_factory=dict)

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

    def failed_error(self) -> Exception | None:
        """One :class:`~adaptcl.recipes.template.jobs.CellsFailedError` naming every cell whose
        job failed (``None`` when none did), diverged cells appended."""
        if not self.failed:
            return None
        from adaptcl.recipes.template.jobs import CellsFailedError

        names = ", ".join(f"{c.label()} ({info['error']})" for c, info in self.failed.items())
        diverged = self.diverged_error()
        return CellsFailedError(
            f"{len(self.failed)} of {len(self.cells)} runs failed: {names}; their logs are named "
            "above; rerun the same command to retry them (finished runs are reused)"
            + (f". Also: {diverged}" if diverged is not None else ""))

    def bookkeeping(self) -> dict[str, Any]:
        """The part of a result file that says what this invocation did.

        ``missing``: planned cells with neither a record nor a divergence (never ran, or failed);
        ``failed``: ``[{"cell", "error", "log", "job_id"}]``, cells whose job raised;
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
                "failed": [{"cell": list(c)} | dict(info) for c, info in self.failed.items()],
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
             progress_bar: bool = True, reuse: bool = True,
             jobs: Any = None) -> GridRun:
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

    A cell listed twice is run once (with a note); a seed outside ``[0, 2**32 - 1]`` is refused
    (:class:`~adaptcl.recipes.template.errors.RecipeError`) before anything is computed.

    ``reuse=False`` recomputes every cell even when a matching record is stored (``--no-cache``);
    the old record stays in place until the new one is stored, then moves to
    ``runs/superseded/`` (listed in :attr:`GridRun.superseded`); a cell that diverges keeps it.

    ``jobs`` (a :class:`~adaptcl.recipes.template.jobs.JobRunner`): each cell to compute runs
    as a submitit job instead of ``compute`` here; a job that fails goes to
    :attr:`GridRun.failed` and the other cells go on. The grid's records and lists (computed,
    reused, diverged, failed) are in the order of ``cells``, whatever order the jobs finished in.
    """
    unique = list(dict.fromkeys(cells))  # a cell listed twice is computed once
    if len(unique) < len(cells):
        repeated = [c.label() for c in unique if list(cells).count(c) > 1]
        note(f"{len(repeated)} runs are listed more than once ({', '.join(repeated[:3])}"
             f"{', ...' if len(repeated) > 3 else ''}); running each once")
    cells = unique
    for cell in cells:  # before anything is computed
        check_seed(cell.seed, cell.label())
    git_commit()  # the commit the runs start from (cached for the result's environment)
    store = RunStore(out_dir)
    grid = GridRun(cells=cells)
    start = time.perf_counter()
    for cell in grid.cells:
        grid.identities[cell] = identity(cell)
    follower = distributed_follower()
    active = None if follower else ActiveRuns(store.root)
    if active is not None:  # before anything is superseded or computed
        active.register(recipe, {c.label(): stable_hash(grid.identities[c]) for c in grid.cells})
    try:
        _collect_and_compute(recipe, store, grid, compute=compute, trains=trains,
                             on_record=on_record, progress_bar=progress_bar, start=start,
                             active=active, reuse=reuse, jobs=jobs)
    finally:
        if active is not None:
            active.unregister()
    # grid order, not the order jobs happened to finish in (results.json is the same either way)
    order = {c: i for i, c in enumerate(grid.cells)}
    grid.records = {c: grid.records[c] for c in grid.cells if c in grid.records}
    grid.computed.sort(key=order.__getitem__)
    grid.reused.sort(key=order.__getitem__)
    grid.diverged = {c: grid.diverged[c] for c in grid.cells if c in grid.diverged}
    grid.failed = {c: grid.failed[c] for c in grid.cells if c in grid.failed}
    grid.seconds_this_invocation = time.perf_counter() - start
    return grid


def _collect_and_compute(recipe: str, store: RunStore, grid: GridRun, *,
                         compute: Callable[[Cell], dict[str, Any] | None] | None,
                         trains: Callable[[Cell], bool] | bool,
                         on_record: Callable[[GridRun], None] | None, progress_bar: bool,
                         start: float, active: ActiveRuns | None, reuse: bool,
                         jobs: Any = None) -> None:
    todo: list[Cell] = []
    for cell in grid.cells:
        record = store.load(cell, grid.identities[cell]) if reuse else None
        if record is not None:
            grid.records[cell] = record
            grid.reused.append(cell)
        else:
            todo.append(cell)
    grid.superseded = store.superseded
    if (compute is None and jobs is None) or not todo:
        return
    if jobs is not None:  # each cell a job of its own (submitit); this process collects
        from adaptcl.recipes.template.jobs import run_jobs

        run_jobs(recipe, store, grid, todo, jobs, on_record=on_record,
                 progress_bar=progress_bar, start=start)
        return
    bar = progress(total=len(grid.cells), initial=len(grid.reused), desc=f"{recipe} runs",
                   enabled=progress_bar, leave=True)
    try:
        for cell in todo:
            bar.set_postfix_str(_postfix(cell, grid))
            status = compute_one(store, grid, cell, compute, trains, reuse=reuse,
                                 active=active, locked=active is not None)
            grid.seconds_this_invocation = time.perf_counter() - start
            if status in ("computed", "diverged") and on_record is not None and grid.records:
                on_record(grid)
            bar.update(1)
        bar.set_postfix_str(_postfix(None, grid))
    finally:
        bar.close()


def compute_one(store: RunStore, grid: GridRun, cell: Cell,
                compute: Callable[[Cell], dict[str, Any] | None],
                trains: Callable[[Cell], bool] | bool, *, reuse: bool = True,
                active: ActiveRuns | None = None, locked: bool = True) -> str:
    """Compute and store one cell under its lock (``locked``), or reuse the record another
    process stored meanwhile (``reuse``); what happened: ``"computed"``, ``"reused"``,
    ``"diverged"`` or ``"none"`` (this process owns no result). Used by the sequential grid
    and by each job of :mod:`~adaptcl.recipes.template.jobs`."""
    lock = (store.cell_lock(cell, waiting=lambda: _waiting_note(active, cell)) if locked
            else contextlib.nullcontext())
    with lock:
        if reuse and locked:  # another process may have stored it meanwhile
            record = store.load(cell, grid.identities[cell])
            if record is not None:
                grid.records[cell] = record
                grid.reused.append(cell)
                return "reused"
        if not _compute_cell(store, grid, cell, compute, trains):
            return "none"
    return "diverged" if cell in grid.diverged else "computed"


def _compute_cell(store: RunStore, grid: GridRun, cell: Cell,
                  compute: Callable[[Cell], dict[str, Any] | None],
                  trains: Callable[[Cell], bool] | bool) -> bool:
    """Compute, check and store one cell; a divergence goes to ``grid.diverged``. ``False``
    when this process owns no result (``compute`` returned ``None``)."""
    training = trains(cell) if callable(trains) else trains
    try:
        record = compute(cell)
        if record is None:  # computed and stored by another process (rank 0 of DDP)
            return False
        check_record(cell, record, trains=training)
    except _diverged_errors() as err:
        if not training:  # NaN from a frozen encoder is a broken input, not a divergence
            raise err if isinstance(err, NonResultError) else NonResultError(
                f"{cell.label()}: {err}") from err
        grid.diverged[cell] = {"step": err.step, "loss": err.loss,
                               "message": first_line(err) or type(err).__name__}
        return True
    store.save(cell, grid.identities[cell], record)
    grid.records[cell] = record
    grid.computed.append(cell)
    return True


def _diverged_errors() -> tuple[type[Exception], ...]:
    """:class:`DivergedError`, and the core's ``NonFiniteError`` if the core is loaded (importing
    it here would import torch for every reader of the store; unloaded, nothing raised it)."""
    validation = sys.modules.get("adaptcl.plugins.validation")
    return (DivergedError,) + ((validation.NonFiniteError,) if validation is not None else ())


def _waiting_note(active: ActiveRuns | None, cell: Cell) -> None:
    owner = active.owner(cell.label()) if active is not None else None
    who = f" ({_describe(owner)})" if owner else ""
    note(f"{cell.label()} is being computed by another run with the same settings{who}; "
         "waiting for it, then reusing its record")
