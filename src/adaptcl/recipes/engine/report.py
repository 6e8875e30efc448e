"""The result files of a run: ``results.json`` (summaries, records, environment) and
``results.md`` (the tables, under the recipe's header and every setting of the runs'
identities), rewritten after every finished cell so an interrupted run leaves a table marked
partial."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptcl.recipes.engine.cells import RunLayout
from adaptcl.recipes.engine.errors import RecipeError, plural
from adaptcl.recipes.engine.files import markdown_table, write_json_atomic, write_text_atomic
from adaptcl.recipes.engine.provenance import environment
from adaptcl.recipes.engine.settings import as_record, identity_settings
from adaptcl.recipes.engine.store import GridRun
from adaptcl.recipes.engine.summary import (
    axis_table,
    difference_header,
    format_difference,
    format_mean_std,
    summarize,
    summarize_axis,
    summary_table,
)


@dataclass(frozen=True)
class ReportSpec:
    """What a recipe's tables show.

    ``metrics``: the record metrics summarised, headline first (a table each); ``baseline``:
    the column the others are paired against; ``header``: the markdown above the tables (or
    ``header(grid)``); ``labels`` / ``row_labels``: display names of columns and rows;
    ``extra_columns(row)``: columns appended to each row (the paper's numbers);
    ``details(grid)``: fields added to ``results.json``; ``drop``: record fields left out of
    its ``runs``; ``scale`` / ``digits``: per metric or for all (``scale`` 100: percentages).
    ``by_method``: one table instead, a row per column value and a column per metric (named by
    ``metric_labels``), with the paired difference on the headline metric (one-row recipes).
    """

    metrics: Sequence[str]
    baseline: str | None = None
    header: str | Callable[[GridRun], str] = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    row_labels: Mapping[str, str] = field(default_factory=dict)
    extra_columns: Callable[[str], Mapping[str, str]] | None = None
    details: Callable[[GridRun], Mapping[str, Any]] | None = None
    drop: Sequence[str] = ()
    scale: float | Mapping[str, float] = 100.0
    digits: int | Mapping[str, int] = 2
    by_method: bool = False
    metric_labels: Mapping[str, str] = field(default_factory=dict)

    def scale_of(self, metric: str) -> float:
        return self.scale.get(metric, 1.0) if isinstance(self.scale, Mapping) else self.scale

    def digits_of(self, metric: str) -> int:
        return self.digits.get(metric, 2) if isinstance(self.digits, Mapping) else self.digits


@dataclass
class Report:
    """The one result writer of a run: ``axes`` the grid's (row, column) names, ``methods``
    the columns in order, ``config`` the base config, ``sweep`` ``{field: [values]}``,
    ``environment`` keyword arguments of :func:`~adaptcl.recipes.engine.provenance.environment`,
    ``ignoring`` ``{swept field: [columns whose loss does not read it]}``: their one run is
    shown at every value of the field, said once under the tables, and left out of the tables
    along it.
    """

    recipe: str
    out_dir: str | os.PathLike
    spec: ReportSpec
    axes: Sequence[str]
    methods: Sequence[str]
    config: Any
    preset: str | None = None
    sweep: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    environment: Mapping[str, Any] = field(default_factory=dict)
    ignoring: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def write(self, grid: GridRun) -> dict[str, Any]:
        spec, diverged = self.spec, list(grid.diverged)
        summaries, tables, along, body = {}, {}, {}, ""
        for metric in spec.metrics:
            scale, digits = spec.scale_of(metric), spec.digits_of(metric)
            summaries[metric] = summarize(grid.records, metric, methods=self.methods,
                                          baseline=spec.baseline, scale=scale, diverged=diverged)
            tables[metric] = summary_table(
                summaries[metric], methods=self.methods, baseline=spec.baseline,
                labels=spec.labels, row_labels=spec.row_labels, extra=spec.extra_columns,
                digits=digits, row_header=self.axes[0])
            for axis, values in self.sweep.items():
                along.setdefault(axis, {})[metric] = [
                    entry for entry in summarize_axis(grid.records, metric, axis, values,
                                                      scale=scale, diverged=diverged)
                    if entry["method"] not in self.ignoring.get(axis, ())]
        if spec.by_method:
            tables = {"methods": self.methods_table(summaries)}
        for axis, per_metric in along.items():
            for metric, entries in per_metric.items():
                if not entries:  # every column ignores the setting
                    continue
                body += (f"\n## {metric} along {axis}\n\n"
                         + axis_table(entries, axis, self.sweep[axis], labels=spec.labels,
                                      digits=spec.digits_of(metric), row_header=self.axes[0],
                                      column_header=self.axes[1]))
        body = (tables["methods"] if spec.by_method else
                "\n".join(f"## {name}\n\n{table}" for name, table in tables.items())
                ) + self.ignoring_text(spec.labels) + body
        result: dict[str, Any] = {
            "recipe": self.recipe, "axes": list(self.axes), "preset": self.preset,
            "config": as_record(self.config),
            "settings": as_record(identity_settings(self.config)),
            "sweep": {k: list(v) for k, v in self.sweep.items()},
            "environment": environment(**self.environment), **grid.bookkeeping(),
            "summary": summaries, "summary_along": along, "baseline": spec.baseline,
            "tables": tables, "table_markdown": next(iter(tables.values())),
            "runs": [{"cell": c.as_dict(), **{k: v for k, v in r.items() if k not in spec.drop}}
                     for c, r in grid.records.items()],
            "other_stored_runs": _other_stored(self.out_dir, grid)}
        if spec.details is not None:
            result.update(spec.details(grid))
        header = spec.header(grid) if callable(spec.header) else spec.header
        header = (header.rstrip("\n") + "\n\n" if header else "") + settings_text(
            grid.identities.get(c) or {} for c in grid.cells)
        diverged_error = grid.diverged_error()
        result["outputs"] = write_results(self.out_dir, result, header + body,
                                          diverged=str(diverged_error) if diverged_error else "")
        return result

    def ignoring_text(self, labels: Mapping[str, str]) -> str:
        """A line per swept setting some columns do not read (markdown, or empty)."""
        lines = [f"{', '.join(labels.get(m, m) for m in methods)} "
                 f"{'does' if len(methods) == 1 else 'do'} not read {axis}: "
                 f"{'its run is' if len(methods) == 1 else 'each run is'} computed once "
                 f"and shown at every {axis} (left out of the tables along {axis})."
                 for axis, methods in self.ignoring.items() if methods]
        return "".join(f"\n{line}\n" for line in lines)

    def methods_table(self, summaries: Mapping[str, Mapping[str, Any]]) -> str:
        """A row per method, ``mean ± std (n)`` per metric (of the one row), then the paired
        difference to the baseline on the headline metric."""
        spec = self.spec
        labels, names = dict(spec.labels), dict(spec.metric_labels)
        headline = spec.metrics[0]
        entry = next(iter(summaries.get(headline, {}).values()), None)
        head = None
        if spec.baseline is not None and entry is not None and entry["paired"]:
            head = difference_header(names.get(headline, headline),
                                     labels.get(spec.baseline, spec.baseline),
                                     list(entry["paired"].values()))
        rows = []
        for method in self.methods:
            row = {"method": labels.get(method, method)}
            for metric, summary in summaries.items():
                stats = next(iter(summary.values()), {"methods": {}})["methods"].get(method)
                row[names.get(metric, metric)] = format_mean_std(stats, spec.digits_of(metric))
            if head is not None:
                row[head] = format_difference(entry["paired"].get(method),
                                              spec.digits_of(headline))
            rows.append(row)
        return markdown_table(rows)


#: the parts of a cell's identity that are no setting: the table's row, the data's fingerprint,
#: the code and the frameworks' versions (the environment footer and results.json say them)
_NOT_SETTINGS = ("row", "data", "code", "frameworks")


def _shown_settings(identity: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a cell's identity as its report shows them, ``{name: value}``: its
    ``settings`` part, then every other part but ``_NOT_SETTINGS`` (``distributed``,
    ``encoder``, ``pretrained``), a mapping as ``part.name`` entries.

    >>> _shown_settings({"settings": {"lr": 0.1, "mini_batch_size": 16}, "code": "abc",
    ...                 "distributed": {"devices": 2, "strategy": "ddp"}})
    {'lr': 0.1, 'mini_batch_size': 16, 'distributed.devices': 2, 'distributed.strategy': 'ddp'}
    """
    out: dict[str, Any] = {}

    def add(name: str, value: Any) -> None:
        if isinstance(value, Mapping) and "sha256" not in value:  # a fingerprint is one value
            for key, item in value.items():
                add(f"{name}.{key}" if name else str(key), item)
        else:
            out[name] = value

    add("", identity.get("settings") or {})
    for part, value in identity.items():
        if part not in ("settings", *_NOT_SETTINGS):
            add(part, value)
    return out


def _setting_text(value: Any) -> str:
    """A setting's value as ``results.md`` and the command line spell it: ``none``, ``true``,
    ``[0.1, 1.0]``, a fingerprint by the start of its hash."""
    if value is None or isinstance(value, bool):
        return {None: "none", True: "true", False: "false"}[value]
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_setting_text(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return _short_fingerprint(value)
    return str(value)


def settings_text(identities: Iterable[Mapping[str, Any]]) -> str:
    """The paragraph of ``results.md`` naming every setting the runs' ``identities`` hold
    (``_shown_settings``) with its value, ``name=a or b`` where runs differ; empty without
    any. Every setting that determines a number is in the report, whatever its recipe's
    header says."""
    values: dict[str, list[str]] = {}
    for identity in identities:
        for name, value in _shown_settings(identity).items():
            texts = values.setdefault(name, [])
            if _setting_text(value) not in texts:
                texts.append(_setting_text(value))
    if not values:
        return ""
    shown = ", ".join(f"{name}={' or '.join(texts)}" for name, texts in values.items())
    return f"Settings of the runs (what their identities hold): {shown}.\n\n"


def write_results(out_dir: str | os.PathLike, result: Mapping[str, Any], markdown: str, *,
                  diverged: str = "") -> dict[str, str]:
    """Write ``results.json`` (strict JSON) and ``results.md`` atomically, the markdown under a
    banner for what the table lacks (``diverged``: the line naming the runs; the ``failed``,
    ``partial``, ``other_stored_runs`` and ``superseded`` of ``result``) and over an
    environment footer."""
    layout = RunLayout(out_dir)
    env = result.get("environment") or {}
    failed, others = result.get("failed") or [], result.get("other_stored_runs") or 0
    superseded = result.get("superseded") or []
    banners = [
        (diverged, f"**DIVERGED**: {diverged}; left out of every mean (marked in the table)."),
        (failed, f"**FAILED**: {plural(len(failed))} failed "
                 f"({', '.join(f['label'] for f in failed)}; their logs are in results.json); "
                 "rerun the same command to retry them."),
        (result.get("partial"), f"**PARTIAL**: {len(result.get('missing') or [])} of the "
                                "planned runs are missing; rows average only the finished "
                                "seeds (n in brackets)."),
        (others, f"**NOT ALL STORED RUNS**: this table holds the runs of the command that "
                 f"wrote it; {layout.runs} also holds {plural(others)} of other commands "
                 "(other seeds, datasets or settings), left out here."),
        (superseded, f"**RECOMPUTED**: {plural(len(superseded))} stored with another identity "
                     "(settings, data or code) and were recomputed; the old records are under "
                     f"{layout.runs / 'superseded'}.")]
    head = "".join(f"> {text}\n\n" for shown, text in banners if shown)
    foot = ""
    overrides = "".join(f", {k}={v}" for k, v in (env.get("kernel_overrides") or {}).items())
    if env:
        foot = (f"\n_adaptcl {env.get('adaptcl')}, torch {env.get('torch')}, Python "
                f"{env.get('python')}; {env.get('cpu')} (kernels: "
                f"{env.get('cpu_capability')}{overrides}), torch threads {env.get('torch_threads')}, "
                f"device {env.get('device')}; commit {env.get('git_commit')}; "
                f"{env.get('timestamp')}; data {env.get('data_root')} "
                f"({_short_fingerprint(env.get('data_fingerprint'))}); reused "
                f"{len(result.get('reused') or [])}, computed "
                f"{len(result.get('computed') or [])}; training "
                f"{float(result.get('total_train_seconds') or 0):.0f} s in total._\n")
    paths = {"json": layout.results("json"), "markdown": layout.results("md")}
    write_json_atomic(paths["json"], result)
    write_text_atomic(paths["markdown"], head + markdown.rstrip("\n") + "\n" + foot)
    return {k: str(v) for k, v in paths.items()}


def _other_stored(out_dir: str | os.PathLike, grid: GridRun) -> int:
    """How many records under ``runs/`` belong to no cell of ``grid`` (another command's)."""
    layout = RunLayout(out_dir)
    ours = {layout.record(c) for c in grid.cells}
    skip = {"superseded", ".locks", ".active"}
    return sum(1 for p in layout.runs.rglob("seed*.json")
               if p not in ours and not skip & set(p.relative_to(layout.runs).parts))


def read_results(path: str | os.PathLike) -> tuple[dict[str, Any], str]:
    """A result JSON :func:`write_results` wrote and the SHA-256 of its bytes, or
    :class:`~adaptcl.recipes.engine.errors.RecipeError` naming the file when it is missing,
    unreadable or not a recipe's result."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        result = json.loads(raw)
    except FileNotFoundError:
        raise RecipeError(f"no result file {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RecipeError(f"{path} is not a readable result JSON ({err})") from None
    missing = [k for k in ("recipe", "config", "summary", "axes") if k not in result]
    if not isinstance(result, dict) or missing:
        raise RecipeError(f"{path} is not a recipe result (missing {', '.join(missing)})")
    return result, hashlib.sha256(raw).hexdigest()


def _short_fingerprint(fingerprint: Any) -> str:
    if isinstance(fingerprint, Mapping):
        if "sha256" in fingerprint:
            return f"sha256 {str(fingerprint['sha256'])[:12]}"
        return ", ".join(f"{k} {_short_fingerprint(v)}" for k, v in fingerprint.items())
    return str(fingerprint)[:12] if fingerprint else "no fingerprint"
