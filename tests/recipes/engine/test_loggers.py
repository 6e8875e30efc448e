"""``--logger``: training curves as TensorBoard events or CSV."""

from __future__ import annotations

import pytest

from adaptcl.recipes.engine.errors import RecipeError
from adaptcl.recipes.engine.loggers import MetricLogger, lightning_logger


def test_tensorboard_logger_writes_events_tensorboard_reads(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricLogger("tensorboard", tmp_path / "tb") as log:
        for step in range(3):
            log.log({"train/loss": 1.0 / (step + 1), "train/temperature": 0.2, "note": "x"}, step)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["train/loss", "train/temperature"]
    assert [round(e.value, 4) for e in events.Scalars("train/loss")] == [1.0, 0.5, 0.3333]


def test_csv_logger_and_unknown_logger(tmp_path):
    with MetricLogger("csv", tmp_path) as log:
        log.log({"loss": 2.0}, 7)
    assert (tmp_path / "metrics.csv").read_text().splitlines() == ["step,name,value", "7,loss,2.0"]
    with pytest.raises(RecipeError, match="--logger"):
        MetricLogger("wandb", tmp_path)


def test_lightning_logger_by_name(tmp_path):
    assert lightning_logger("none", tmp_path) is False
    assert type(lightning_logger("csv", tmp_path)).__name__ == "CSVLogger"
    with pytest.raises(RecipeError, match="--logger"):
        lightning_logger("wandb", tmp_path)
