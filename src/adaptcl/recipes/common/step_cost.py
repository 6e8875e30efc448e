"""What a training step of a Lightning recipe costs, as its report says it: the mean seconds
per step and the peak GPU memory of a step, per column (from
:class:`~adaptcl.adapters.lightning.trainer.StepMeter`'s numbers in each record)."""

from __future__ import annotations

from typing import Any

from adaptcl.recipes.engine.cells import Cell


def step_cost(meter: Any) -> dict[str, Any]:
    """A cell record's ``step_seconds`` and ``peak_gpu_memory_bytes`` (``None`` on the CPU)."""
    return {"step_seconds": meter.seconds_per_step, "peak_gpu_memory_bytes": meter.peak_bytes}


def step_note(records: dict[Cell, dict[str, Any]]) -> str:
    """The markdown note of each column's seconds per training step (mean over its seeds) and
    peak GPU memory of a step (the largest; left out on the CPU); records written before
    steps were measured are left out."""
    seconds: dict[str, list[float]] = {}
    peaks: dict[str, list[int]] = {}
    for cell, record in records.items():
        column = "/".join(cell.parts()[1:-1])
        if record.get("step_seconds") is not None:
            seconds.setdefault(column, []).append(record["step_seconds"])
        if record.get("peak_gpu_memory_bytes") is not None:
            peaks.setdefault(column, []).append(record["peak_gpu_memory_bytes"])
    if not seconds:
        return ""
    times = ", ".join(f"{name} {sum(v) / len(v):.3g}" for name, v in seconds.items())
    memory = ", ".join(f"{name} {max(v) / 2**20:,.0f} MiB" for name, v in peaks.items())
    peak = f"; peak GPU memory of a step: {memory}" if memory else ""
    return f"Seconds per training step (mean over seeds): {times}{peak}.\n\n"
