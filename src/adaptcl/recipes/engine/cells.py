"""A grid's cells and where everything of a run lives under ``--output-dir``.

A :class:`Cell` is one run of a grid: a value on each of the recipe's named axes (``dataset``
and ``loss`` in ``tu``, ``dataset`` and ``init`` in ``moleculenet``, ``task`` and ``encoder``
in ``sts``), the point of the sweep (the settings given several values) and a seed.
:class:`RunLayout` owns every path under the output folder; nothing else builds one.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptcl.recipes.engine.settings import Point


def _text(value: Any) -> str:
    return "none" if value is None else str(value)


@dataclass(frozen=True)
class Cell:
    """One run of a grid.

    ``axes``: ``((name, value), ...)``, the recipe's axes in its order (the first gives the
    table's rows, the second its columns); ``seed``; ``point``: the swept settings,
    ``((field, value), ...)``. Each axis reads as an attribute (``cell.dataset``,
    ``cell.loss``), and so does each swept setting.
    """

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
        """The value of the first axis (the table's row: a dataset, a task)."""
        return self.axes[0][1]

    @property
    def column(self) -> Any:
        """The value of the second axis (the table's column: a loss, an init, an encoder)."""
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

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], axes: Sequence[str]) -> Cell:
        """The cell of :meth:`as_dict` whose named axes are ``axes`` (the rest but the seed
        is its point)."""
        rest = [k for k in values if k not in axes and k != "seed"]
        return cls(tuple((a, values[a]) for a in axes), int(values["seed"]),
                   tuple((k, values[k]) for k in rest))

    def at_point(self, point: Point) -> Cell:
        return Cell(self.axes, self.seed, tuple(point))


class RunLayout:
    """Every path under one output folder.

    ``runs/<cell>.json`` the stored records (``runs/superseded/<time>/`` the set-aside ones,
    ``runs/.locks/``, ``runs/.active/``), ``results.json`` / ``.md`` / ``config.yaml`` the
    summary and the config that reruns it, ``<kind>/<cell>/`` a cell's logs, checkpoints or
    saved models, ``<kind>/`` a recipe's shared folders (``data``, ``cache``, ``pretrain``),
    ``jobs/<id>/`` the logs of ``--jobs``.
    """

    RESULTS = "results"
    CONFIG = "config.yaml"

    def __init__(self, out_dir: str | os.PathLike) -> None:
        self.root = Path(out_dir)
        self.runs = self.root / "runs"

    def record(self, cell: Cell) -> Path:
        *folders, last = cell.parts()
        return self.runs.joinpath(*folders, f"{last}.json")

    def lock(self, cell: Cell) -> Path:
        *folders, last = cell.parts()
        return self.runs.joinpath(".locks", *folders, f"{last}.lock")

    @property
    def active(self) -> Path:
        return self.runs / ".active"

    def superseded(self, stamp: str) -> Path:
        return self.runs / "superseded" / stamp

    def cell_folder(self, kind: str, cell: Cell) -> Path:
        """``<out>/<kind>/<cell>/``: a cell's ``logs``, ``checkpoints`` or ``models``."""
        return self.root.joinpath(kind, *cell.parts())

    def folder(self, kind: str) -> Path:
        """``<out>/<kind>/``: what the cells of a run share (``data``, ``cache``, ...)."""
        return self.root / kind

    def results(self, suffix: str) -> Path:
        """``results.json`` / ``results.md``."""
        return self.root / f"{self.RESULTS}.{suffix}"

    @property
    def config(self) -> Path:
        return self.root / self.CONFIG

    def plot(self, name: str) -> Path:
        return self.root / name

    @property
    def jobs(self) -> Path:
        """Where submitit keeps each job's pickles and logs: ``jobs/<job id>/``."""
        return self.root / "jobs" / "%j"
