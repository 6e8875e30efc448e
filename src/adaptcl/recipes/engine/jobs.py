"""Cells as jobs: several at once on this machine, or on a SLURM cluster, through submitit
(``--jobs N``: submitit's ``LocalExecutor``; ``--cluster slurm``: its ``AutoExecutor``, same
code path). submitit starts, watches and cancels the processes; the parent deals the cells to
at most N jobs (one process each, so a job's start-up -- importing torch, building the data --
is paid once per job, not per cell) and collects each record as soon as a job stored it. Each
job (:func:`~adaptcl.recipes.engine.job_cells.run_chunk_job`) rebuilds the recipe from its
settings once and computes and stores its cells one by one as the parent would. How the cells
run (``--jobs``, ``--cluster``, ...) is :class:`~adaptcl.recipes.engine.job_options.JobOptions`.
See ``docs/recipes/scale.md``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from adaptcl.recipes.engine.cells import Cell, RunLayout
from adaptcl.recipes.engine.errors import note, plural
from adaptcl.recipes.engine.files import read_json
from adaptcl.recipes.engine.job_cells import run_chunk_job
from adaptcl.recipes.engine.job_options import JobOptions
from adaptcl.recipes.engine.provenance import stable_hash
from adaptcl.recipes.engine.store import GridRun, RunStore

#: the parent's polling interval in seconds
POLL_SECONDS = 0.2
#: seconds to wait for cancelled local jobs to end (submitit: SIGINT, then SIGKILL after 1 s)
CANCEL_WAIT_SECONDS = 15.0


def job_failure(job: Any) -> tuple[str, str]:
    """``(reason, log path)`` of a failed submitit job: the last line of its traceback (or of
    submitit's message when it never ran, e.g. killed) and its stderr file."""
    try:
        error = job.exception()
    except Exception as err:  # noqa: BLE001  (the job's state could not be read)
        error = err
    text = str(error or "the job ended without a result")
    if "with trace:" in text:  # submitit's FailedJobError: the trace between two rules
        trace = text.split("----------------------\n", 2)[1]
        lines = [line for line in trace.splitlines() if line.strip()]
        reason = lines[-1].strip() if lines else text.splitlines()[0]
    elif type(error).__name__ == "UncompletedJobError":  # no result: its process was stopped
        reason = ("its process ended without a result (killed, or out of memory or time); "
                  f"submitit: {text.strip().splitlines()[0]}")
    else:
        reason = f"{type(error).__name__}: {text.strip().splitlines()[0] if text.strip() else ''}"
    return reason, _log_of(job)


class JobRunner:
    """What :func:`~adaptcl.recipes.engine.grid.run_grid` needs to run cells as jobs: the
    executor, how many jobs, and how to submit a chunk of cells of ``recipe``."""

    def __init__(self, options: JobOptions, recipe: Any, *, threads: int | None, cells: int,
                 reuse: bool = True) -> None:
        self.options = options
        self.max_jobs = options.max_jobs(cells)
        self.threads = options.threads_per_job(threads, cells)
        self.recipe_class, self.sweep, self.reuse = type(recipe), recipe.sweep, reuse
        self.folder = RunLayout(recipe.config.output_dir).jobs
        self.executor = options.executor(self.folder, self.threads, recipe.name)

    def chunks(self, todo: Sequence[Cell]) -> list[list[Cell]]:
        """``todo`` dealt out to at most :attr:`max_jobs` jobs, round robin (so each job gets
        a share of every dataset and loss): one process per job, however many cells."""
        count = min(self.max_jobs, len(todo))
        return [list(todo[i::count]) for i in range(count)] if count else []

    def submit(self, cells: Sequence[Cell], identities: Mapping[Cell, Any]) -> Any:
        local = self.options.where == "local"
        with interruptible_children(), (_stderr_to(self.folder.parent / "controllers.log")
                                         if local else contextlib.nullcontext()):
            return self.executor.submit(run_chunk_job, self.recipe_class, self.sweep,
                                        list(cells), [stable_hash(identities[c]) for c in cells],
                                        self.threads, self.reuse, self.options.where)

    def describe(self, todo: int) -> str:
        """The run's note: how many jobs, of how many cells, and when ``--jobs`` gives less."""
        count = min(self.max_jobs, todo)
        size = -(-todo // max(count, 1))
        short = (f"; only {plural(todo)} to compute for --jobs {self.max_jobs}, so "
                 f"{plural(count, 'job')}" if count < self.max_jobs else "")
        return (f"{plural(count, 'job')} of up to {plural(size)} each ({self.options.where}), "
                f"{plural(self.threads, 'thread')} each{short}; logs under {self.folder.parent}")


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """File descriptor 2 on ``path`` while the block starts processes: submitit's local job
    controllers inherit it, so the traceback each prints when a job is cancelled goes to the
    jobs' folder, not before the command's one line on the terminal."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def interruptible_children() -> Iterator[None]:
    """Let the processes started inside take SIGINT (how submitit cancels a local job) even when
    this one ignores it (``adaptcl tu ... &`` from a script), since a child inherits an ignored
    signal but not a handler; Python's own handler meanwhile, so Ctrl-C still stops this one."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.SIG_IGN):
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def cancel_jobs(jobs: Sequence[Any], *, wait: bool) -> None:
    """Cancel ``jobs``; with ``wait``, until their processes ended (at most
    :data:`CANCEL_WAIT_SECONDS`), so nothing they print follows the command's last line."""
    for job in jobs:
        with contextlib.suppress(Exception):  # it may have ended meanwhile
            job.cancel(check=False)
    deadline = time.monotonic() + CANCEL_WAIT_SECONDS
    while wait and time.monotonic() < deadline:
        try:
            if all(job.done() for job in jobs):
                return
        except Exception:  # noqa: BLE001  (a job's state could not be read: stop waiting)
            return
        time.sleep(0.1)


def run_jobs(store: RunStore, grid: GridRun, todo: Sequence[Cell], runner: JobRunner,
             bar: Any, *, on_record: Callable[[GridRun], None] | None, start: float) -> None:
    """Submit the cells of ``todo`` as :meth:`JobRunner.chunks` (one job each), collect each
    record from ``store`` into ``grid`` as soon as its job stored it and call ``on_record``;
    a failed cell goes to ``grid.failed`` (one line on stderr naming its log) and the others
    go on. On an interrupt the running jobs are cancelled (a rerun computes their cells)."""
    running: dict[Any, list[Cell]] = {}
    shown, times = "", []  # (start-up, compute) seconds of each job that returned

    def show(refresh: bool = True) -> None:  # redraw on a change only (one line each in a log)
        nonlocal shown
        if grid.progress_note(f"{len(running)} running") != shown:
            shown = grid.progress_note(f"{len(running)} running")
            bar.set_postfix_str(shown, refresh=refresh)

    try:
        submitted = time.time()
        for chunk in runner.chunks(todo):
            running[runner.submit(chunk, grid.identities)] = list(chunk)
        while running:
            show()
            statuses = []
            for job, left in list(running.items()):
                done = job.done()  # before reading the store: a record stored after is read
                statuses += [_stored_by(store, grid, c, job, left) for c in list(left)]
                if done:
                    statuses += _collect(store, grid, job, running.pop(job), times, submitted)
            statuses = [s for s in statuses if s is not None]
            grid.seconds_this_invocation = time.perf_counter() - start
            if statuses:
                show(refresh=False)
                bar.update(len(statuses))
            if ({"computed", "diverged"} & set(statuses) and on_record is not None
                    and grid.records):
                on_record(grid)
            if running:
                time.sleep(POLL_SECONDS)
        _note_start_up(times, len(runner.chunks(todo)), runner.options.where)
    except BaseException:
        cancel_jobs(list(running), wait=runner.options.where == "local")
        raise
    finally:
        with contextlib.suppress(OSError):  # submitit's empty template folder ``jobs/%j``
            runner.folder.rmdir()


def _stored_by(store: RunStore, grid: GridRun, cell: Cell, job: Any,
               left: list[Cell]) -> str | None:
    """``"computed"`` once ``job`` stored ``cell``'s record (taken out of ``left``), else
    ``None``; reads only (a record of another identity or job is left for the job to handle)."""
    try:
        stored = read_json(store.path(cell))
        record = stored["record"]
        ours = (stored["identity_hash"] == stable_hash(grid.identities[cell])
                and str(record["execution"]["job_id"]) == str(job.job_id))
    except (OSError, ValueError, KeyError, TypeError):  # not there yet, or not the job's
        return None
    if not ours:
        return None
    left.remove(cell)
    grid.records[cell] = record
    grid.computed.append(cell)
    return "computed"


def _note_start_up(times: list[tuple[float, float]], jobs: int, where: str) -> None:
    """One line when the local jobs took longer to start than running at once saved."""
    if where != "local" or not times:
        return
    start_up, compute = (sum(t) / len(times) for t in zip(*times, strict=True))
    if start_up > (jobs - 1) * compute:
        note(f"--jobs: each job took {start_up:.0f} s to start (imports, data) and "
             f"{compute:.0f} s to compute its runs; one process would have computed them in "
             f"about {jobs * compute:.0f} s: runs this short gain nothing from --jobs")


def _collect(store: RunStore, grid: GridRun, job: Any, left: list[Cell],
             times: list[tuple[float, float]], submitted: float) -> list[str]:
    """The cells of a finished job not collected yet: each as the job says, or failed with
    the job's own error when it ended without a result (killed: what it stored is kept)."""
    try:
        result = job.result()
    except Exception:  # noqa: BLE001  (the job's own error, in its log)
        reason, log = job_failure(job)
        return [_failed(grid, cell, job, reason, log) for cell in left]
    grid.superseded.extend(result.get("superseded") or [])
    times.append((result["ready_at"] - submitted, result["compute_seconds"]))
    return [_collect_cell(store, grid, job, cell, result["cells"][cell.label()])
            for cell in left]


def _collect_cell(store: RunStore, grid: GridRun, job: Any, cell: Cell,
                  outcome: Mapping[str, Any]) -> str:
    status = outcome["status"]
    if status == "failed":
        return _failed(grid, cell, job, outcome["error"], _log_of(job))
    if status == "diverged":
        grid.diverged[cell] = outcome["diverged"]
        return status
    record = store.load(cell, grid.identities[cell])
    if record is None:
        return _failed(grid, cell, job, f"job {job.job_id} ended ({status}) but no record is "
                       "stored", _log_of(job))
    grid.records[cell] = record
    (grid.reused if status == "reused" else grid.computed).append(cell)
    return status


def _log_of(job: Any) -> str:
    try:
        return str(job.paths.stderr)
    except Exception:  # noqa: BLE001
        return "(no log)"


def _failed(grid: GridRun, cell: Cell, job: Any, reason: str, log: str) -> str:
    grid.failed[cell] = {"error": reason, "log": log, "job_id": str(job.job_id)}
    print(f"adaptcl: {cell.label()} failed: {reason} (log: {log})", file=sys.stderr, flush=True)
    return "failed"
