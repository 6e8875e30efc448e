"""A grid's cells and where everything of a run lives under ``--output-dir``.

Example:
    >>> cell = Cell((("dataset", "MUTAG"), ("loss", "macl")), seed=0,
    ...             point=(("temperature", 0.1),))
    >>> cell.loss, cell.seed, cell.label()
    ('macl', 0, 'MUTAG/macl/temperature=0.1/seed0')
    >>> RunLayout("out").record(cell).as_posix()
    'out/runs/MUTAG/macl/temperature=0.1/seed0.json'
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptcl.recipes.engine.sweep import Point


def _text(value: Any) -> str:
    return "none" if value is None else str(value)


@dataclass(frozen=True)
class Cell:
    """One run of a grid: ``axes`` (``((name, value), ...)``, the recipe's axes in order: the
    first gives the table's rows, the second its columns), a ``seed`` and ``point``, the swept
    settings (``((field, value), ...)``). Each axis and swept setting reads as an attribute
    (``cell.dataset``, ``cell.loss``)."""

    axes: tuple[tuple[str, Any], ...]
    seed: int
    point: Point = ()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("axes", "seed", "point"):
            raise AttributeError(name)
        for key, value in (*self.axes, *self.point):
            if key == name:
                return value
        raise AttributeError(f"cell {self.label()} has no axis {name!r}")

    @property
    def row(self) -> Any:
        return self.axes[0][1]

    @property
    def column(self) -> Any:
        return self.axes[1][1]

    def parts(self) -> list[str]:
        """Path components: the axes' values, ``field=value`` per swept setting, ``seed<k>``."""
        return ([_text(v) for _, v in self.axes] + [f"{k}={_text(v)}" for k, v in self.point]
                + [f"seed{self.seed}"])

    def label(self) -> str:
        return "/".join(self.parts())

    def as_dict(self) -> dict[str, Any]:
        """``{axis: value, ..., swept field: value, ..., "seed": k}`` (JSON)."""
        return {**dict(self.axes), **dict(self.point), "seed": self.seed}


class RunLayout:
    """Every path under one output folder; nothing else builds one.

    ``runs/<cell>.json`` the records (``runs/superseded/<time>/``, ``runs/.locks/``,
    ``runs/.active/``), ``results.json`` / ``.md``, ``config.yaml``, ``<kind>/<cell>/`` a
    cell's logs, checkpoints or models, ``<kind>/`` what cells share (``data``, ``cache``),
    ``jobs/<id>/`` the logs of ``--jobs``, ``history/<n>/`` the config and results of an earlier
    run of the folder with other settings.
    """

    def __init__(self, out_dir: str | os.PathLike) -> None:
        self.root = Path(out_dir)
        self.runs = self.root / "runs"
        self.active = self.runs / ".active"
        self.config = self.root / "config.yaml"
        self.history_root = self.root / "history"
        #: where submitit keeps each job's pickles and logs: ``jobs/<job id>/``
        self.jobs = self.root / "jobs" / "%j"

    def record(self, cell: Cell) -> Path:
        *folders, last = cell.parts()
        return self.runs.joinpath(*folders, f"{last}.json")

    def lock(self, cell: Cell) -> Path:
        *folders, last = cell.parts()
        return self.runs.joinpath(".locks", *folders, f"{last}.lock")

    def superseded(self, stamp: str) -> Path:
        return self.runs / "superseded" / stamp

    def history(self, n: int) -> Path:
        return self.history_root / str(n)

    def cell_folder(self, kind: str, cell: Cell) -> Path:
        return self.root.joinpath(kind, *cell.parts())

    def folder(self, kind: str) -> Path:
        """``<out>/<kind>/``, a file or folder the run's cells share."""
        return self.root / kind

    def results(self, suffix: str) -> Path:
        return self.root / f"results.{suffix}"
