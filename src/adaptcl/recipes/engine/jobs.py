"""Cells as jobs: several at once on this machine, or on a SLURM cluster, through submitit.

``--jobs N`` runs up to N cells of a grid at once, each in a process of its own started by
`submitit <https://github.com/facebookincubator/submitit>`_'s ``LocalExecutor``;
``--cluster slurm`` sends each cell to SLURM as a job through the same code path (submitit's
``AutoExecutor`` with ``cluster="slurm"``). Nothing here schedules: submitit starts, watches
and cancels the processes; the parent only keeps at most N of them submitted at a time
(the local executor starts every submitted job at once) and collects what they stored.

A job is one pure computation (:func:`run_cell_job`): it rebuilds the recipe from its
settings (``Recipe(sweep)``, then its ``ready()``: prepare, threads, setup; shared work such
as ``moleculenet``'s pre-training was done once by the parent, so the job's ``setup`` only
loads it), checks that the cell's identity is the one the parent planned (code, data and
settings unchanged since the submission), computes ONE cell and stores its record through the
:class:`~adaptcl.recipes.engine.store.RunStore` under the cell's lock, as a cell computed in
the parent is stored. The parent reads the record back from the store.

Threads: on this machine ``--threads T`` is divided between the jobs, ``max(1, T // N)`` torch
threads each, and as many for the BLAS/OpenMP pools of numpy, scipy and scikit-learn (so
``--threads 1 --jobs 2`` runs two one-thread jobs: two cores); on SLURM each
job gets ``--threads`` threads and asks for as many CPUs (``cpus_per_task``). The threads a
cell ran with are in its record (``execution.threads``).

Example:
    >>> opts = JobOptions(jobs=4)
    >>> opts.parallel, opts.threads_per_job(8), opts.threads_per_job(1)
    (True, 2, 1)
    >>> JobOptions().parallel
    False
    >>> JobOptions(cluster_option=["slurm_mem=16G"])
    Traceback (most recent call last):
    ...
    adaptcl.recipes.engine.errors.RecipeError: --cluster-option only applies with --cluster slurm
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptcl.recipes.engine.cells import Cell, RunLayout
from adaptcl.recipes.engine.errors import RecipeError, note, runs
from adaptcl.recipes.engine.progress import progress
from adaptcl.recipes.engine.provenance import stable_hash
from adaptcl.recipes.engine.settings import at_least, check_settings, setting
from adaptcl.recipes.engine.store import GridRun, RunStore, compute_one, distributed_follower

#: where the cells run: ``local`` (this machine, submitit's LocalExecutor) or ``slurm``
CLUSTERS = ("local", "slurm")
#: a local job's time limit in minutes (submitit's own default is 2)
LOCAL_TIMEOUT_MIN = 7 * 24 * 60
#: the parent's polling interval in seconds
POLL_SECONDS = 0.2
#: seconds to wait for cancelled local jobs to end (submitit: SIGINT, then SIGKILL after 1 s)
CANCEL_WAIT_SECONDS = 15.0

_RUN = {"identity": False, "sweep": False}


@dataclass
class JobOptions:
    """How a grid's cells run: one after another in this process (the default), or as jobs.

    The fields are the command line's ``--jobs``, ``--cluster`` and ``--cluster-*`` options.
    A combination that cannot run is refused when the options are made (a SLURM option without
    ``--cluster slurm``) or, before any work, by :meth:`check_config` (SLURM absent).
    """

    jobs: int | None = setting(None, check=at_least(1), help="cells computed at once, each a "
                               "job of its own (submitit); --threads is divided between them "
                               "(default: 1 on this machine, every cell with --cluster slurm)",
                               **_RUN)
    cluster: str | None = setting(None, choices=(None, *CLUSTERS), help="where the jobs run: "
                                  "local (this machine) or slurm (through submitit; default: "
                                  "local when --jobs > 1)", **_RUN)
    cluster_partition: str | None = setting(None, help="SLURM partition of the jobs", **_RUN)
    cluster_time: int | None = setting(None, check=at_least(1), help="time limit of each job "
                                       "in minutes (SLURM; default: submitit's)", **_RUN)
    cluster_gpus: int = setting(0, check=at_least(0), help="GPUs per job (SLURM)", **_RUN)
    cluster_option: list[str] = setting(factory=list, help="KEY=VALUE passed to submitit's "
                                        "update_parameters, e.g. slurm_mem=16G (repeatable: "
                                        "several values)", **_RUN)

    def __post_init__(self) -> None:
        try:
            check_settings(self)
        except ValueError as err:
            raise RecipeError(str(err)) from None
        for text in self.cluster_option:
            key, sep, _ = text.partition("=")
            if not sep or not key.strip():
                raise RecipeError(f"--cluster-option: expected KEY=VALUE, got {text!r}")
        slurm_only = [f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(self)
                      if f.name.startswith("cluster_") and getattr(self, f.name)]
        if slurm_only and self.cluster != "slurm":
            verb = "applies" if len(slurm_only) == 1 else "apply"
            raise RecipeError(f"{', '.join(slurm_only)} only {verb} with --cluster slurm")

    @property
    def options(self) -> dict[str, Any]:
        """``--cluster-option`` as keyword arguments (integers and floats as numbers)."""
        out: dict[str, Any] = {}
        for text in self.cluster_option:
            key, _, value = text.partition("=")
            for kind in (int, float):
                try:
                    out[key.strip()] = kind(value)
                    break
                except ValueError:
                    continue
            else:
                out[key.strip()] = value
        return out

    @property
    def parallel(self) -> bool:
        """Whether cells run as jobs (``--jobs > 1`` or an explicit ``--cluster``)."""
        return self.cluster is not None or (self.jobs or 1) > 1

    @property
    def where(self) -> str:
        return self.cluster or "local"

    def max_jobs(self, cells: int) -> int:
        """How many jobs are submitted at once."""
        if self.jobs is not None:
            return int(self.jobs)
        return max(1, cells) if self.where == "slurm" else 1

    def threads_per_job(self, threads: int | None, cells: int = 1) -> int:
        """Torch threads of each job: ``--threads`` divided between the jobs running at once
        on this machine (at least 1), all of ``--threads`` on SLURM (a node of its own);
        ``threads=None`` (torch's default) divides the machine's CPUs."""
        total = int(threads) if threads else (os.cpu_count() or 1)
        if self.where == "slurm":
            return total
        return max(1, total // self.max_jobs(cells))

    def check_config(self, config: Any) -> None:
        """Refuse, before any work, what the jobs cannot do here: SLURM where it is absent,
        several devices per cell, a distributed launch."""
        if not self.parallel:
            return
        if self.cluster == "slurm" and shutil.which("sbatch") is None:
            raise RecipeError("--cluster slurm: SLURM is not available on this machine (no "
                              "sbatch on PATH); run it on a SLURM login node, or use --jobs N "
                              "to run the cells here")
        devices = getattr(config, "devices", 1)
        if isinstance(devices, int) and devices > 1:
            raise RecipeError(f"--devices {devices} with --jobs/--cluster: a cell on several "
                              "devices is one distributed run; run it without --jobs, or use "
                              "--devices 1 and --jobs for many cells")
        if distributed_follower() or os.environ.get("WORLD_SIZE", "1") not in ("", "1"):
            raise RecipeError("--jobs/--cluster under a distributed launcher (torchrun, "
                              "RANK/WORLD_SIZE set): start the run as one process")

    def executor(self, folder: str | os.PathLike, threads: int, name: str) -> Any:
        """The submitit executor: ``AutoExecutor(cluster="local"|"slurm")`` with the run's
        parameters (``--cluster-option`` last, so it wins)."""
        try:
            import submitit
        except ImportError as err:
            raise ImportError("--jobs and --cluster run cells through submitit: "
                              "pip install 'adaptcl[cluster]'") from err
        try:
            executor = submitit.AutoExecutor(folder=str(folder), cluster=self.where)
        except RuntimeError as err:  # no srun here: not a SLURM login node
            raise RecipeError(f"--cluster {self.where}: {err}") from err
        params: dict[str, Any] = {"name": f"adaptcl-{name}", "stderr_to_stdout": False}
        if self.where == "local":
            params["timeout_min"] = LOCAL_TIMEOUT_MIN
        else:
            params.update(cpus_per_task=int(threads), tasks_per_node=1, nodes=1,
                          timeout_min=self.cluster_time,
                          gpus_per_node=self.cluster_gpus or None,
                          slurm_partition=self.cluster_partition)
        params.update(self.options)
        try:
            executor.update_parameters(**params)
        except (NameError, ValueError, AssertionError) as err:
            raise RecipeError(f"--cluster-option: {str(err).splitlines()[0]}") from err
        return executor


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
    try:
        log = str(job.paths.stderr)
    except Exception:  # noqa: BLE001
        log = "(no log)"
    return reason, log


def run_cell_job(recipe_class: type, sweep: Any, cell: Cell, identity_hash: str,
                 threads: int, reuse: bool, where: str) -> dict[str, Any]:
    """One job: rebuild the recipe, compute ``cell`` and store its record (under its lock).

    Returns ``{"status": "computed" | "reused" | "diverged", "superseded": [...],
    "diverged": {...}}``; the record itself is read back from the store by the parent. A
    changed identity (code, data or settings edited since the submission) is refused.
    """
    recipe = recipe_class(sweep)
    threads = recipe.ready(threads)
    limit_blas_threads(threads)
    identity = recipe.identity(cell)
    if stable_hash(identity) != identity_hash:
        raise RecipeError(f"{cell.label()}: its identity (settings, data or code) changed "
                          "since the run was submitted; rerun the command")
    job_id = os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID")
    execution = {"threads": threads, "cluster": where, "job_id": job_id}

    def compute(c: Any) -> dict[str, Any] | None:
        record = recipe.compute(c)
        return None if record is None else dict(record) | {"execution": execution}

    store = RunStore(recipe.config.output_dir)
    grid = GridRun(cells=[cell], identities={cell: identity})
    status = compute_one(store, grid, cell, compute, recipe.trains, reuse=reuse)
    print(f"adaptcl: {cell.label()} {status} ({_threads(threads)})", file=sys.stderr, flush=True)
    return {"status": status, "superseded": list(store.superseded),
            "diverged": grid.diverged.get(cell)}


def limit_blas_threads(threads: int) -> None:
    """Give the BLAS and OpenMP pools of numpy, scipy and scikit-learn (the evaluations) the
    job's share of threads too, so N jobs do not each start a pool over every core
    (``threadpoolctl``, which scikit-learn installs; without it the pools keep their size)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - scikit-learn requires it
        return
    threadpool_limits(limits=int(threads))


def _threads(n: int) -> str:
    return f"{n} thread" + ("" if n == 1 else "s")


class JobRunner:
    """What :func:`~adaptcl.recipes.engine.grid.run_grid` needs to run cells as jobs: the
    executor, how many at once, and how to submit one cell of ``recipe``."""

    def __init__(self, options: JobOptions, recipe: Any, *, threads: int | None, cells: int,
                 reuse: bool = True) -> None:
        self.options = options
        self.max_jobs = options.max_jobs(cells)
        self.threads = options.threads_per_job(threads, cells)
        self.recipe_class, self.sweep, self.reuse = type(recipe), recipe.sweep, reuse
        self.folder = RunLayout(recipe.config.output_dir).jobs
        self.executor = options.executor(self.folder, self.threads, recipe.name)

    def submit(self, cell: Any, identity: Mapping[str, Any]) -> Any:
        local = self.options.where == "local"
        with interruptible_children(), (_stderr_to(self.folder.parent / "controllers.log")
                                         if local else contextlib.nullcontext()):
            return self.executor.submit(run_cell_job, self.recipe_class, self.sweep,
                                        cell, stable_hash(identity), self.threads,
                                        self.reuse, self.options.where)

    def describe(self) -> str:
        return (f"{self.max_jobs} at once ({self.options.where}), {_threads(self.threads)} "
                f"each; logs under {self.folder.parent}")


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """File descriptor 2 on ``path`` while the block starts processes: submitit's local job
    controllers inherit it, so the traceback each prints when a job is cancelled (SIGINT) goes
    to the jobs' folder, not before the command's one line on the terminal."""
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
    """Let the processes started inside take SIGINT, which is how submitit cancels a local job,
    even when this one ignores it (started in the background: ``adaptcl tu ... &`` from a script
    ignores SIGINT, and a child inherits an ignored signal). Python's own handler meanwhile, so
    this process still stops on Ctrl-C; its handlers do not pass to children, ignoring does."""
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
    """Cancel ``jobs``; with ``wait``, until their processes ended (local jobs, at most
    :data:`CANCEL_WAIT_SECONDS`), so none is left computing once the command returns and
    nothing they print follows the command's last line."""
    for job in jobs:
        try:
            job.cancel(check=False)
        except Exception:  # noqa: BLE001,S110  (it may have ended meanwhile)
            pass
    deadline = time.monotonic() + CANCEL_WAIT_SECONDS
    while wait and time.monotonic() < deadline:
        try:
            if all(job.done() for job in jobs):
                return
        except Exception:  # noqa: BLE001  (a job's state could not be read: stop waiting)
            return
        time.sleep(0.1)


def _postfix(running: int, grid: GridRun) -> str:
    parts = [f"{running} running"]
    if grid.failed:
        parts.append(f"{len(grid.failed)} failed")
    if grid.diverged:
        parts.append(f"{len(grid.diverged)} diverged")
    return ", ".join(parts)


def run_jobs(recipe: str, store: RunStore, grid: GridRun, todo: Sequence[Cell],
             runner: JobRunner, *, on_record: Callable[[GridRun], None] | None,
             progress_bar: bool, start: float) -> None:
    """Submit the cells of ``todo`` (at most ``runner.max_jobs`` at a time), collect each
    finished job's record from ``store`` into ``grid`` and call ``on_record``; a failed job
    goes to ``grid.failed`` (one line on stderr naming its log) and the others go on. On an
    interrupt the running jobs are cancelled (their cells are recomputed by a rerun)."""
    note(f"{runs(len(todo))} to compute as jobs: {runner.describe()}")
    bar = progress(total=len(grid.cells), initial=len(grid.reused), desc=f"{recipe} runs",
                   enabled=progress_bar, leave=True)
    pending, running = list(todo), {}
    shown = ""

    def show(refresh: bool = True) -> None:  # redraw on a change only (one line each in a log)
        nonlocal shown
        if _postfix(len(running), grid) != shown:
            shown = _postfix(len(running), grid)
            bar.set_postfix_str(shown, refresh=refresh)

    def submit_next() -> None:
        while pending and len(running) < runner.max_jobs:
            cell = pending.pop(0)
            running[cell] = runner.submit(cell, grid.identities[cell])

    try:
        while pending or running:
            submit_next()
            show()
            done = [cell for cell, job in running.items() if job.done()]
            statuses = [_collect(store, grid, cell, running.pop(cell)) for cell in done]
            submit_next()  # the next ones start before the parent writes the partial table
            grid.seconds_this_invocation = time.perf_counter() - start
            if done:
                show(refresh=False)
                bar.update(len(done))
            if ({"computed", "diverged"} & set(statuses) and on_record is not None
                    and grid.records):
                on_record(grid)
            if not done:
                time.sleep(POLL_SECONDS)
    except BaseException:
        cancel_jobs(list(running.values()), wait=runner.options.where == "local")
        raise
    finally:
        bar.close()
        remove_empty(runner.folder)


def remove_empty(folder: Path) -> None:
    """Remove submitit's ``jobs/%j`` folder (its local executor makes the template itself)
    when nothing is in it."""
    try:
        folder.rmdir()
    except OSError:  # not empty, or not there
        pass


def _collect(store: RunStore, grid: GridRun, cell: Cell, job: Any) -> str:
    try:
        result = job.result()
    except Exception:  # noqa: BLE001  (the cell's own error, in its log)
        return _failed(grid, cell, job, *job_failure(job))
    grid.superseded.extend(result.get("superseded") or [])
    status = result["status"]
    if status == "diverged":
        grid.diverged[cell] = result["diverged"]
        return status
    record = store.load(cell, grid.identities[cell])
    if record is None:
        return _failed(grid, cell, job, f"job {job.job_id} ended ({status}) but no record is "
                       "stored", str(job.paths.stderr))
    grid.records[cell] = record
    (grid.reused if status == "reused" else grid.computed).append(cell)
    return status


def _failed(grid: GridRun, cell: Cell, job: Any, reason: str, log: str) -> str:
    """Record ``cell`` as failed in ``grid`` and say so in one line naming its log."""
    grid.failed[cell] = {"error": reason, "log": log, "job_id": str(job.job_id)}
    print(f"adaptcl: {cell.label()} failed: {reason} (log: {log})", file=sys.stderr, flush=True)
    return "failed"
