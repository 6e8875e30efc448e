"""A toy recipe for the --jobs tests: no training, and test-only hooks read from the environment
(the jobs are processes of their own, started by submitit, which inherit it).

``ADAPTCL_TOY_FAIL``: the label of a cell whose compute raises ``RuntimeError("boom ...")``;
``ADAPTCL_TOY_DIVERGE``: one whose compute raises ``DivergedError``; ``ADAPTCL_TOY_BLOCK``: a
seed from which each compute waits (up to 60 s) for the file ``ADAPTCL_TOY_EVENTS/go``. Each
compute writes ``ADAPTCL_TOY_EVENTS/start-<label>`` and, when it returns, ``end-<label>``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptcl.recipes.template.errors import DivergedError
from adaptcl.recipes.template.recipe import Recipe
from adaptcl.recipes.template.store import Cell


@dataclass
class ToyConfig:
    losses: list[str] = field(default_factory=lambda: ["base"])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3])
    output_dir: str = "toy"
    lr: float = 0.1
    threads: int | None = 1
    progress: bool = False
    plot: bool = False


class ToyRecipe(Recipe):
    name, config_class, metrics = "toy", ToyConfig, ("accuracy",)
    common = {"data_root": False, "device": False, "logger": False}

    def compute(self, cell: Cell) -> dict[str, Any]:
        label = cell.label().replace("/", "_")
        events = Path(os.environ.get("ADAPTCL_TOY_EVENTS", self.config.output_dir))
        events.mkdir(parents=True, exist_ok=True)
        (events / f"start-{label}").touch()
        if os.environ.get("ADAPTCL_TOY_FAIL") == cell.label():
            raise RuntimeError(f"boom in {cell.label()}")
        if os.environ.get("ADAPTCL_TOY_DIVERGE") == cell.label():
            raise DivergedError(f"{cell.label()}: loss is nan", step=3, loss=float("nan"))
        block = os.environ.get("ADAPTCL_TOY_BLOCK")
        if block is not None and cell.seed >= int(block):
            deadline = time.monotonic() + 60
            while not (events / "go").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        (events / f"end-{label}").touch()
        return {"metrics": {"accuracy": 0.5 + self.config.lr * cell.seed},
                "optimisation_steps": 1, "train_seconds": 0.0, "pid": os.getpid()}


RECIPE = ToyRecipe
