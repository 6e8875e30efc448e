"""A toy recipe for the engine's tests: no training, and test-only hooks read from the
environment (``--jobs`` runs cells in processes of their own, started by submitit, which
inherit it).

``ADAPTCL_TOY_FAIL``: the label of a cell whose compute raises ``RuntimeError("boom ...")``;
``ADAPTCL_TOY_DIVERGE``: one whose compute raises ``DivergedError``; ``ADAPTCL_TOY_BLOCK``: a
seed from which each compute waits (up to 60 s) for the file ``ADAPTCL_TOY_EVENTS/go``. Each
compute writes ``ADAPTCL_TOY_EVENTS/start-<label>`` and, when it returns, ``end-<label>``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptcl.recipes.engine import (
    Cell,
    DivergedError,
    Recipe,
    ReportSpec,
    check_settings,
    options,
    positive,
    setting,
)


def cell(dataset: str = "d", method: str = "m", seed: int = 0, **point: Any) -> Cell:
    """A cell of the toy grid (axes ``dataset`` and ``loss``)."""
    return Cell((("dataset", dataset), ("loss", method)), seed, tuple(point.items()))


@dataclass
class ToyConfig:
    """A toy recipe's settings."""

    losses: list[str] = setting(factory=lambda: ["base"], axis="loss", help="losses")
    seeds: list[int] = options.seeds([0, 1, 2, 3])
    output_dir: str = options.output_dir("toy")
    lr: float = setting(0.1, check=positive, help="learning rate")
    width: int = setting(4, check=positive, help="a second sweepable setting")
    threads: int | None = options.threads()
    progress: bool = options.progress()

    def __post_init__(self) -> None:
        check_settings(self)


class ToyRecipe(Recipe):
    name, config_class, description = "toy", ToyConfig, "a toy recipe"
    presets = {"default": {}, "fast": {"lr": 0.5}}
    example = "adaptcl toy --lr 0.1 0.2"

    def rows(self) -> list[str]:
        return ["d"]

    def compute(self, cell: Cell, config: ToyConfig) -> dict[str, Any]:
        label = cell.label().replace("/", "_")
        events = Path(os.environ.get("ADAPTCL_TOY_EVENTS", self.layout.root))
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
        return {"metrics": {"accuracy": 0.5 + config.lr * cell.seed + config.width / 100},
                "optimisation_steps": 1, "train_seconds": 0.0, "pid": os.getpid()}

    def report_spec(self) -> ReportSpec:
        return ReportSpec(metrics=("accuracy",), baseline="base")


RECIPE = ToyRecipe
