"""Running a grid: every cell whose stored record is missing or stale is computed, here one
after another or as jobs (:mod:`~adaptcl.recipes.engine.jobs`); the others are reused.

Example:
    >>> import tempfile
    >>> out = tempfile.mkdtemp()
    >>> cells = [Cell((("dataset", "toy"), ("loss", "base")), seed=s) for s in (0, 1)]
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

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from adaptcl.recipes.engine.cells import Cell
from adaptcl.recipes.engine.errors import check_seed, note, runs
from adaptcl.recipes.engine.jobs import JobRunner, run_jobs
from adaptcl.recipes.engine.progress import progress
from adaptcl.recipes.engine.provenance import git_commit, stable_hash
from adaptcl.recipes.engine.store import (
    ActiveRuns,
    GridRun,
    RunStore,
    collect,
    compute_one,
    distributed_follower,
)


def run_grid(recipe: str, out_dir: str | os.PathLike, cells: Sequence[Cell], *,
             identity: Callable[[Cell], Mapping[str, Any]],
             compute: Callable[[Cell], dict[str, Any] | None] | None,
             trains: Callable[[Cell], bool] | bool = True,
             on_record: Callable[[GridRun], None] | None = None,
             progress_bar: bool = True, reuse: bool = True,
             jobs: JobRunner | None = None) -> GridRun:
    """Compute every cell whose stored record is missing or stale; reuse the others.

    ``identity(cell)`` returns everything that determines the cell's result (JSON-able);
    ``compute(cell)`` returns its record (``metrics``, ``optimisation_steps``, ``train_seconds``
    and anything else), or ``None`` on a process that does not own the result (a non-zero
    rank of a distributed run); ``compute=None`` only collects what is stored. Each record is
    checked before it is stored (:func:`~adaptcl.recipes.engine.errors.check_record`). A cell
    whose ``compute`` raises a divergence, or whose record is non-finite, goes to
    :attr:`GridRun.diverged` (nothing stored) and the grid goes on; any other
    :class:`~adaptcl.recipes.engine.errors.NonResultError` (no optimisation step, no metrics)
    stops the run. ``on_record`` is called after each cell computed or diverged while there is
    at least one record (to rewrite partial result files).

    A cell listed twice is run once (with a note); a seed outside ``[0, 2**32 - 1]`` is refused
    (:class:`~adaptcl.recipes.engine.errors.RecipeError`) before anything is computed.
    ``reuse=False`` recomputes every cell even when a matching record is stored (the old record
    moves to ``runs/superseded/`` once the new one is stored; a cell that diverges keeps it).
    ``jobs``: each cell to compute runs as a submitit job instead of ``compute`` here; a job
    that fails goes to :attr:`GridRun.failed` and the other cells go on. The grid's records and
    lists are in the order of ``cells``, whatever order the jobs finished in.
    """
    unique = list(dict.fromkeys(cells))  # a cell listed twice is computed once
    if len(unique) < len(cells):
        repeated = [c.label() for c in unique if list(cells).count(c) > 1]
        note(f"{runs(len(repeated))} listed more than once ({', '.join(repeated[:3])}"
             f"{', ...' if len(repeated) > 3 else ''}); running each once")
    for cell in unique:  # before anything is computed
        check_seed(cell.seed, cell.label())
    git_commit()  # the commit the runs start from (cached for the result's environment)
    store = RunStore(out_dir)
    grid = GridRun(cells=unique, identities={cell: identity(cell) for cell in unique})
    start = time.perf_counter()
    active = None if distributed_follower() else ActiveRuns(store.layout)
    if active is not None:  # before anything is superseded or computed
        active.register(recipe, {c.label(): stable_hash(grid.identities[c]) for c in grid.cells})
    try:
        todo = collect(store, grid, reuse=reuse)
        if store.stale:  # a record of another identity (settings, data or code)
            note(f"{runs(store.stale)} stored with another identity (settings, data or "
                 f"code) will be computed again; the old records are kept under "
                 f"{store.layout.runs / 'superseded'}")
        if todo and jobs is not None:  # each cell a job of its own (submitit); this process collects
            run_jobs(recipe, store, grid, todo, jobs, on_record=on_record,
                     progress_bar=progress_bar, start=start)
        elif todo and compute is not None:
            _run_here(recipe, store, grid, todo, compute, trains, on_record=on_record,
                      progress_bar=progress_bar, start=start, active=active, reuse=reuse)
    finally:
        if active is not None:
            active.unregister()
    grid.in_grid_order()
    grid.seconds_this_invocation = time.perf_counter() - start
    return grid


def _run_here(recipe: str, store: RunStore, grid: GridRun, todo: Sequence[Cell],
              compute: Callable[[Cell], dict[str, Any] | None],
              trains: Callable[[Cell], bool] | bool, *,
              on_record: Callable[[GridRun], None] | None, progress_bar: bool, start: float,
              active: ActiveRuns | None, reuse: bool) -> None:
    """The cells of ``todo`` one after another in this process, each under its lock."""
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


def _postfix(cell: Cell | None, grid: GridRun) -> str:
    """The progress bar's note: the cell at work, and how many diverged so far."""
    parts = [cell.label()] if cell is not None else []
    if grid.diverged:
        parts.append(f"{len(grid.diverged)} diverged")
    return ", ".join(parts)
