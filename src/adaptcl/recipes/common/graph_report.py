"""What the graph recipes' reports share: the paper's columns beside ours, and the pre-training
curves (alignment and temperature per step)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adaptcl.recipes.engine.plots import explain_empty


def paper_columns(table: dict[str, dict[str, tuple[float, float]]],
                  labels: dict[str, str]) -> Callable[[str], dict[str, str]]:
    """The table's extra columns: row -> the paper's ``mean ± std`` of each method of
    ``labels`` (method -> column), ``-`` where the paper did not report the row's dataset."""
    def columns(row: str) -> dict[str, str]:
        paper = table.get(row.split(",", 1)[0])
        return {column: "{:.2f} ± {:.2f}".format(*paper[method]) if paper else "-"
                for method, column in labels.items()}

    return columns


def draw_pretraining_curves(axes: Any, curves: dict[str, dict[str, list[float]]], *,
                            empty: str = "") -> None:
    """Alignment (``axes[0]``) and temperature (``axes[1]``) per pre-training step of each run
    of ``curves`` (label -> step statistics); an empty panel says ``empty``."""
    keys = ("alignment", "temperature")
    for label, stats in curves.items():
        for ax, key in zip(axes, keys, strict=True):
            if (stats or {}).get(key):
                ax.plot(stats[key], lw=1, label=label)
    for ax, name in zip(axes, ("alignment A (mean positive cosine)", "temperature"), strict=True):
        ax.set(xlabel="pre-training step", ylabel=name)
        if empty:
            explain_empty(ax, empty)
