"""The :class:`Recipe` template: a recipe fills it in, the template drives it.

A recipe states what is specific to it and nothing else: its config dataclass (and presets),
how to check its inputs (:meth:`Recipe.prepare`), the grid of cells (:meth:`Recipe.cells`), one
cell's computation (:meth:`Recipe.compute`), the table (:meth:`Recipe.report_spec`) and the plot
(:meth:`Recipe.draw`). The template does the rest once for every recipe: the command line
(:meth:`Recipe.add_arguments`), validation before any work or file, the run store and resume
(:func:`~adaptcl.recipes.template.store.run_grid`), progress, the environment record, summaries
with paired confidence intervals and the result files
(:class:`~adaptcl.recipes.template.report.Report`), and the exit code.

Where ``--output-dir`` goes: ``adaptcl.cli`` parses it and calls :meth:`Recipe.main`, which
builds the config (:meth:`Recipe.config_from_args`) and calls :meth:`Recipe.run`; ``run`` hands
the folder to :func:`~adaptcl.recipes.template.store.run_grid` (``runs/``) and to
:class:`~adaptcl.recipes.template.report.Report` (``results.json``/``.md``), and saves the plot.

Example:
    >>> from dataclasses import dataclass, field
    >>> import tempfile
    >>> @dataclass
    ... class ToyConfig:
    ...     losses: list = field(default_factory=lambda: ["infonce", "macl"])
    ...     seeds: list = field(default_factory=lambda: [0, 1])
    ...     output_dir: str = tempfile.mkdtemp()
    ...     lr: float = 0.1
    ...     threads: int = 1
    ...     progress: bool = False
    ...     plot: bool = False
    >>> class Toy(Recipe):
    ...     name, config_class, metrics = "toy", ToyConfig, ("accuracy",)
    ...     def compute(self, cell):
    ...         score = 0.5 + 0.1 * (cell.method == "macl") + 0.01 * cell.seed
    ...         return {"metrics": {"accuracy": score}, "optimisation_steps": 1,
    ...                 "train_seconds": 0.0}
    >>> result = Toy(ToyConfig()).run()
    >>> round(result["summary"]["accuracy"]["toy"]["paired"]["macl"]["mean"], 6)
    10.0
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from adaptcl.recipes.template.config import result_settings
from adaptcl.recipes.template.errors import user_errors
from adaptcl.recipes.template.files import check_output_dir
from adaptcl.recipes.template.jobs import (
    JobOptions,
    JobRunner,
    add_job_arguments,
    check_combination,
)
from adaptcl.recipes.template.options import (
    add_common_arguments,
    add_config_arguments,
    config_kwargs,
)
from adaptcl.recipes.template.plots import save_plot
from adaptcl.recipes.template.provenance import code_version
from adaptcl.recipes.template.report import Report
from adaptcl.recipes.template.store import Cell, GridRun, run_grid
from adaptcl.recipes.template.torch_env import apply_thread_policy


class Recipe:
    """One recipe: a page of class attributes and a few methods the template calls in order.

    Class attributes: ``name`` (the sub-command and the recipe in every result file),
    ``config_class`` (the dataclass of settings; each field is an option ``--field-name``),
    ``presets`` (preset name -> classmethod of ``config_class``, shown as ``--preset``; the first
    is the default), ``choices`` / ``helps`` (per config field: allowed values, help text),
    ``loss_aliases`` (the paper's own names for registry losses), ``common`` (keyword arguments
    of :func:`~adaptcl.recipes.template.options.add_common_arguments`: which shared options the
    recipe takes), ``code`` (modules whose source determines a result), ``frameworks``
    (packages whose versions the result records), ``metrics`` (summarised, headline first),
    ``example`` (shown under ``--help``), ``plot_file`` / ``plot_layout``.

    The methods to fill in are :meth:`prepare`, :meth:`setup`, :meth:`cells`, :meth:`compute`,
    :meth:`report_spec` and :meth:`draw`; :meth:`identity`, :meth:`trains`, :meth:`reuses` and
    :meth:`config_from_args` have defaults that fit most recipes.
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type] = object
    presets: ClassVar[Mapping[str, str]] = {}
    choices: ClassVar[Mapping[str, Sequence[str]]] = {}
    helps: ClassVar[Mapping[str, str]] = {}
    #: the recipe's paper's own names for registry losses (GraphCL's ``graphcl`` is ``dcl``)
    loss_aliases: ClassVar[Mapping[str, str]] = {}
    common: ClassVar[Mapping[str, Any]] = {}
    code: ClassVar[Sequence[str]] = ()
    frameworks: ClassVar[Sequence[str]] = ()
    metrics: ClassVar[Sequence[str]] = ("accuracy",)
    example: ClassVar[str] = ""
    #: plot file name (under the output folder) and its panel layout
    plot_file: ClassVar[str] = ""
    plot_layout: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, config: Any, jobs: JobOptions | None = None) -> None:
        self.config = config
        #: how the grid's cells run (``--jobs``, ``--cluster``): in this process by default
        self.jobs = jobs or JobOptions()
        #: data fingerprints by dataset, filled in by :meth:`prepare`
        self.fingerprints: dict[str, Any] = {}
        self.data_root: Path | None = None
        #: what :meth:`run` did (records, reused, computed, diverged), once it has run
        self.grid: GridRun | None = None

    # ------------------------------------------------------------------ the command line

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """The shared options, ``--preset`` if the recipe has presets, one option per field."""
        defaults = cls.config_class()
        # a config without seeds (a deterministic evaluation) gets no --seeds: refused, not ignored
        common = {"seeds": getattr(defaults, "seeds", False)} | dict(cls.common)
        add_common_arguments(parser, output_dir=getattr(defaults, "output_dir", "results"),
                             **common)
        add_job_arguments(parser)
        if cls.presets:
            names = list(cls.presets)
            parser.add_argument("--preset", choices=names, default=names[0],
                                help=cls.helps.get("preset", "settings preset; options given "
                                                   "explicitly override it"))
        add_config_arguments(parser, cls.config_class, helps=cls.helps, choices=cls.choices,
                             loss_aliases=cls.loss_aliases)

    @classmethod
    def config_from_args(cls, args: argparse.Namespace) -> Any:
        """The config of a command line: the preset's, with every option given on top."""
        with user_errors():
            params = config_kwargs(cls.config_class, args)
            if cls.presets:
                return getattr(cls.config_class, cls.presets[args.preset])(**params)
            return cls.config_class(**params)

    @classmethod
    def main(cls, args: argparse.Namespace) -> int:
        """``adaptcl <name> ...``: run and print the table and where the files are."""
        with user_errors():
            jobs = JobOptions.from_args(args)
        recipe = cls(cls.config_from_args(args), jobs=jobs)
        result = recipe.run()
        if not result:  # a process that owns no result (a non-zero rank of a distributed run)
            return 0
        print(result["table_markdown"])
        outputs = result["outputs"]
        print(f"results: {outputs['json']}  table: {outputs['markdown']}"
              + (f"  plot: {result['plot']}" if result.get("plot") else ""))
        failed = recipe.grid.failed_error()
        if failed is not None:  # the others are stored and in the table; rerun retries these
            raise failed
        diverged = recipe.grid.diverged_error()
        if diverged is not None:  # the others are in the table; the run as a whole failed
            raise diverged
        return 0

    # ---------------------------------------------------------------- what a recipe fills in

    def prepare(self) -> None:
        """Check every input before any work or file write (``ValueError`` /
        ``FileNotFoundError`` become one-line user errors); fill :attr:`fingerprints`."""

    def setup(self) -> None:
        """Work every cell shares, done once after :meth:`prepare` and the thread policy and
        before the grid (a shared pre-trained encoder, say); by default nothing."""

    def cells(self) -> list[Cell]:
        """The grid: every (dataset, method, seed); by default one dataset named after the recipe."""
        cfg = self.config
        datasets = getattr(cfg, "datasets", None) or [self.name]
        return [Cell(d, m, s) for d in datasets for m in self.methods() for s in cfg.seeds]

    def methods(self) -> list[str]:
        """The table's columns in order (by default the config's ``losses``)."""
        return list(self.config.losses)

    def identity(self, cell: Cell) -> dict[str, Any]:
        """Everything that determines ``cell``'s record: settings, data fingerprint, code."""
        return {"settings": result_settings(self.config), "dataset": cell.dataset,
                "data": self.fingerprints.get(cell.dataset), "code": self._code}

    def compute(self, cell: Cell) -> dict[str, Any] | None:
        """The record of one cell: ``metrics``, ``optimisation_steps``, ``train_seconds``, ..."""
        raise NotImplementedError(f"{type(self).__name__} must define compute(cell)")

    def trains(self, cell: Cell) -> bool:
        """Whether ``cell`` must take an optimisation step to be a result."""
        return True

    def reuses(self) -> bool:
        """Whether a stored record of the same identity is reused (default); ``False``
        recomputes every cell (a recipe's ``--no-cache``), the old record set aside."""
        return True

    def report_spec(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~adaptcl.recipes.template.report.Report` beyond the
        ones the template fills in (``baseline``, ``header``, ``labels``, ``extra``,
        ``details``, ``drop``, ``scale``, ``stem``, ``table_rows``, ...; ``metrics``
        replaces the class attribute for this run)."""
        return {}

    def draw(self, grid: GridRun, axes: list[Any]) -> None:
        """Draw the recipe's figure on ``axes`` (only called when :attr:`plot_file` is set)."""

    # ------------------------------------------------------------------------ the driver

    def ready(self, threads: int | None) -> int | None:
        """What every cell needs, in this process: :meth:`prepare` (its errors one-line),
        the thread policy, the code version, :meth:`setup`. Returns the torch threads."""
        with user_errors():
            self.prepare()
        threads = apply_thread_policy(threads)
        self._code = code_version(*self.code) if self.code else None
        self.setup()
        return threads

    def run(self) -> dict[str, Any]:
        """Validate, compute what is missing or stale, write the result files and the plot."""
        cfg = self.config
        with user_errors():
            check_combination(self.jobs, cfg)
            check_output_dir(cfg.output_dir)
        self.ready(getattr(cfg, "threads", None))  # before any job: a job's setup() only loads
        out = Path(cfg.output_dir)
        report = self.make_report(out)
        cells = self.cells()
        runner = None
        if self.jobs.parallel:
            with user_errors():
                runner = JobRunner(self.jobs, self, threads=getattr(cfg, "threads", None),
                                   cells=len(cells), reuse=self.reuses())
        grid = run_grid(self.name, out, cells, identity=self.identity,
                        compute=self.compute, trains=self.trains, on_record=report.write,
                        progress_bar=getattr(cfg, "progress", True), reuse=self.reuses(),
                        jobs=runner)
        self.grid = grid
        if not grid.records:
            if grid.failed:
                raise grid.failed_error()
            if grid.diverged:  # nothing to tabulate
                raise grid.diverged_error()
            return {}  # every compute returned None: another process owns the result
        result = report.write(grid)
        if self.plot_file and getattr(cfg, "plot", True) and grid.records:
            result["plot"] = save_plot(out / self.plot_file,
                                       lambda axes: self.draw(grid, axes), **self.plot_layout)
        return result

    def make_report(self, out: Path) -> Report:
        cfg = self.config
        methods = self.methods()
        spec = {"baseline": methods[0], "frameworks": self.frameworks,
                "device": getattr(cfg, "device", None), "data_root": self.data_root,
                "data_fingerprint": self.fingerprints or None} | self.report_spec()
        metrics = list(spec.pop("metrics", self.metrics))
        datasets = list(dict.fromkeys(c.dataset for c in self.cells()))
        return Report(self.name, out, cfg, metrics=metrics, datasets=datasets, methods=methods,
                      **spec)

