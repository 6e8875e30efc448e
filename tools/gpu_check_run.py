"""Running the parts of ``tools/gpu_check.py``: each command in a process group of its own
under a time limit, its output appended to one log; and the environment the check ran in.

A part that exits non-zero is ``failed``; one that outlives its limit is ``timed out``: its
whole process group (DataLoader workers, pytest's children) gets SIGTERM, then SIGKILL after
:data:`GRACE_S`. Either way the next part runs.
"""

from __future__ import annotations

import importlib.metadata
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TAIL_LINES = 25  # of each part's output, kept in the report
GRACE_S = 10.0  # SIGTERM -> SIGKILL of a timed-out part's process group
OK, FAILED, TIMED_OUT, SKIPPED = "ok", "failed", "timed out", "skipped"


@dataclass
class Part:
    """One command of the check. ``skip``: why it does not run here (None: it runs);
    ``parse`` names the parser of its outputs (``pytest``, ``bench``, ``recipe``) and
    ``artifact`` the file it writes (junit XML, the benchmark's JSON, the recipe's folder)."""

    name: str
    title: str
    argv: list[str]
    limit_s: float
    parse: str
    artifact: Path
    skip: str | None = None
    notes: list[str] = field(default_factory=list)


def run_part(part: Part, *, log: Path, env: dict[str, str], cwd: Path,
             budget_left_s: float) -> dict[str, Any]:
    """Run ``part`` under ``min(part.limit_s, budget_left_s)`` seconds; its record.

    The record holds the command, ``status``, ``exit_status`` (None when it did not end by
    itself), ``wall_s``, ``limit_s`` and ``reason`` for anything but ``ok``; the output goes to
    ``log`` (appended, under a header naming the part)."""
    record: dict[str, Any] = {"name": part.name, "title": part.title,
                              "command": shlex.join(part.argv), "limit_s": part.limit_s,
                              "exit_status": None, "wall_s": 0.0, "notes": list(part.notes)}
    if part.skip is not None:
        return {**record, "status": SKIPPED, "reason": part.skip}
    limit = min(part.limit_s, budget_left_s)
    if budget_left_s < 1:
        return {**record, "status": SKIPPED,
                "reason": f"the check's total budget was spent before it ({budget_left_s:.0f} s left)"}
    record["limit_s"] = round(limit, 1)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n===== {part.name}: {record['command']} (limit {limit:.0f} s)\n")
        out.flush()
        begin, start = out.tell(), time.monotonic()
        proc = subprocess.Popen(part.argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            code = None
        except BaseException:  # Ctrl-C of the check: end the part's group before leaving
            stop_group(proc)
            raise
        record["wall_s"] = round(time.monotonic() - start, 2)
        out.write(f"===== {part.name}: exit {code} after {record['wall_s']:.1f} s\n")
    record["log_tail"] = tail(log, begin)
    if code is None:
        return {**record, "status": TIMED_OUT,
                "reason": f"still running after its limit of {limit:.0f} s; its process group "
                          "was terminated"}
    record["exit_status"] = code
    if code != 0:
        return {**record, "status": FAILED, "reason": f"exit status {code}"}
    return {**record, "status": OK}


def tail(log: Path, begin: int, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines the part wrote (from byte ``begin`` of ``log``)."""
    with log.open("rb") as f:
        f.seek(begin)
        text = f.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to ``proc``'s process group, then SIGKILL to whatever of it is left after
    :data:`GRACE_S` (or as soon as the leader has gone: workers that outlive it)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# ------------------------------------------------------------------------------ environment

PACKAGES = ("torch", "triton", "lightly", "sentence-transformers", "transformers",
            "torch-geometric", "pytorch-lightning", "numpy")


def _command(argv: list[str], cwd: Path) -> str | None:
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def git_state(repo: Path) -> dict[str, Any]:
    """Commit hash and whether tracked files differ from it (None: not a git checkout)."""
    commit = _command(["git", "rev-parse", "HEAD"], repo)
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _command(["git", "status", "--porcelain", "--untracked-files=no"], repo)
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def gpu_state() -> dict[str, Any]:
    """GPU name, driver and memory from ``nvidia-smi`` (None where there is none)."""
    line = _command(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                     "--format=csv,noheader"], Path.cwd())
    if not line:
        return {"gpu": None, "driver": None, "gpu_memory": None}
    name, driver, memory = ([*(x.strip() for x in line.splitlines()[0].split(",")), None, None])[:3]
    return {"gpu": name, "driver": driver, "gpu_memory": memory}


def environment(repo: Path, device: str) -> dict[str, Any]:
    """Where the check ran: GPU, driver, versions (torch, its CUDA, Triton, the frameworks),
    Python, the commit and whether the checkout was dirty."""
    import platform

    import torch

    env: dict[str, Any] = {"device": device, **gpu_state(), "python": platform.python_version(),
                           "torch_cuda": torch.version.cuda,
                           "cuda_available": torch.cuda.is_available(), **git_state(repo)}
    if env["gpu"] is None and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    for name in PACKAGES:
        try:
            env[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            env[name] = None
    env["torch"] = torch.__version__
    return env
