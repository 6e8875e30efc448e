"""The experiment engine: what every recipe shares, in layers that import only downward.

* :mod:`~adaptcl.recipes.engine.errors`, :mod:`~adaptcl.recipes.engine.files`,
  :mod:`~adaptcl.recipes.engine.provenance`, :mod:`~adaptcl.recipes.engine.torch_env`,
  :mod:`~adaptcl.recipes.engine.progress`, :mod:`~adaptcl.recipes.engine.loggers`,
  :mod:`~adaptcl.recipes.engine.plots`: one-line errors, atomic files, what produced a result,
  torch set-up, progress, training curves, figures;
* :mod:`~adaptcl.recipes.engine.settings`: a config's fields declared once (help, checks,
  identity, sweeps, axes); :class:`Sweep`, the settings of a run;
* :mod:`~adaptcl.recipes.engine.cells`: :class:`Cell` and :class:`RunLayout`, every path
  under ``--output-dir``;
* :mod:`~adaptcl.recipes.engine.store`: records kept with their identity, locks, live runs;
* :mod:`~adaptcl.recipes.engine.jobs`: ``--jobs`` / ``--cluster``: cells as submitit jobs;
* :mod:`~adaptcl.recipes.engine.grid`: :func:`run_grid`, here or as jobs;
* :mod:`~adaptcl.recipes.engine.summary`, :mod:`~adaptcl.recipes.engine.report`: paired CIs,
  tables, result files;
* :mod:`~adaptcl.recipes.engine.command_line`: the command line and config file (tyro);
* :mod:`~adaptcl.recipes.engine.recipe`: :class:`Recipe`, the base every recipe fills in.

Every module imports only the standard library at import time, so ``--help`` stays fast.
"""

from adaptcl.recipes.engine.cells import Cell, RunLayout
from adaptcl.recipes.engine.errors import (
    CellsFailedError,
    DivergedError,
    NonResultError,
    RecipeError,
    RunStopped,
    note,
    require_steps,
    trained_embeddings,
    user_errors,
)
from adaptcl.recipes.engine.recipe import Figure, Recipe
from adaptcl.recipes.engine.report import ReportSpec
from adaptcl.recipes.engine.settings import (
    Sweep,
    at_least,
    check_settings,
    fraction,
    non_negative,
    open_fraction,
    positive,
    setting,
)
from adaptcl.recipes.engine.store import GridRun, distributed_follower

__all__ = ["Cell", "CellsFailedError", "DivergedError", "Figure", "GridRun", "NonResultError",
           "Recipe", "RecipeError", "ReportSpec", "RunLayout", "RunStopped", "Sweep", "at_least",
           "check_settings", "distributed_follower", "fraction", "non_negative", "note",
           "open_fraction", "positive", "require_steps", "setting", "trained_embeddings",
           "user_errors"]
