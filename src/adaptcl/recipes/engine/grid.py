"""Running a grid: every cell whose stored record is missing or stale is computed, here one
after another or as jobs (:mod:`~adaptcl.recipes.engine.jobs`); the others are reused."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from adaptcl.recipes.engine.active_runs import ActiveRuns
from adaptcl.recipes.engine.cells import Cell
from adaptcl.recipes.engine.errors import check_seed, distributed_follower, note, plural
from adaptcl.recipes.engine.jobs import JobRunner, run_jobs
from adaptcl.recipes.engine.progress import progress
from adaptcl.recipes.engine.provenance import git_commit, stable_hash
from adaptcl.recipes.engine.store import (
    GridRun,
    RunStore,
    collect,
    compute_one,
)


def run_grid(recipe: str, out_dir: str | os.PathLike, cells: Sequence[Cell], *,
             identity: Callable[[Cell], Mapping[str, Any]],
             compute: Callable[[Cell], dict[str, Any] | None] | None,
             trains: Callable[[Cell], bool] | bool = True,
             on_record: Callable[[GridRun], None] | None = None,
             progress_bar: bool = True, reuse: bool = True,
             jobs: JobRunner | None = None,
             explained: Callable[[Cell, Cell], bool] | None = None) -> GridRun:
    """Compute every cell whose stored record is missing or stale; reuse the others.

    ``identity(cell)``: everything that determines the cell's result (JSON-able);
    ``compute(cell)``: its record (``metrics``, ``optimisation_steps``, ``train_seconds``, ...),
    or ``None`` on a process that owns no result (a non-zero rank); ``compute=None`` only
    collects. A diverged cell goes to :attr:`GridRun.diverged` and the grid goes on; any other
    :class:`~adaptcl.recipes.engine.errors.NonResultError` stops it. ``on_record(grid)`` after
    each cell computed or diverged, while there is a record (to rewrite partial result files).
    A cell listed twice runs once (with a note); a bad seed is refused before any work. Cells
    of the same axes and seed whose identities are equal (points that differ only in settings
    their loss ignores, or in values that resolve to the same run) are computed once: the
    first, its record (with ``same_as``, the first's label) stored for the others too; a note
    names those that ``explained(cell, first)`` (already said) does not.
    ``reuse=False`` recomputes every cell (the old record moves aside once the new one is
    stored). ``jobs``: the cells to compute are dealt to submitit jobs, each computing its
    share one after another (a failed cell goes to :attr:`GridRun.failed`). Records and
    lists are in the order of ``cells``.
    """
    unique = _unique(cells)
    git_commit()  # the commit the runs start from (cached for the result's environment)
    store = RunStore(out_dir)
    grid = GridRun(cells=unique, identities={cell: identity(cell) for cell in unique})
    same = same_runs(grid)
    _note_same(same, explained)
    start = time.perf_counter()
    active = None if distributed_follower() else ActiveRuns(store.layout)
    if active is not None:  # before anything is superseded or computed
        active.register(recipe, {c.label(): stable_hash(grid.identities[c]) for c in grid.cells})
    try:
        todo, copies = _split(store, grid, collect(store, grid, reuse=reuse), same,
                              write=jobs is not None or compute is not None)
        _note_todo(store, todo, jobs)
        if todo and (jobs is not None or compute is not None):
            bar = progress(total=len(grid.cells), initial=len(grid.reused),
                           desc=f"{recipe} runs", enabled=progress_bar, leave=True)
            try:
                if jobs is not None:
                    run_jobs(store, grid, todo, jobs, bar, on_record=on_record, start=start)
                    _share_copies(store, grid, same, copies)
                    bar.update(len(copies))
                else:
                    _run_here(store, grid, todo, compute, trains, bar, on_record=on_record,
                              start=start, active=active, reuse=reuse,
                              copies=_copies_of(same, copies))
            finally:
                bar.close()
    finally:
        if active is not None:
            active.unregister()
    grid.in_grid_order()
    grid.seconds_this_invocation = time.perf_counter() - start
    return grid


def _unique(cells: Sequence[Cell]) -> list[Cell]:
    """``cells`` without repeats (noted once), each seed checked before any work."""
    unique = list(dict.fromkeys(cells))
    if len(unique) < len(cells):
        repeated = [c.label() for c in unique if list(cells).count(c) > 1]
        note(f"{plural(len(repeated))} listed more than once ({', '.join(repeated[:3])}"
             f"{', ...' if len(repeated) > 3 else ''}); running each once")
    for cell in unique:
        check_seed(cell.seed, cell.label())
    return unique


def _note_todo(store: RunStore, todo: Sequence[Cell], jobs: JobRunner | None) -> None:
    """The notes before computing: records of another identity, and the jobs to come."""
    if store.stale:
        note(f"{plural(store.stale)} stored with another identity (settings, data or "
             f"code) will be computed again; the old records are kept under "
             f"{store.layout.runs / 'superseded'}")
    if todo and jobs is not None:
        note(f"{plural(len(todo))} to compute as {jobs.describe(len(todo))}")


def _run_here(store: RunStore, grid: GridRun, todo: Sequence[Cell],
              compute: Callable[[Cell], dict[str, Any] | None],
              trains: Callable[[Cell], bool] | bool, bar: Any, *,
              on_record: Callable[[GridRun], None] | None, start: float,
              active: ActiveRuns | None, reuse: bool,
              copies: Mapping[Cell, list[Cell]]) -> None:
    """The cells of ``todo`` one after another in this process, each under its lock (and its
    record stored for its ``copies`` once it is there)."""
    for cell in todo:
        bar.set_postfix_str(grid.progress_note(cell.label()))
        status = compute_one(store, grid, cell, compute, trains, reuse=reuse, active=active,
                             locked=active is not None)
        share(store, grid, cell, copies.get(cell, []))
        grid.seconds_this_invocation = time.perf_counter() - start
        if status in ("computed", "diverged") and on_record is not None and grid.records:
            on_record(grid)
        bar.update(1 + len(copies.get(cell, [])))
    bar.set_postfix_str(grid.progress_note())


def same_runs(grid: GridRun) -> dict[Cell, Cell]:
    """``{cell: the first cell of the grid that is the same run}``: same axes, seed and
    identity (a cell that is its own first is not listed)."""
    first: dict[tuple[Any, ...], Cell] = {}
    same = {}
    for cell in grid.cells:
        key = (cell.axes, cell.seed, stable_hash(grid.identities[cell]))
        if key in first:
            same[cell] = first[key]
        else:
            first[key] = cell
    return same


def _split(store: RunStore, grid: GridRun, todo: Sequence[Cell], same: Mapping[Cell, Cell], *,
           write: bool) -> tuple[list[Cell], list[Cell]]:
    """``todo`` as the cells to compute and the copies of them (a copy whose first was reused
    takes its record now, where the grid ``write``s)."""
    for cell in todo:
        if write and cell in same and same[cell] in grid.records:
            share(store, grid, same[cell], [cell])
    return ([cell for cell in todo if cell not in same],
            [cell for cell in todo if cell in same and cell not in grid.records])


def _share_copies(store: RunStore, grid: GridRun, same: Mapping[Cell, Cell],
                 copies: Sequence[Cell]) -> None:
    """Each of ``copies`` takes the outcome of its first (``same[cell]``), once that is there."""
    for cell in copies:
        share(store, grid, same[cell], [cell])


def _copies_of(same: Mapping[Cell, Cell], copies: Sequence[Cell]) -> dict[Cell, list[Cell]]:
    out: dict[Cell, list[Cell]] = {}
    for cell in copies:
        out.setdefault(same[cell], []).append(cell)
    return out


def _note_same(same: Mapping[Cell, Cell], explained: Callable[[Cell, Cell], bool] | None
               ) -> None:
    """One note naming the cells that repeat another's run for no reason said already."""
    pairs = [f"{c.label()} is {first.label()}" for c, first in same.items()
             if explained is None or not explained(c, first)]
    if pairs:
        note(f"{plural(len(pairs))} of this grid repeat{'s' if len(pairs) == 1 else ''} another's "
             f"run (their settings resolve to the same: {'; '.join(pairs[:3])}"
             f"{'; ...' if len(pairs) > 3 else ''}); each is computed once, its record stored "
             "for every one")


def share(store: RunStore, grid: GridRun, first: Cell, copies: Sequence[Cell]) -> None:
    """``first``'s outcome for each of ``copies`` (the same run): its record stored (marked
    ``same_as``) and reused, or its divergence or failure."""
    for cell in copies:
        if first in grid.records:
            record = grid.records[first] | {"same_as": first.label()}
            store.save(cell, grid.identities[cell], record)
            grid.reuse(cell, record)
        elif first in grid.diverged:
            grid.diverged[cell] = dict(grid.diverged[first])
        elif first in grid.failed:
            grid.failed[cell] = dict(grid.failed[first])
