"""The :class:`Recipe` base: a recipe states what is specific to it (its config and presets,
:meth:`~Recipe.prepare`, :meth:`~Recipe.compute`, :meth:`~Recipe.report_spec`,
:meth:`~Recipe.draw`) and the engine does the rest the same way for every recipe; see
``docs/recipes/writing.md`` for a whole one."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from adaptcl.recipes.engine.cells import Cell, RunLayout
from adaptcl.recipes.engine.config_file import config_text, keep_previous_run
from adaptcl.recipes.engine.errors import (
    CellConfigError,
    RunStopped,
    distributed_follower,
    note,
    user_errors,
    warnings_as_notes,
)
from adaptcl.recipes.engine.files import check_output_dir, write_text_atomic
from adaptcl.recipes.engine.grid import run_grid
from adaptcl.recipes.engine.job_options import JobOptions
from adaptcl.recipes.engine.jobs import JobRunner
from adaptcl.recipes.engine.plots import save_plot
from adaptcl.recipes.engine.provenance import code_version, stable_hash
from adaptcl.recipes.engine.report import Report, ReportSpec
from adaptcl.recipes.engine.settings import axis_fields, identity_settings, specs
from adaptcl.recipes.engine.store import GridRun
from adaptcl.recipes.engine.sweep import Point, Sweep
from adaptcl.recipes.engine.torch_env import apply_thread_policy, resolve_device


@dataclass(frozen=True)
class Figure:
    """A recipe's figure: its file name under the output folder and its panel layout."""

    file: str
    ncols: int = 1
    figsize: tuple[float, float] = (9.0, 3.6)
    title: str = ""


