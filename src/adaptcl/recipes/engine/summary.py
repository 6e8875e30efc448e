"""Summaries of a grid: mean ± std per table cell, paired differences with 95% t-intervals,
and the markdown tables that show them.

A row is a value of the recipe's first axis at one point of the sweep, a column a value of its
second axis. Every method is paired against the baseline over the seeds both have; every value
of a swept setting against its first value, same method and row. One seed gives a value, never
a spread or an interval.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from adaptcl.recipes.engine.cells import Cell
from adaptcl.recipes.engine.files import markdown_table


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population standard deviation (as the GraphCL/MACL tables report)."""
    if not values:
        raise ValueError("mean_std needs at least one value")
    n = len(values)
    mean = sum(values) / n
    return mean, (sum((v - mean) ** 2 for v in values) / n) ** 0.5


def paired_difference(method: Mapping[int, float], baseline: Mapping[int, float]
                      ) -> dict[str, Any] | None:
    """Mean of ``method - baseline`` over their common seeds with a 95% Student-t interval
    (sample standard deviation, n - 1 degrees of freedom; one common seed: no interval)."""
    seeds = sorted(set(method) & set(baseline))
    if not seeds:
        return None
    diffs = [float(method[s]) - float(baseline[s]) for s in seeds]
    n = len(diffs)
    mean = sum(diffs) / n
    out: dict[str, Any] = {"mean": mean, "n": n, "seeds": seeds, "ci95": None, "sd": None}
    if n > 1:
        from scipy.stats import t

        sd = (sum((d - mean) ** 2 for d in diffs) / (n - 1)) ** 0.5
        half = float(t.ppf(0.975, n - 1)) * sd / n**0.5
        out.update(sd=sd, ci95=[mean - half, mean + half])
    return out


def point_text(point: Sequence[tuple[str, Any]]) -> str:
    """``temperature=0.1, alpha=0.5`` (empty without a sweep)."""
    return ", ".join(f"{k}={'none' if v is None else v}" for k, v in point)


def row_label(cell: Cell) -> str:
    """The table row of ``cell``: its first axis's value, and its point of the sweep."""
    return ", ".join(filter(None, (str(cell.row), point_text(cell.point))))


def _stats(values: Mapping[int, float], lost: Sequence[int]) -> dict[str, Any]:
    if values:
        mean, std = mean_std(list(values.values()))
        stats = {"mean": mean, "std": std, "n": len(values), "seeds": list(values),
                 "values": list(values.values())}
    else:
        stats = {"mean": None, "std": None, "n": 0, "seeds": [], "values": []}
    if lost:
        stats["diverged"] = sorted(lost)
    return stats


def _summarize(records: Mapping[Cell, Mapping[str, Any]], metric: str, scale: float,
               diverged: Sequence[Cell], group: Callable[[Cell], Hashable],
               member: Callable[[Cell], Any], groups: Sequence[Hashable],
               members: Sequence[Any], baseline: Any, every: bool
               ) -> dict[Hashable, tuple[dict, dict]]:
    """Per group (``groups``, then those of the records): ``(stats, paired)`` by member, each
    member's ``metric * scale`` by seed paired against ``baseline``'s; ``every``: a member with
    neither value nor divergence has empty stats rather than none."""
    seeds: dict[tuple, dict[int, float]] = {}
    for cell, record in records.items():
        value = record["metrics"].get(metric)
        if value is not None:
            seeds.setdefault((group(cell), member(cell)), {})[cell.seed] = scale * float(value)
    out = {}
    for key in dict.fromkeys([*groups, *(group(c) for c in [*records, *diverged])]):
        stats, paired = {}, {}
        base = dict(sorted(seeds.get((key, baseline), {}).items()))
        for name in members:
            values = dict(sorted(seeds.get((key, name), {}).items()))
            lost = [c.seed for c in diverged if group(c) == key and member(c) == name]
            if values or lost or every:
                stats[name] = _stats(values, lost)
            if name != baseline and values and base:
                paired[name] = paired_difference(values, base)
        out[key] = (stats, paired)
    return out


def summarize(records: Mapping[Cell, Mapping[str, Any]], metric: str, *,
              methods: Sequence[str], baseline: str | None = None, scale: float = 1.0,
              diverged: Sequence[Cell] = (), rows: Sequence[str] = ()
              ) -> dict[str, dict[str, Any]]:
    """Per table row (:func:`row_label`, in the order of ``rows`` and then of the records):
    ``{"methods": {method: {"mean", "std", "n", "seeds", "values"[, "diverged"]}},
    "paired": {method: paired difference to baseline}}`` of ``metrics[metric] * scale``.
    The seeds of ``diverged`` cells are listed per method, outside every mean."""
    rows_of = _summarize(records, metric, scale, diverged, row_label, lambda c: c.column, rows,
                         methods, object() if baseline is None else baseline, every=False)
    return {row: {"methods": stats, "paired": paired} for row, (stats, paired) in rows_of.items()}


