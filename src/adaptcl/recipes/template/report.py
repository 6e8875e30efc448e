"""Summaries (mean +- std, paired differences with 95% t-intervals), tables and the result files."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaptcl.recipes.template.errors import RecipeError
from adaptcl.recipes.template.files import (
    markdown_table,
    mean_std,
    write_json_atomic,
    write_text_atomic,
)
from adaptcl.recipes.template.provenance import environment

if TYPE_CHECKING:
    from adaptcl.recipes.template.store import Cell, GridRun


def paired_difference(method: Mapping[int, float], baseline: Mapping[int, float]
                      ) -> dict[str, Any] | None:
    """Mean of ``method - baseline`` over their common seeds with a 95% Student-t interval.

    The interval uses the sample standard deviation of the differences (n - 1 degrees of
    freedom); with one common seed there is a difference but no interval.
    """
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


def summarize(records: Mapping[Cell, Mapping[str, Any]], metric: str, *,
              datasets: Sequence[str], methods: Sequence[str], baseline: str | None = None,
              scale: float = 1.0, diverged: Sequence[Cell] = ()) -> dict[str, dict[str, Any]]:
    """Per dataset: mean +- population std of ``metrics[metric] * scale`` per method, and the
    paired difference of every other method against ``baseline`` (``"paired"``). The seeds of
    ``diverged`` cells are listed per method (``"diverged"``), outside every mean."""
    summary: dict[str, dict[str, Any]] = {}
    for name in datasets:
        per_seed: dict[str, dict[int, float]] = {}
        for method in methods:
            values = {c.seed: scale * float(r["metrics"][metric]) for c, r in records.items()
                      if c.dataset == name and c.method == method
                      and r["metrics"].get(metric) is not None}
            if values:
                per_seed[method] = dict(sorted(values.items()))
        entry: dict[str, Any] = {"methods": {}, "paired": {}}
        for method, values in per_seed.items():
            mean, std = mean_std(list(values.values()))
            entry["methods"][method] = {"mean": mean, "std": std, "n": len(values),
                                        "seeds": list(values), "values": list(values.values())}
        for method in methods:
            lost = sorted(c.seed for c in diverged if c.dataset == name and c.method == method)
            if lost:
                entry["methods"].setdefault(method, {"mean": None, "std": None, "n": 0,
                                                     "seeds": [], "values": []})
                entry["methods"][method]["diverged"] = lost
        if baseline is not None and baseline in per_seed:
            for method, values in per_seed.items():
                if method != baseline:
                    entry["paired"][method] = paired_difference(values, per_seed[baseline])
        summary[name] = entry
    return summary


def format_mean_std(stats: Mapping[str, Any] | None, digits: int = 2) -> str:
    """``mean ± std (n=k)``; with diverged seeds ``(n=k, 1 diverged)``, or ``diverged (seeds
    0, 1)`` when no seed finished."""
    if not stats:
        return "-"
    lost = stats.get("diverged") or []
    if not stats["n"]:
        return f"diverged (seed{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost))})"
    tail = f", {len(lost)} diverged" if lost else ""
    return f"{stats['mean']:.{digits}f} ± {stats['std']:.{digits}f} (n={stats['n']}{tail})"


def format_difference(diff: Mapping[str, Any] | None, digits: int = 2) -> str:
    if not diff:
        return "-"
    if diff["ci95"] is None:
        return f"{diff['mean']:+.{digits}f} (n={diff['n']})"
    lo, hi = diff["ci95"]
    return f"{diff['mean']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}] (n={diff['n']})"


def summary_table(summary: Mapping[str, Mapping[str, Any]], *, methods: Sequence[str],
                  baseline: str | None = None, labels: Mapping[str, str] | None = None,
                  dataset_labels: Mapping[str, str] | None = None,
                  extra: Callable[[str], Mapping[str, str]] | None = None,
                  digits: int = 2, row_header: str = "dataset") -> str:
    """Markdown: one row per dataset, ``mean ± std (n)`` per method, then each method minus the
    baseline (mean paired difference and its 95% t-interval), then ``extra(dataset)`` columns;
    ``row_header`` names the first column."""
    labels = dict(labels or {})
    rows = []
    for name, entry in summary.items():
        row: dict[str, Any] = {row_header: (dataset_labels or {}).get(name, name)}
        for method in methods:
            row[labels.get(method, method)] = format_mean_std(entry["methods"].get(method),
                                                              digits)
        if baseline is not None:
            for method in methods:
                if method != baseline:
                    head = f"{labels.get(method, method)} − {labels.get(baseline, baseline)} [95% CI]"
                    row[head] = format_difference(entry["paired"].get(method), digits)
        if extra is not None:
            row.update(extra(name))
        rows.append(row)
    return markdown_table(rows)


@dataclass
class Report:
    """The one result writer: summaries, tables, environment and files of a grid, rewritten after
    every finished cell (so an interrupted run leaves a table marked partial).

    ``metrics`` are the record metrics summarised (one table each, the first is the headline);
    ``datasets`` / ``methods`` order the rows / columns; ``baseline`` is the method the others
    are paired against; ``header`` is the markdown above the tables (or ``header(grid)``, after
    ``details``, for text that shows results); ``details(grid)`` adds recipe-specific JSON
    fields; ``drop`` names record fields left out of the result's ``runs`` (long per-step
    histories).
    ``table_rows="methods"`` (a recipe with one dataset) writes one table instead: a row per
    method, a column per metric, and the paired difference on ``headline`` (default: the first
    metric). ``scale`` and ``digits`` may be mappings, metric -> value (a metric not named gets
    scale 1 and 2 digits), for tables mixing percentages with other quantities;
    ``metric_labels`` names the metric columns of the ``"methods"`` table.
    """

    recipe: str
    out_dir: str | os.PathLike
    config: Any
    metrics: Sequence[str]
    datasets: Sequence[str]
    methods: Sequence[str]
    baseline: str | None = None
    header: str | Callable[[GridRun], str] = ""
    scale: float | Mapping[str, float] = 100.0
    labels: Mapping[str, str] | None = None
    dataset_labels: Mapping[str, str] | None = None
    extra: Callable[[str], Mapping[str, str]] | None = None
    stem: str = "results"
    frameworks: Sequence[str] = ()
    device: str | None = None
    data_root: str | os.PathLike | None = None
    data_fingerprint: Any = None
    details: Callable[[GridRun], Mapping[str, Any]] | None = None
    drop: Sequence[str] = ()
    table_rows: str = "datasets"
    headline: str | None = None
    digits: int | Mapping[str, int] = 2
    metric_labels: Mapping[str, str] | None = None

    def write(self, grid: GridRun) -> dict[str, Any]:
        summaries, tables = {}, {}
        for metric in self.metrics:
            summaries[metric] = summarize(grid.records, metric, datasets=self.datasets,
                                          methods=self.methods, baseline=self.baseline,
                                          scale=_per_metric(self.scale, metric, 1.0),
                                          diverged=list(grid.diverged))
            tables[metric] = summary_table(summaries[metric], methods=self.methods,
                                           baseline=self.baseline, labels=self.labels,
                                           dataset_labels=self.dataset_labels, extra=self.extra,
                                           digits=_per_metric(self.digits, metric, 2))
        if self.table_rows == "methods":
            tables = {"methods": self.methods_table(summaries)}
        env = environment(frameworks=self.frameworks, device=self.device,
                          data_root=self.data_root, data_fingerprint=self.data_fingerprint)
        config = (dataclasses.asdict(self.config) if dataclasses.is_dataclass(self.config)
                  else self.config)
        result: dict[str, Any] = {
            "recipe": self.recipe, "config": config, "environment": env, **grid.bookkeeping(),
            "summary": summaries, "baseline": self.baseline, "tables": tables,
            "table_markdown": next(iter(tables.values())),
            "runs": [{"cell": list(c), **{k: v for k, v in r.items() if k not in self.drop}}
                     for c, r in grid.records.items()]}
        if self.details is not None:
            result.update(self.details(grid))
        if self.table_rows == "methods":
            body = tables["methods"]
        else:
            body = "\n".join(f"## {name}\n\n{table}" for name, table in tables.items())
        header = self.header(grid) if callable(self.header) else self.header
        diverged = grid.diverged_error()
        result["outputs"] = write_results(self.out_dir, self.stem, result, header + body,
                                          diverged=str(diverged) if diverged else "")
        return result


    def methods_table(self, summaries: Mapping[str, Mapping[str, Any]]) -> str:
        """A row per method, ``mean ± std (n)`` per metric (of the one dataset), then the paired
        difference to the baseline on the headline metric with its 95% t-interval."""
        labels, names = dict(self.labels or {}), dict(self.metric_labels or {})
        headline = self.headline or self.metrics[0]
        rows = []
        for method in self.methods:
            row = {"method": labels.get(method, method)}
            for metric, summary in summaries.items():
                entry = next(iter(summary.values()), {"methods": {}})
                row[names.get(metric, metric)] = format_mean_std(
                    entry["methods"].get(method), _per_metric(self.digits, metric, 2))
            entry = next(iter(summaries.get(headline, {}).values()), None)
            if self.baseline is not None and entry is not None and entry["paired"]:
                head = (f"{names.get(headline, headline)} − "
                        f"{labels.get(self.baseline, self.baseline)} [95% CI]")
                row[head] = format_difference(entry["paired"].get(method),
                                              _per_metric(self.digits, headline, 2))
            rows.append(row)
        return markdown_table(rows)


def _per_metric(value: Any, metric: str, default: Any) -> Any:
    """``value`` itself, or its entry for ``metric`` when it is a mapping (``default`` if absent)."""
    return value.get(metric, default) if isinstance(value, Mapping) else value


def write_results(out_dir: str | os.PathLike, stem: str, result: Mapping[str, Any],
                  markdown: str, *, diverged: str = "") -> dict[str, str]:
    """Write ``<stem>.json`` (``allow_nan=False``) and ``<stem>.md`` atomically.

    The markdown gets a DIVERGED banner (``diverged``: the line naming the runs), a FAILED banner
    naming the runs whose job failed (``result["failed"]``, ``--jobs``), a PARTIAL banner when
    ``result["partial"]`` and an environment footer.
    """
    out = Path(out_dir)
    env = result.get("environment") or {}
    head = ""
    if diverged:
        head += f"> **DIVERGED**: {diverged}; left out of every mean (marked in the table).\n\n"
    failed = result.get("failed") or []
    if failed:
        names = ", ".join("{}/{}/seed{}".format(*f["cell"]) for f in failed)
        head += (f"> **FAILED**: {len(failed)} runs failed ({names}; their logs are in "
                 "results.json); rerun the same command to retry them.\n\n")
    if result.get("partial"):
        missing = result.get("missing") or []
        head += (f"> **PARTIAL**: {len(missing)} of the planned runs are missing; rows average "
                "only the finished seeds (n in brackets).\n\n")
    foot = ""
    if env:
        foot = (f"\n_adaptcl {env.get('adaptcl')}, torch {env.get('torch')}, Python "
                f"{env.get('python')}; {env.get('cpu')}, torch threads {env.get('torch_threads')}, "
                f"device {env.get('device')}; commit {env.get('git_commit')}; "
                f"{env.get('timestamp')}; data {env.get('data_root')} "
                f"({_short_fingerprint(env.get('data_fingerprint'))}); reused "
                f"{len(result.get('reused') or [])}, computed "
                f"{len(result.get('computed') or [])}; training "
                f"{float(result.get('total_train_seconds') or 0):.0f} s in total._\n")
    paths = {"json": out / f"{stem}.json", "markdown": out / f"{stem}.md"}
    write_json_atomic(paths["json"], result)
    write_text_atomic(paths["markdown"], head + markdown.rstrip("\n") + "\n" + foot)
    return {k: str(v) for k, v in paths.items()}


def read_results(path: str | os.PathLike) -> tuple[dict[str, Any], str]:
    """A result JSON that :func:`write_results` wrote, and the SHA-256 of its bytes (read once).

    Raises :class:`~adaptcl.recipes.template.errors.RecipeError` naming the file when it is
    missing, unreadable, or not a recipe's result (no ``recipe``, ``config`` or ``summary``).
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
        result = json.loads(raw)
    except FileNotFoundError:
        raise RecipeError(f"no result file {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RecipeError(f"{path} is not a readable result JSON ({err})") from None
    missing = [k for k in ("recipe", "config", "summary") if k not in result]
    if not isinstance(result, dict) or missing:
        raise RecipeError(f"{path} is not a recipe result (missing {', '.join(missing)})")
    return result, hashlib.sha256(raw).hexdigest()


def _short_fingerprint(fingerprint: Any) -> str:
    if isinstance(fingerprint, Mapping):
        if "sha256" in fingerprint:
            return f"sha256 {str(fingerprint['sha256'])[:12]}"
        return ", ".join(f"{k} {_short_fingerprint(v)}" for k, v in fingerprint.items())
    return str(fingerprint)[:12] if fingerprint else "no fingerprint"
