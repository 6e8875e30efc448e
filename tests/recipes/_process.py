"""What the recipe tests that start processes share: the checkout's ``src`` first on the path,
and the processes a process started (from /proc)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"


def env_with_src(**extra: str) -> dict[str, str]:
    """This process's environment with the checkout's ``src`` first on ``PYTHONPATH`` (a
    subprocess imports the code under test, not another install) and ``extra`` set."""
    path = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    return dict(os.environ, PYTHONPATH=path, **extra)


def _stats() -> Iterator[tuple[int, list[str]]]:
    """``(pid, the fields of /proc/<pid>/stat after the name)`` of every process."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue  # it ended between the listing and the read
        yield int(stat.parent.name), fields


def children(pids: list[int]) -> list[int]:
    """The processes whose parent is one of ``pids`` (from /proc)."""
    return [pid for pid, fields in _stats() if int(fields[1]) in pids]


def group(pgid: int) -> list[int]:
    """The live processes (not zombies) of process group ``pgid`` (from /proc)."""
    return [pid for pid, fields in _stats()
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X")]
