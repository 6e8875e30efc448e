"""Summaries: paired differences with 95% t-intervals, tables, one seed as a value alone, and
the summary along a swept setting."""

from __future__ import annotations

import pytest

from adaptcl.recipes.engine.summary import (
    axis_table,
    format_difference,
    format_mean_std,
    paired_difference,
    summarize,
    summarize_axis,
    summary_table,
)
from tests.recipes.engine._toy import cell as Cell


def _record(acc: float) -> dict:
    return {"metrics": {"acc": acc}, "optimisation_steps": 1, "train_seconds": 0.0}


def test_paired_difference_matches_scipy_paired_t_interval():
    from scipy.stats import ttest_rel

    adaptive = {0: 88.0, 1: 86.5, 2: 87.9, 3: 89.1}
    base = {0: 86.0, 1: 86.0, 2: 86.8, 3: 87.0, 4: 85.0}  # seed 4 has no pair
    diff = paired_difference(adaptive, base)
    ci = ttest_rel([adaptive[s] for s in range(4)], [base[s] for s in range(4)]
                   ).confidence_interval(0.95)
    assert diff["n"] == 4 and diff["seeds"] == [0, 1, 2, 3]
    assert diff["mean"] == pytest.approx(1.425)
    assert diff["ci95"] == pytest.approx([ci.low, ci.high])
    one = paired_difference({0: 1.0}, {0: 0.5})
    assert one["mean"] == 0.5 and one["ci95"] is None


def test_summary_table_has_mean_std_and_paired_difference():
    records = {Cell("MUTAG", m, s): _record(a) for m, accs in
               {"graphcl": [0.80, 0.82], "macl": [0.84, 0.85]}.items()
               for s, a in enumerate(accs)}
    summary = summarize(records, "acc", methods=["graphcl", "macl"], baseline="graphcl",
                        scale=100)
    assert summary["MUTAG"]["methods"]["macl"]["mean"] == pytest.approx(84.5)
    assert summary["MUTAG"]["methods"]["graphcl"]["std"] == pytest.approx(1.0)  # population
    assert summary["MUTAG"]["paired"]["macl"]["mean"] == pytest.approx(3.5)
    table = summary_table(summary, methods=["graphcl", "macl"], baseline="graphcl",
                          labels={"graphcl": "GraphCL", "macl": "MACL"})
    assert "81.00 ± 1.00 (n=2)" in table and "MACL − GraphCL [95% CI]" in table
    assert "+3.50 [" in table


def test_one_seed_is_a_value_with_no_spread_and_no_interval():
    records = {Cell("d", "base", 0): _record(0.973), Cell("d", "new", 0): _record(0.96)}
    summary = summarize(records, "acc", methods=["base", "new"], baseline="base", scale=100)
    assert format_mean_std(summary["d"]["methods"]["new"], 1) == "96.0"
    assert format_difference(summary["d"]["paired"]["new"], 1) == "-1.3"
    table = summary_table(summary, methods=["base", "new"], baseline="base")
    assert "±" not in table and "CI" not in table and "n=1" not in table
    assert "| d | 97.30 | 96.00 | -1.30 |" in table and "new − base |" in table


def test_diverged_seeds_are_named_outside_every_mean():
    stats = {"mean": 81.0, "std": 1.0, "n": 2, "diverged": [2]}
    assert format_mean_std(stats) == "81.00 ± 1.00 (n=2, 1 diverged)"
    assert format_mean_std({"mean": 81.0, "std": 0.0, "n": 1, "diverged": [2]}) == \
        "81.00 (1 diverged)"
    assert format_mean_std({"n": 0, "diverged": [0, 1]}) == "diverged (seeds 0, 1)"
    records = {Cell("d", "m", 0): _record(0.5)}
    summary = summarize(records, "acc", methods=["m"], diverged=[Cell("d", "m", 1),
                                                                 Cell("e", "m", 0)])
    assert summary["d"]["methods"]["m"]["diverged"] == [1]
    assert summary["e"]["methods"]["m"] == {"mean": None, "std": None, "n": 0, "seeds": [],
                                            "values": [], "diverged": [0]}


def test_swept_settings_make_rows_and_a_summary_along_each():
    records = {}
    for lr, base in ((0.1, 0.70), (0.2, 0.75)):
        for width in (4, 8):
            for seed in range(3):
                value = base + width / 1000 + seed / 100
                records[Cell("d", "m", seed, lr=lr, width=width)] = _record(value)
    summary = summarize(records, "acc", methods=["m"], scale=100)
    assert list(summary) == ["d, lr=0.1, width=4", "d, lr=0.1, width=8", "d, lr=0.2, width=4",
                             "d, lr=0.2, width=8"]
    along = summarize_axis(records, "acc", "lr", [0.1, 0.2], scale=100)
    assert [(e["row"], e["method"], e["point"]) for e in along] == [("d", "m", {"width": 4}),
                                                                    ("d", "m", {"width": 8})]
    diff = along[0]["paired"]["0.2"]
    assert diff["mean"] == pytest.approx(5.0) and diff["n"] == 3
    assert diff["ci95"] == pytest.approx([5.0, 5.0])
    table = axis_table(along, "lr", [0.1, 0.2])
    assert "| dataset | method | other settings | lr=0.1 | lr=0.2 | lr=0.2 − lr=0.1 [95% CI] |" \
        in table
    assert "| d | m | width=4 | 71.40 ± 0.82 (n=3) | 76.40 ± 0.82 (n=3) | +5.00 [+5.00, +5.00] " \
        "(n=3) |" in table
