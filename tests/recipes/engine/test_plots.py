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
