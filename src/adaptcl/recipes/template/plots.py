"""A recipe's figure: drawn by the recipe, saved atomically, every empty panel saying why."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from adaptcl.recipes.template.files import save_figure_atomic


def save_plot(path: str | os.PathLike, draw: Callable[[Any], None], *, title: str = "",
              figsize: tuple[float, float] = (9.0, 3.6), ncols: int = 1) -> str:
    """Draw with ``draw(axes)`` and save atomically; every panel left empty says why.

    ``draw`` receives the list of axes and may set ``ax._adaptcl_empty_reason`` (a string) on a
    panel it could not fill; a panel with nothing drawn shows that reason (or a generic one).
    """
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
            ax.text(0.5, 0.5, _fit(reason, ax, fontsize=9), ha="center", va="center",
                    fontsize=9, transform=ax.transAxes)
        elif ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return str(save_figure_atomic(fig, path))


def _fit(text: str, ax: Any, *, fontsize: float) -> str:
    """``text`` wrapped to the panel's width (matplotlib's ``wrap=True`` wraps at the figure's
    edge, so a long reason ran into the next panel)."""
    import textwrap

    width_inches = ax.get_position().width * ax.figure.get_figwidth()
    # an average character of the default sans-serif is ~0.55 em; keep a margin
    chars = max(10, int(0.85 * width_inches * 72 / (0.55 * fontsize)))
    return textwrap.fill(text, width=chars)


def explain_empty(ax: Any, reason: str) -> None:
    """Mark a plot panel as intentionally empty, with the reason shown in the figure."""
    ax._adaptcl_empty_reason = reason
