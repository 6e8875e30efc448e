"""A recipe's figure: drawn by the recipe, saved atomically, every empty panel saying why; the
figure of a summary over a setting (mean ± std per loss and the paired difference)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from adaptcl.recipes.engine.files import save_figure_atomic


def save_plot(path: str | os.PathLike, draw: Callable[[Any], None], *, title: str = "",
              figsize: tuple[float, float] = (9.0, 3.6), ncols: int = 1) -> str:
    """Draw with ``draw(axes)`` and save atomically; a panel left empty shows the reason
    :func:`explain_empty` gave it (or a generic one)."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=figsize, squeeze=False)
    axes = list(axes[0])
    draw(axes)
    fig.tight_layout()  # the panels' final widths, which the reasons are wrapped to
    for ax in axes:
        if not ax.lines and not ax.collections and not ax.patches and not ax.images:
            reason = getattr(ax, "_adaptcl_empty_reason", None) or "no data recorded for this panel"
            # wrapped to the panel (matplotlib's wrap=True wraps at the figure's edge); an
            # average character of the default sans-serif is ~0.55 em, with a margin
            chars = int(0.85 * (ax.get_position().width * fig.get_figwidth()) * 72 / (0.55 * 9))
            ax.text(0.5, 0.5, textwrap.fill(reason, width=max(10, chars)), ha="center",
                    va="center", fontsize=9, transform=ax.transAxes)
        elif ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return str(save_figure_atomic(fig, path))


def explain_empty(ax: Any, reason: str) -> None:
    """Mark a plot panel as intentionally empty, with the reason shown in the figure."""
    ax._adaptcl_empty_reason = reason


def draw_summaries(axes: list[Any], summaries: dict[str, Any], rows: list[str],
                   methods: list[str], baseline: str | None, metrics: list[str],
                   by: list[str], numeric: bool = True) -> None:
    """Each metric's summary over ``rows`` (mean ± std per method, a panel each) and, on a last
    panel when there is one, the head metric's paired difference to ``baseline`` with its 95%
    CI; ``by`` names the x axis; ``numeric=False``: the rows are categories (markers only)."""
    ticks = dict(xlabel=", ".join(by), xticks=list(range(len(rows))),
                 xticklabels=[r.split("=")[-1] if len(by) == 1 else r for r in rows])
    style = {} if numeric else {"linestyle": "none"}
    if not numeric:
        for ax in axes:
            ax.tick_params(axis="x", labelrotation=25)

    def series(ax, names, point, marker, label) -> None:
        """An error-bar line per name, side by side at each row, in the name's colour in every
        panel (the difference panel has no baseline); ``point(name, row)`` is ``(value, error
        below, error above)`` or ``None``."""
        for i, name in enumerate(names):
            points = [(x + (i - (len(names) - 1) / 2) * 0.12, p) for x, row in enumerate(rows)
                      if (p := point(name, row)) is not None]
            if points:
                ax.errorbar([x for x, _ in points], [p[0] for _, p in points],
                            yerr=[[p[1] for _, p in points], [p[2] for _, p in points]],
                            marker=marker, capsize=3, label=label(name),
                            color=f"C{methods.index(name) % 10}", **style)

    for ax, metric in zip(axes, metrics, strict=False):
        def spread(method, row, metric=metric):
            stats = summaries[metric][row]["methods"].get(method)
            return (stats["mean"], stats["std"], stats["std"]) if stats else None

        series(ax, methods, spread, "o", str)
        ax.set(title=f"{metric} (mean ± std over seeds)", **ticks)
    if len(axes) > len(metrics):
        ax, head = axes[-1], metrics[0]

        def interval(method, row):
            diff = summaries[head][row]["paired"].get(method)
            if not diff or diff["ci95"] is None:
                return None
            return diff["mean"], diff["mean"] - diff["ci95"][0], diff["ci95"][1] - diff["mean"]

        series(ax, [m for m in methods if m != baseline], interval, "s",
               lambda method: f"{method} − {baseline}")
        if ax.lines:
            ax.axhline(0.0, color="grey", linewidth=0.8, linestyle="--")
        else:
            explain_empty(ax, "no paired difference with an interval (needs two or more "
                              "common seeds)")
        ax.set(title=f"{head}: paired difference, 95% CI", **ticks)