class Recipe:
    """One recipe: a few class attributes and the methods the engine calls in order.

    ``name`` (the sub-command), ``description`` (its line in ``adaptcl --help``),
    ``config_class``, ``axes`` (the row and column axes of its grid, whose values the config's
    ``setting(axis=...)`` fields hold; a ``seed`` axis is always last), ``presets`` (name ->
    settings; the first is the default), ``code`` (modules whose source determines a result),
    ``frameworks`` (packages whose versions a result records), ``example`` (under ``--help``)
    and ``figure``.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    config_class: ClassVar[type] = object
    axes: ClassVar[tuple[str, str]] = ("dataset", "loss")
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    code: ClassVar[Sequence[str]] = ()
    frameworks: ClassVar[Sequence[str]] = ()
    example: ClassVar[str] = ""
    figure: ClassVar[Figure | None] = None

    def __init__(self, settings: Any, jobs: JobOptions | None = None,
                 preset: str | None = None) -> None:
        #: the settings of the run: a config, or a sweep of several values of some settings
        self.sweep = settings if isinstance(settings, Sweep) else Sweep.of(settings)
        clash = set(self.sweep.axes) & {*self.axes, "seed"}
        if clash:  # a cell holds one value per name
            raise ValueError(f"--{sorted(clash)[0]} names an axis of the grid; it cannot also "
                             "be a swept setting")
        self.preset = preset
        self.jobs = jobs or JobOptions()
        #: data fingerprints by row (dataset, task), filled in by :meth:`prepare`
        self.fingerprints: dict[str, Any] = {}
        self.data_root: Any = None
        #: what :meth:`run` did, once it has run
        self.grid: GridRun | None = None
        self._code: Any = None
        self._in_cell: Cell | None = None  # the cell whose identity or record is being made

    @property
    def config(self) -> Any:
        """The config of the sweep's first point: the run's options, the axes, the tables.

        Not readable while the engine makes a cell's identity or record: a cell's settings are
        the ``config`` that :meth:`identity` and :meth:`compute` are given (a swept setting read
        here would train the first point's value under another point's identity)."""
        if self._in_cell is not None:
            raise CellConfigError(
                f"{type(self).__name__}.config read for cell {self._in_cell.label()}: it is the "
                "sweep's first point; read the config identity(cell, config) and "
                "compute(cell, config) are given")
        return self.sweep.base

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.sweep.base.output_dir)  # not sweepable: every point's folder

    def config_of(self, cell: Cell) -> Any:
        """The config of ``cell``'s point of the sweep."""
        return self.sweep.config_at(cell.point)

    def point_configs(self) -> dict[Point, Any]:
        """Every point of the sweep and its config, in the sweep's order."""
        return {point: self.sweep.config_at(point) for point in self.sweep.points()}

    @contextlib.contextmanager
    def _cell_scope(self, cell: Cell) -> Iterator[Any]:
        """``cell``'s config, with :attr:`config` closed meanwhile."""
        outer, self._in_cell = self._in_cell, cell
        try:
            yield self.config_of(cell)
        finally:
            self._in_cell = outer

    def identity_of(self, cell: Cell) -> dict[str, Any]:
        """:meth:`identity` of ``cell`` given its own config (what the engine calls)."""
        with self._cell_scope(cell) as config:
            return self.identity(cell, config)

    def compute_cell(self, cell: Cell) -> dict[str, Any] | None:
        """:meth:`compute` of ``cell`` given its own config (what the engine calls)."""
        with self._cell_scope(cell) as config:
            return self.compute(cell, config)

    # ---------------------------------------------------------------- what a recipe fills in

    def prepare(self, configs: Mapping[Point, Any]) -> None:
        """Check every input before any work or file write (``ValueError`` /
        ``FileNotFoundError`` become one-line user errors); fill :attr:`fingerprints`.
        ``configs``: every point of the sweep and its config (:meth:`point_configs`)."""

    def setup(self) -> None:
        """Work every cell shares, done once after :meth:`prepare` (a pre-trained encoder)."""

    def _axis_values(self, axis: str, method: str) -> list[Any]:
        field = axis_fields(self.config_class).get(axis)
        if field is None:
            raise NotImplementedError(f"{type(self).__name__} declares no setting with "
                                      f"axis={axis!r}: define {method}()")
        return list(getattr(self.sweep.base, field))  # an axis is never swept

    def rows(self) -> list[Any]:
        """The values of the first axis (the table's rows), from the config by default."""
        return self._axis_values(self.axes[0], "rows")

    def methods(self) -> list[Any]:
        """The values of the second axis (the table's columns), from the config by default."""
        return self._axis_values(self.axes[1], "methods")

    def seeds(self) -> list[int]:
        field = axis_fields(self.config_class).get("seed")
        return list(getattr(self.sweep.base, field)) if field else [0]

    def cell(self, row: Any, method: Any, seed: int, point: Any = ()) -> Cell:
        return Cell(((self.axes[0], row), (self.axes[1], method)), seed, tuple(point))

    def cells(self) -> list[Cell]:
        """The grid: every row, method, point of the sweep and seed, in this order."""
        return [self.cell(r, m, s, p) for r, m, p, s in itertools.product(
            self.rows(), self.methods(), self.sweep.points(), self.seeds())]

    def loss_of(self, method: Any) -> str | None:
        """The loss a column of the table trains (what ``setting(losses=...)`` names), or
        ``None`` where it trains none; the column itself by default."""
        return method if isinstance(method, str) else None

    def settings_identity(self, cell: Cell, config: Any, part: str | None = None
                          ) -> dict[str, Any]:
        """:func:`~adaptcl.recipes.engine.settings.identity_settings` of ``cell``: ``config``'s
        settings of ``part``, those its loss does not read at the run's first point (one
        value for every point: the grid computes such a cell once)."""
        return identity_settings(config, part, loss=self.loss_of(cell.column),
                                 base=self.sweep.base)

    def identity(self, cell: Cell, config: Any) -> dict[str, Any]:
        """Everything that determines ``cell``'s record: settings (``config``, the cell's
        own; :meth:`settings_identity`), data fingerprint, code."""
        return {"settings": self.settings_identity(cell, config), "row": cell.row,
                "data": self.fingerprints.get(cell.row), "code": self._code}

    def ignored(self, cell: Cell, first: Cell) -> bool:
        """Whether ``cell`` and ``first`` (same axes and seed) differ only in settings that
        ``cell``'s loss does not read (what :meth:`note_ignored` said already)."""
        loss = self.loss_of(cell.column)
        readers = {name: spec.losses for name, spec in specs(self.config_class).items()}
        return loss is not None and all(
            readers.get(name) is not None and loss not in readers[name]
            for (name, value), (_, other) in zip(cell.point, first.point, strict=True)
            if value != other)

    def ignoring(self) -> dict[str, list[Any]]:
        """``{swept setting: [columns whose loss does not read it]}`` (those with any)."""
        out = {}
        for name in self.sweep.axes:
            readers = specs(self.config_class)[name].losses
            columns = [m for m in self.methods() if readers is not None
                       and self.loss_of(m) is not None and self.loss_of(m) not in readers]
            if columns:
                out[name] = columns
        return out

    def note_ignored(self) -> None:
        """One note per swept setting some columns' losses do not read, e.g. ``--alpha
        applies to macl only; GraphCL (dcl) runs once`` (columns by the report's labels)."""
        ignoring = self.ignoring()
        labels = self.report_spec().labels if ignoring else {}
        for name, columns in ignoring.items():
            readers = specs(self.config_class)[name].losses or ()
            shown = [labels.get(c, str(c)) for c in columns]
            note(f"--{name.replace('_', '-')} applies to {', '.join(readers)} only; "
                 f"{' and '.join(shown)} run{'s' if len(shown) == 1 else ''} once")

    def checkpoint_dir(self, cell: Cell, config: Any) -> Path:
        """``checkpoints/<cell>/<identity hash>/``: where a training cell keeps the checkpoints
        an interrupted run resumes from; a changed cell never resumes another's."""
        return self.layout.cell_folder("checkpoints", cell) / stable_hash(
            self.identity(cell, config), 10)

    def compute(self, cell: Cell, config: Any) -> dict[str, Any] | None:
        """The record of one cell from ``config``, its own settings: ``metrics``,
        ``optimisation_steps``, ``train_seconds``, ..."""
        raise NotImplementedError(f"{type(self).__name__} must define compute(cell, config)")

    def trains(self, cell: Cell) -> bool:
        """Whether ``cell`` must take an optimisation step to be a result."""
        return True

    def reuses(self) -> bool:
        """``False`` recomputes every cell (a recipe's ``--no-cache``), the old record set aside."""
        return True

    def report_spec(self) -> ReportSpec:
        raise NotImplementedError(f"{type(self).__name__} must define report_spec()")

    def draw(self, grid: GridRun, axes: list[Any]) -> None:
        """Draw the recipe's figure on ``axes`` (only called when :attr:`figure` is set)."""

    # ------------------------------------------------------------------------ the driver

    @classmethod
    def main(cls, argv: Sequence[str], prog: str) -> int:
        """``adaptcl <name> ...``: run and print the table and where the files are."""
        from adaptcl.recipes.engine.command_line import parse

        with warnings_as_notes(FutureWarning):  # an old loss spelling
            invocation = parse(cls, argv, prog)
        if invocation.print_config:
            print(config_text(cls.name, invocation.preset, invocation.sweep), end="")
            return 0
        recipe = cls(invocation.sweep, jobs=invocation.jobs, preset=invocation.preset)
        try:
            result = recipe.run()
        except (KeyboardInterrupt, RunStopped) as stop:  # the CLI's line says where runs are kept
            stop.output_dir = recipe.config.output_dir  # type: ignore[union-attr]
            raise
        if not result:  # a process that owns no result (a non-zero rank of a distributed run)
            return 0
        print(result["table_markdown"])
        outputs = result["outputs"]
        print(f"results: {outputs['json']}  table: {outputs['markdown']}"
              + (f"  plot: {result['plot']}" if result.get("plot") else ""))
        for error in (recipe.grid.failed_error(), recipe.grid.diverged_error()):
            if error is not None:  # the others are stored and in the table
                raise error
        return 0

    def ready(self, threads: int | None) -> int | None:
        """What every cell needs in this process: :meth:`prepare` (its errors one-line), the
        thread policy, the code version, :meth:`setup`. Returns the torch threads."""
        with user_errors():
            self.prepare(self.point_configs())
        threads = apply_thread_policy(threads)
        self._code = code_version(*self.code) if self.code else None
        self.setup()
        return threads

    def run(self) -> dict[str, Any]:
        """Validate, compute what is missing or stale, write the result files and the plot."""
        cfg = self.config
        with user_errors():
            self.jobs.check_config(cfg)
            for name, spec in specs(cfg).items():  # every folder the run writes
                if spec.folder and getattr(cfg, name) is not None:
                    check_output_dir(getattr(cfg, name), option="--" + name.replace("_", "-"))
        threads = getattr(cfg, "threads", None)
        self.ready(threads)  # before any job: a job's setup() only loads
        self.note_ignored()
        report = self.make_report()
        cells = self.cells()
        self.jobs.check_cells(len(cells))
        runner = None
        if self.jobs.parallel:
            with user_errors():
                runner = JobRunner(self.jobs, self, threads=threads, cells=len(cells),
                                   reuse=self.reuses())
        text = config_text(self.name, self.preset, self.sweep, folder=cfg.output_dir)
        if not distributed_follower():  # another run's settings and results: kept aside
            keep_previous_run(self.layout, self.config_class, text, outputs=[
                self.layout.root / self.figure.file] if self.figure is not None else [])
        write_text_atomic(self.layout.config, text)
        self.grid = grid = run_grid(
            self.name, cfg.output_dir, cells, identity=self.identity_of, compute=self.compute_cell,
            trains=self.trains, on_record=report.write, progress_bar=getattr(cfg, "progress", True),
            reuse=self.reuses(), jobs=runner, explained=self.ignored)
        if not grid.records and not grid.diverged:
            if grid.failed:
                raise grid.failed_error()
            return {}  # every compute returned None: another process owns the result
        result = report.write(grid)  # also when every cell diverged: the file says so
        if not grid.records:
            raise grid.failed_error() or grid.diverged_error()
        if self.figure is not None and getattr(cfg, "plot", True):
            result["plot"] = save_plot(self.layout.root / self.figure.file,
                                       lambda axes: self.draw(grid, axes),
                                       title=self.figure.title, figsize=self.figure.figsize,
                                       ncols=self.figure.ncols)
        return result

    def make_report(self) -> Report:
        device = getattr(self.config, "device", None)
        return Report(self.name, self.config.output_dir, self.report_spec(), axes=self.axes,
                      methods=self.methods(), config=self.config, preset=self.preset,
                      sweep=self.sweep.axes, ignoring=self.ignoring(),
                      environment={"frameworks": self.frameworks,
                                   "device": resolve_device(device) if device else None,
                                   "data_root": self.data_root,
                                   "data_fingerprint": self.fingerprints or None})
