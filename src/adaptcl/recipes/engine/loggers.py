"""``--logger``: training curves as CSV or TensorBoard: Lightning's own loggers for the Lightning
recipes, :class:`MetricLogger` for the demo's loop and the sentence-transformers trainer's
history."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adaptcl.recipes.engine.errors import RecipeError

LOGGERS = ("none", "csv", "tensorboard")


def _check(kind: str) -> None:
    if kind not in LOGGERS:
        raise RecipeError(f"--logger must be one of {', '.join(LOGGERS)}, got {kind!r}")


class MetricLogger:
    """Scalar curves by step: ``none``, ``csv`` (``<log_dir>/metrics.csv``: step, name, value)
    or ``tensorboard`` (event files in ``log_dir``); other values are skipped."""

    def __init__(self, kind: str, log_dir: str | os.PathLike) -> None:
        _check(kind)
        self.kind, self.log_dir = kind, Path(log_dir)
        self._writer: Any = None
        self._csv: Any = None
        if kind == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise RecipeError("--logger tensorboard needs the tensorboard package: "
                                  "pip install 'adaptcl[recipes]'") from err
            self._writer = SummaryWriter(log_dir=str(self.log_dir))
        elif kind == "csv":
            self.log_dir.mkdir(parents=True, exist_ok=True)
            path = self.log_dir / "metrics.csv"
            new = not path.exists()
            self._csv = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            if new:
                self._csv.write("step,name,value\n")

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for name, value in metrics.items():
            if value is None or isinstance(value, (list, tuple, dict, str)):
                continue
            value = float(value)
            if self._writer is not None:
                self._writer.add_scalar(name, value, step)
            elif self._csv is not None:
                self._csv.write(f"{step},{name},{value!r}\n")

    def close(self) -> None:
        for handle in (self._writer, self._csv):
            if handle is not None:
                handle.close()

    def __enter__(self) -> MetricLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def lightning_logger(kind: str, log_dir: str | os.PathLike, name: str = ""):
    """Lightning's own logger for ``--logger kind`` (``False`` for ``none``); also quiets
    Lightning's start-up lines ("GPU available: ...") that would repeat for every cell."""
    import logging

    logging.getLogger("pytorch_lightning").setLevel(logging.WARNING)
    _check(kind)
    if kind == "none":
        return False
    # version "": the files go straight into log_dir (a cell's own folder), no version_N
    from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger

    return (CSVLogger if kind == "csv" else TensorBoardLogger)(str(log_dir), name=name,
                                                              version="")