def summarize_axis(records: Mapping[Cell, Mapping[str, Any]], metric: str, axis: str,
                   values: Sequence[Any], *, scale: float = 1.0,
                   diverged: Sequence[Cell] = ()) -> list[dict[str, Any]]:
    """Along the swept setting ``axis``: for each row, method and point of the other swept
    settings, each value's ``mean ± std`` and its paired difference to the first value."""
    def rest(cell: Cell) -> tuple:
        return (cell.row, cell.column, tuple((k, v) for k, v in cell.point if k != axis))

    groups = _summarize(records, metric, scale, diverged, rest, lambda c: getattr(c, axis), (),
                        values, values[0], every=True)
    return [{"row": row, "method": method, "point": dict(other),
             "values": {str(v): s for v, s in stats.items()},
             "paired": {str(v): d for v, d in paired.items()}}
            for (row, method, other), (stats, paired) in groups.items()]


def format_mean_std(stats: Mapping[str, Any] | None, digits: int = 2) -> str:
    """``mean ± std (n=k)``; one seed gives its value alone; with diverged seeds ``(n=k,
    1 diverged)``, or ``diverged (seeds 0, 1)`` when no seed finished."""
    if not stats:
        return "-"
    lost = stats.get("diverged") or []
    if not stats["n"]:
        return f"diverged (seed{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost))})"
    tail = f", {len(lost)} diverged" if lost else ""
    if stats["n"] == 1:
        return f"{stats['mean']:.{digits}f}" + (f" ({tail[2:]})" if tail else "")
    return f"{stats['mean']:.{digits}f} ± {stats['std']:.{digits}f} (n={stats['n']}{tail})"


def format_difference(diff: Mapping[str, Any] | None, digits: int = 2) -> str:
    """``+mean [lo, hi] (n=k)``; one common seed gives the difference alone."""
    if not diff:
        return "-"
    if diff["ci95"] is None:
        return f"{diff['mean']:+.{digits}f}"
    lo, hi = diff["ci95"]
    return f"{diff['mean']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}] (n={diff['n']})"


def difference_header(name: str, against: str, diffs: Sequence[Mapping[str, Any] | None]) -> str:
    """``name − against [95% CI]``, without ``[95% CI]`` when no difference has an interval."""
    with_ci = any(d and d.get("ci95") is not None for d in diffs)
    return f"{name} − {against}" + (" [95% CI]" if with_ci else "")


def summary_table(summary: Mapping[str, Mapping[str, Any]], *, methods: Sequence[str],
                  baseline: str | None = None, labels: Mapping[str, str] | None = None,
                  row_labels: Mapping[str, str] | None = None,
                  extra: Callable[[str], Mapping[str, str]] | None = None,
                  digits: int = 2, row_header: str = "dataset") -> str:
    """Markdown: a row per summary row, ``mean ± std (n)`` per method, then each method minus
    the baseline (mean paired difference and its 95% t-interval), then ``extra(row)``."""
    labels = dict(labels or {})
    others = [m for m in methods if m != baseline] if baseline is not None else []
    heads = {m: difference_header(labels.get(m, m), labels.get(baseline, baseline),
                                  [e["paired"].get(m) for e in summary.values()])
             for m in others}
    rows = []
    for name, entry in summary.items():
        head, sep, point = name.partition(", ")  # a swept row: "cifar10, method=moco"
        row: dict[str, Any] = {row_header: (row_labels or {}).get(head, head) + sep + point}
        for method in methods:
            row[labels.get(method, method)] = format_mean_std(entry["methods"].get(method),
                                                              digits)
        for method in others:
            row[heads[method]] = format_difference(entry["paired"].get(method), digits)
        if extra is not None:
            row.update(extra(name))
        rows.append(row)
    return markdown_table(rows)


def axis_table(entries: Sequence[Mapping[str, Any]], axis: str, values: Sequence[Any], *,
               labels: Mapping[str, str] | None = None, digits: int = 2,
               row_header: str = "dataset", column_header: str = "method") -> str:
    """Markdown of :func:`summarize_axis`: a row per (row, method, other settings), a column
    per value of ``axis``, then each value minus the first."""
    labels = dict(labels or {})
    heads = {str(v): difference_header(f"{axis}={v}", f"{axis}={values[0]}",
                                       [e["paired"].get(str(v)) for e in entries])
             for v in values[1:]}
    rows = []
    for entry in entries:
        row: dict[str, Any] = {row_header: entry["row"],
                               column_header: labels.get(entry["method"], entry["method"])}
        if entry["point"]:
            row["other settings"] = point_text(list(entry["point"].items()))
        for value in values:
            row[f"{axis}={value}"] = format_mean_std(entry["values"].get(str(value)), digits)
        for value, head in heads.items():
            row[head] = format_difference(entry["paired"].get(value), digits)
        rows.append(row)
    return markdown_table(rows)
