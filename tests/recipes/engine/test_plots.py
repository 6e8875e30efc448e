"""A recipe's figure: every empty panel says why, inside its panel."""

from __future__ import annotations

from adaptcl.recipes.engine.plots import explain_empty, save_plot


def test_empty_plot_panel_says_why(tmp_path):
    panels = []

    def draw(axes):
        panels.extend(axes)
        axes[0].plot([0, 1], [1, 0], label="loss")
        explain_empty(axes[1], "kNN monitor off: --epochs 2 < --knn-every 5")

    path = save_plot(tmp_path / "p.png", draw, ncols=2)
    assert (tmp_path / "p.png").stat().st_size > 0 and path.endswith("p.png")
    assert [t.get_text() for t in panels[1].texts] == ["kNN monitor off: --epochs 2 < --knn-every 5"]
    assert len(panels[0].texts) == 0


def test_empty_panel_reason_stays_inside_its_panel(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    drawn = []
    reason = ("nothing logged: the runs took 3 optimisation steps and the loss is logged every "
              "10 (--logging-steps)")

    def draw(axes):
        explain_empty(axes[0], reason)
        axes[1].plot([0, 1])
        drawn.extend(axes)

    save_plot(tmp_path / "p.png", draw, ncols=2, figsize=(9, 3.6))
    figure = drawn[0].figure
    FigureCanvasAgg(figure)
    renderer = figure.canvas.get_renderer()
    text = drawn[0].texts[0].get_window_extent(renderer)
    panel = drawn[0].get_window_extent(renderer)
    assert panel.x0 <= text.x0 and text.x1 <= panel.x1
    assert drawn[0].texts[0].get_text().replace("\n", " ") == reason


def test_a_loss_keeps_its_colour_in_the_difference_panel(tmp_path):
    """The difference panel leaves the baseline out; each loss is still drawn in the colour it
    has in the mean ± std panel."""
    from matplotlib.colors import to_hex

    from adaptcl.recipes.engine.plots import draw_summaries

    rows = ["MUTAG", "PROTEINS"]
    values = {"dcl": (80.0, 81.0, 82.0), "macl": (81.0, 81.5, 83.0), "dystress": (79.0, 80.0, 82.5)}
    stats = {m: {"mean": sum(v) / 3, "std": 1.0} for m, v in values.items()}
    paired = {m: {"mean": 0.5, "ci95": [-0.5, 1.5]} for m in ("macl", "dystress")}
    summaries = {"accuracy": {row: {"methods": stats, "paired": paired} for row in rows}}
    panels = []

    def draw(axes):
        panels.extend(axes)
        draw_summaries(axes, summaries, rows, list(values), "dcl", ["accuracy"], ["datasets"],
                       numeric=False)

    save_plot(tmp_path / "p.png", draw, ncols=2)

    def colours(ax):
        return {c.get_label(): to_hex(c.lines[0].get_color()) for c in ax.containers}

    means, differences = colours(panels[0]), colours(panels[1])
    assert differences == {f"{m} − dcl": means[m] for m in ("macl", "dystress")}
