"""The experiment engine: what every recipe shares, in layers that import only downward
(errors, files, provenance, torch_env, progress, loggers, plots; settings, sweep, options;
cells, config_file; store; job_options, job_cells, jobs; grid; summary, report; command_line;
recipe). Every module imports only the standard library at import time, so ``--help`` stays
fast.
"""

from adaptcl.recipes.engine.cells import Cell, RunLayout
from adaptcl.recipes.engine.command_line import terminal_text
from adaptcl.recipes.engine.errors import (
    CellConfigError,
    CellsFailedError,
    DivergedError,
    NonResultError,
    RecipeError,
    RunStopped,
    distributed_follower,
    note,
    require_steps,
    trained_embeddings,
    user_errors,
)
from adaptcl.recipes.engine.files import storage_error
from adaptcl.recipes.engine.recipe import Figure, Recipe
from adaptcl.recipes.engine.report import ReportSpec
from adaptcl.recipes.engine.settings import (
    at_least,
    check_settings,
    fraction,
    non_negative,
    open_fraction,
    positive,
    setting,
)
from adaptcl.recipes.engine.store import GridRun
from adaptcl.recipes.engine.sweep import Sweep

__all__ = ["Cell", "CellConfigError", "CellsFailedError", "DivergedError", "Figure", "GridRun", "NonResultError",
           "Recipe", "RecipeError", "ReportSpec", "RunLayout", "RunStopped", "Sweep", "at_least",
           "check_settings", "distributed_follower", "fraction", "non_negative", "note",
           "open_fraction", "positive", "require_steps", "setting", "storage_error",
           "terminal_text", "trained_embeddings", "user_errors"]
