"""What each ``--jobs`` / ``--cluster`` job runs, in a process of its own: its chunk of a
grid's cells, one after another, each record stored atomically as soon as it is computed (a
job killed midway keeps what it finished; a rerun computes only the rest). See
:mod:`~adaptcl.recipes.engine.jobs` for the parent's side."""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from adaptcl.recipes.engine.cells import Cell
from adaptcl.recipes.engine.errors import RecipeError, first_line, plural
from adaptcl.recipes.engine.provenance import stable_hash
from adaptcl.recipes.engine.store import GridRun, RunStore, compute_one


def run_chunk_job(recipe_class: type, sweep: Any, cells: Sequence[Cell],
                  identity_hashes: Sequence[str], threads: int, reuse: bool,
                  where: str) -> dict[str, Any]:
    """One job: rebuild the recipe once, then compute and store each cell of ``cells`` in
    turn (each record stored atomically under its lock as soon as it is computed, as the
    parent would). A cell that raises is named (its traceback on this job's stderr) and the
    next one goes on. ``{"cells": {label: {"status", "error" or "diverged"}}, "superseded",
    "ready_at" (this clock's time once the recipe is built), "compute_seconds"}``; the parent reads the records from the store. A
    changed identity (code, data or settings edited since the submission) fails its cell."""
    recipe = recipe_class(sweep)
    threads = recipe.ready(threads)
    try:  # the BLAS/OpenMP pools of numpy, scipy and scikit-learn take the job's share too
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - scikit-learn requires it
        pass
    else:
        threadpool_limits(limits=int(threads))
    job_id = os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID")
    execution = {"threads": threads, "cluster": where, "job_id": job_id}
    store, results = RunStore(recipe.config.output_dir), {}
    ready = time.time()
    for cell, planned in zip(cells, identity_hashes, strict=True):
        try:
            results[cell.label()] = _job_cell(recipe, store, cell, planned, execution, reuse)
        except Exception as err:  # noqa: BLE001  (named to the parent; the chunk goes on)
            traceback.print_exc()
            results[cell.label()] = {"status": "failed",
                                     "error": f"{type(err).__name__}: {first_line(err)}"}
        print(f"adaptcl: {cell.label()} {results[cell.label()]['status']} "
              f"({plural(threads, 'thread')})", file=sys.stderr, flush=True)
    return {"cells": results, "superseded": list(store.superseded),
            "ready_at": ready, "compute_seconds": time.time() - ready}


def _job_cell(recipe: Any, store: RunStore, cell: Cell, planned: str,
              execution: Mapping[str, Any], reuse: bool) -> dict[str, Any]:
    """Compute and store one cell of a job's chunk: ``{"status", "diverged"}``."""
    identity = recipe.identity_of(cell)
    if stable_hash(identity) != planned:
        raise RecipeError(f"{cell.label()}: its identity (settings, data or code) changed "
                          "since the run was submitted; rerun the command")

    def compute(c: Any) -> dict[str, Any] | None:
        record = recipe.compute_cell(c)
        return None if record is None else dict(record) | {"execution": dict(execution)}

    grid = GridRun(cells=[cell], identities={cell: identity})
    status = compute_one(store, grid, cell, compute, recipe.trains, reuse=reuse)
    return {"status": status, "diverged": grid.diverged.get(cell)}
