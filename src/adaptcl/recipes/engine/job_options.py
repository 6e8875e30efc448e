"""How a grid's cells run: one after another in this process, or as jobs (``--jobs N``, or
``--cluster slurm`` with its ``--cluster-*`` options), and submitit's executor for them. The
jobs themselves are run by :mod:`adaptcl.recipes.engine.jobs`.

Example:
    >>> opts = JobOptions(jobs=4)
    >>> opts.parallel, opts.threads_per_job(8), opts.threads_per_job(1)
    (True, 2, 1)
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
from dataclasses import dataclass
from typing import Any

from adaptcl.recipes.engine.errors import RecipeError, distributed_follower
from adaptcl.recipes.engine.settings import RUN_ONLY, at_least, check_settings, setting

#: a local job's time limit in minutes (submitit's own default is 2)
LOCAL_TIMEOUT_MIN = 7 * 24 * 60
#: the largest grid run without --max-cells (a grid is counted before anything is built)
MAX_CELLS = 10_000


@dataclass
class JobOptions:
    """How a grid's cells run (``--jobs``, ``--cluster``, ``--cluster-*``): one after another
    in this process by default, or as jobs. A SLURM option without ``--cluster slurm`` is
    refused here, what this machine cannot do by :meth:`check_config`."""

    jobs: int | None = setting(None, check=at_least(1), help="cells computed at once, each a "
                               "job of its own (submitit); --threads is divided between them "
                               "(default: 1 on this machine, every cell with --cluster slurm)",
                               **RUN_ONLY)
    cluster: str | None = setting(None, choices=(None, "local", "slurm"), help="where the jobs "
                                  "run: local (this machine) or slurm (through submitit; "
                                  "default: local when --jobs > 1)", **RUN_ONLY)
    cluster_partition: str | None = setting(None, help="SLURM partition of the jobs", **RUN_ONLY)
    cluster_time: int | None = setting(None, check=at_least(1), help="time limit of each job "
                                       "in minutes (SLURM; default: submitit's)", **RUN_ONLY)
    cluster_gpus: int = setting(0, check=at_least(0), help="GPUs per job (SLURM)", **RUN_ONLY)
    cluster_option: list[str] = setting(factory=list, help="KEY=VALUE passed to submitit's "
                                        "update_parameters, e.g. slurm_mem=16G (repeatable: "
                                        "several values)", **RUN_ONLY)
    max_cells: int = setting(MAX_CELLS, check=at_least(1), help="refuse a grid of more cells "
                             "than this (counted before anything is built)", **RUN_ONLY)

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
        def value_of(text: str) -> Any:
            for kind in (int, float):
                with contextlib.suppress(ValueError):
                    return kind(text)
            return text

        return {key.strip(): value_of(value) for key, _, value in
                (text.partition("=") for text in self.cluster_option)}

    def check_cells(self, count: int, factors: str = "") -> None:
        """Refuse a grid of ``count`` cells (``factors``: how they multiply) above
        ``--max-cells``, in one line naming the count and the option."""
        if count > self.max_cells:
            raise RecipeError(f"the grid has {count:,} cells{factors}, more than --max-cells "
                              f"{self.max_cells:,}: give fewer values, or --max-cells {count} "
                              "to run them all")

    @property
    def parallel(self) -> bool:
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
        """Torch threads of each job: ``--threads`` (``None``: the machine's CPUs) divided
        between the jobs running at once here (at least 1), all of it on SLURM."""
        total = int(threads) if threads else (os.cpu_count() or 1)
        return total if self.where == "slurm" else max(1, total // self.max_jobs(cells))

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
        """submitit's ``AutoExecutor`` with the run's parameters (``--cluster-option`` last)."""
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
