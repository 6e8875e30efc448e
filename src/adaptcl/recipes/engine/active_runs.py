"""The live runs of one output folder: which process computes which cells, so that a second
run of other settings is refused before it computes or supersedes anything
(:class:`ActiveRuns`; the run store, :mod:`~adaptcl.recipes.engine.store`, asks it).

Example:
    >>> import tempfile
    >>> from adaptcl.recipes.engine.cells import RunLayout
    >>> runs = ActiveRuns(RunLayout(tempfile.mkdtemp()))
    >>> runs.register("toy", {"d/m/seed0": "abc"})
    >>> runs.owner("d/m/seed0") is None   # this process's own grid is not another run
    True
    >>> runs.unregister()
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import re
import secrets
import socket
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from adaptcl.recipes.engine.cells import RunLayout
from adaptcl.recipes.engine.errors import RecipeError
from adaptcl.recipes.engine.files import read_json, write_json_atomic


class ActiveRuns:
    """The live runs of one store: ``runs/.active/<host>-<pid>-<token>.json`` holds the process
    and the identity hash of each cell of its grid (``cells``: label -> hash). Its process
    holds the entry's ``.lock`` while the grid runs, so an entry whose lock can be taken is
    stale (its process died) and removed. Entries are read and written under
    ``runs/.active/.registry.lock``: of two conflicting runs that start together, the second
    is refused."""

    def __init__(self, layout: RunLayout) -> None:
        self.dir = layout.active
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
        """Record this grid (label -> identity hash), or :class:`RecipeError` naming the first
        cell a live run computes with other settings."""
        from filelock import FileLock

        with self._registry():
            for entry in self._live():
                theirs = entry.get("cells") or {}
                for label, identity_hash in cells.items():
                    if label in theirs and theirs[label] != identity_hash:
                        raise RecipeError(
                            f"{label} in {self.dir.parent.parent} is being computed with other "
                            f"settings by another run ({describe_run(entry)}); use another "
                            "--output-dir or wait for it")
            host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"
            name = f"{host}-{os.getpid()}-{secrets.token_hex(3)}"
            self._hold = FileLock(str(self.dir / f"{name}.lock"))
            self._hold.acquire(timeout=0)
            self.entry = write_json_atomic(self.dir / f"{name}.json", {
                "pid": os.getpid(), "host": socket.gethostname(), "recipe": recipe,
                "argv": " ".join(sys.argv)[:500],
                "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "cells": dict(cells)})

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


def describe_run(entry: Mapping[str, Any]) -> str:
    """One live run of the registry as a message names it: the recipe, process, host, start."""
    return (f"adaptcl {entry.get('recipe')}, process {entry.get('pid')} on {entry.get('host')}, "
            f"started {entry.get('started')}")
