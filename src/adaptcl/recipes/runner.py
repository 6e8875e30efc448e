"""One runner for every recipe: a grid of cells, a run store with identity, summaries, CLI words.

A recipe is a grid of *cells* ``(dataset, method, seed)``. For each cell the recipe states its
*identity* (everything that determines the result: the resolved settings, a fingerprint of the
input data, the code version) and a function computing its *record*. :func:`run_grid` reuses a
stored record only when the stored identity equals the current one; otherwise the old record is
moved aside (``runs/superseded/``, never mixed into a table) and the cell is recomputed. A record
that is not a result (no optimisation step, a non-finite loss or metric) is refused with
:class:`NonResultError` before it is stored.

The rest is shared by every recipe: :func:`summarize` (mean +- population std per
(dataset, method) and the paired difference adaptive - baseline over common seeds with a 95%
t-interval), :func:`summary_table`, :func:`write_results` (JSON with ``allow_nan=False`` and the
environment, markdown marked partial when cells are missing), :func:`progress`,
:func:`apply_thread_policy`, :func:`resolve_device` / :func:`autocast` / :func:`grad_scaler`,
:func:`metric_logger` / :func:`lightning_logger`, and the one CLI vocabulary
(:func:`add_common_arguments`). This module imports only the standard library at import time,
so a recipe's ``--help`` stays instant.

Example:
    >>> import tempfile
    >>> out = tempfile.mkdtemp()
    >>> cells = [Cell("toy", "base", s) for s in (0, 1)]
    >>> grid = run_grid("toy", out, cells, identity=lambda c: {"lr": 0.1},
    ...                 compute=lambda c: {"metrics": {"acc": 0.5 + c.seed / 10},
    ...                                    "optimisation_steps": 3, "train_seconds": 0.0},
    ...                 progress_bar=False)
    >>> [c.seed for c in grid.computed], grid.reused
    ([0, 1], [])
    >>> run_grid("toy", out, cells, identity=lambda c: {"lr": 0.1}, compute=None,
    ...          progress_bar=False).reused == cells
    True
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import functools
import hashlib
import importlib
import json
import math
import os
import pickle
import platform
import shutil
import subprocess
import sys
import time
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from adaptcl.recipes._common import (
    markdown_table,
    mean_std,
    read_json,
    save_figure_atomic,
    write_json_atomic,
    write_text_atomic,
)

# ------------------------------------------------------------------------------------ errors


class RecipeError(ValueError):
    """A user-facing error (bad option, bad or missing data): the CLI prints one line, exit 2."""


class NonResultError(RecipeError):
    """A run that is not a result: no optimisation step, non-finite loss/metric/embeddings."""


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn ``ValueError`` / ``FileNotFoundError`` raised while validating into :class:`RecipeError`."""
    try:
        yield
    except RecipeError:
        raise
    except (ValueError, FileNotFoundError, NotADirectoryError) as err:
        raise RecipeError(str(err)) from err


# ------------------------------------------------------------------------------------ cells


class Cell(NamedTuple):
    """One run of a grid: ``dataset`` x ``method`` (loss, init, encoder) x ``seed``."""

    dataset: str
    method: str
    seed: int

    def label(self) -> str:
        return f"{self.dataset}/{self.method}/seed{self.seed}"


# ---------------------------------------------------------------------------------- identity


def stable_hash(obj: Any, length: int = 16) -> str:
    """SHA-256 (hex, first ``length`` characters) of ``obj`` as canonical JSON."""
    blob = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def fingerprint_files(paths: Iterable[str | os.PathLike], root: str | os.PathLike | None = None
                      ) -> dict[str, Any]:
    """Fingerprint of input files: SHA-256 over every file's name, size and content.

    ``paths`` may hold files and folders (walked recursively, sorted; hidden entries skipped).
    Names are taken relative to ``root`` when given, so a copy of the same data elsewhere has the
    same fingerprint; a changed byte anywhere changes it.
    """
    files: list[Path] = []
    for entry in paths:
        entry = Path(entry)
        if entry.is_dir():
            files.extend(p for p in sorted(entry.rglob("*"))
                         if p.is_file() and not any(part.startswith(".") for part in
                                                    p.relative_to(entry).parts))
        elif entry.is_file():
            files.append(entry)
        else:
            raise FileNotFoundError(f"cannot fingerprint {str(entry)!r}: no such file or folder")
    digest = hashlib.sha256()
    total = 0
    for path in files:
        name = str(path.relative_to(root)) if root is not None else path.name
        size = path.stat().st_size
        total += size
        digest.update(f"{name}\0{size}\0".encode())
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return {"sha256": digest.hexdigest(), "files": len(files), "bytes": total}


def code_version(*modules: str) -> dict[str, Any]:
    """The code that determines a result: adaptcl's version and a hash of ``modules``' sources."""
    digest = hashlib.sha256()
    for name in sorted(modules):
        module = importlib.import_module(name)
        source = Path(getattr(module, "__file__", "") or "")
        if source.name == "__init__.py":  # a package: every module in it
            parts = sorted(source.parent.rglob("*.py"))
        else:
            parts = [source] if source.is_file() else []
        for part in parts:
            digest.update(part.name.encode() + b"\0" + part.read_bytes())
    return {"adaptcl": package_version(), "sources": digest.hexdigest()[:16],
            "modules": sorted(modules)}


def package_version() -> str:
    """adaptcl's version from the installed metadata (``adaptcl.__version__`` when not installed)."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("adaptcl")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        import adaptcl

        return adaptcl.__version__


# ---------------------------------------------------------------------------- result checks


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def check_record(cell: Cell, record: Mapping[str, Any], *, trains: bool = True) -> None:
    """Refuse a record that is not a result (raises :class:`NonResultError` naming the cell).

    A record holds ``metrics`` (name -> finite number) and ``optimisation_steps``; a training
    cell (``trains=True``) needs at least one step, and ``losses`` (if present) must be finite.
    """
    metrics = record.get("metrics")
    if not isinstance(metrics, Mapping) or not metrics:
        raise NonResultError(f"{cell.label()}: the run reported no metrics")
    bad = {k: v for k, v in metrics.items() if v is None or _non_finite(float(v))}
    if bad:
        raise NonResultError(f"{cell.label()}: non-finite metrics {bad}; nothing was stored")
    if trains:
        require_steps(record.get("optimisation_steps"), cell.label())
    losses = record.get("losses") or []
    if any(_non_finite(float(v)) for v in losses):
        raise NonResultError(f"{cell.label()}: non-finite training loss; nothing was stored")


def require_steps(steps: int | None, where: str) -> None:
    """Refuse a training run that took no optimisation step (an untrained model is no result)."""
    if not steps:
        raise NonResultError(
            f"{where}: the run performed no optimisation step (every batch was skipped or there "
            "were no epochs); check --batch-size and --epochs")


def check_embeddings(x: Any, where: str, *, allow_constant: bool = False) -> None:
    """Refuse non-finite or constant embeddings (``[n, d]`` tensor or array) before they are used."""
    import numpy as np

    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        raise NonResultError(f"{where}: no embeddings")
    if not np.isfinite(x).all():
        count = int((~np.isfinite(x)).any(axis=-1).sum()) if x.ndim > 1 else int(
            (~np.isfinite(x)).sum())
        raise NonResultError(f"{where}: {count} embeddings contain NaN or inf")
    if (not allow_constant and x.ndim > 1 and x.shape[0] > 1
            and float(np.ptp(x, axis=0).max()) == 0.0):
        raise NonResultError(f"{where}: every embedding is the same vector (a collapsed or "
                             "constant encoder)")


# ---------------------------------------------------------------------------------- the store


class RunStore:
    """Records of finished cells under ``<out_dir>/runs``, each with the identity it was computed with.

    ``runs/<dataset>/<method>/seed<k>.json`` holds ``{"identity", "identity_hash", "record"}``,
    written atomically. A record whose identity differs from the current one (or that cannot be
    read) is moved to ``runs/superseded/<timestamp>/...`` and reported, never reused.
    """

    def __init__(self, out_dir: str | os.PathLike) -> None:
        self.root = Path(out_dir) / "runs"
        self.superseded: list[str] = []
        self._stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")

    def path(self, cell: Cell) -> Path:
        return self.root / cell.dataset / cell.method / f"seed{cell.seed}.json"

    def load(self, cell: Cell, identity: Mapping[str, Any]) -> dict[str, Any] | None:
        """The stored record of ``cell`` if it was computed with ``identity``; else ``None``."""
        path = self.path(cell)
        if not path.is_file():
            return None
        try:
            stored = read_json(path)
            matches = stored.get("identity_hash") == stable_hash(identity)
        except (ValueError, OSError, AttributeError):
            matches, stored = False, None
        if matches and stored is not None:
            return stored["record"]
        self._set_aside(path)
        return None

    def save(self, cell: Cell, identity: Mapping[str, Any], record: Mapping[str, Any]) -> Path:
        return write_json_atomic(self.path(cell), {"identity": dict(identity),
                                                   "identity_hash": stable_hash(identity),
                                                   "record": dict(record)})

    def _set_aside(self, path: Path) -> None:
        target = self.root / "superseded" / self._stamp / path.relative_to(self.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        self.superseded.append(str(target))


@dataclass
class GridRun:
    """What :func:`run_grid` did: every record by cell, which were reused and which computed."""

    cells: list[Cell]
    records: dict[Cell, dict[str, Any]] = field(default_factory=dict)
    reused: list[Cell] = field(default_factory=list)
    computed: list[Cell] = field(default_factory=list)
    superseded: list[str] = field(default_factory=list)
    seconds_this_invocation: float = 0.0
    identities: dict[Cell, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return all(c in self.records for c in self.cells)

    def code_versions(self) -> list[Any]:
        """The distinct code versions (``identity["code"]``) of the cells with a record."""
        seen: dict[str, Any] = {}
        for cell in self.records:
            code = (self.identities.get(cell) or {}).get("code")
            if code is not None:
                seen.setdefault(stable_hash(code), code)
        return list(seen.values())

    def bookkeeping(self) -> dict[str, Any]:
        """The part of a result file that says what this invocation did."""
        return {"complete": self.complete, "partial": not self.complete,
                "reused": [list(c) for c in self.reused],
                "computed": [list(c) for c in self.computed],
                "missing": [list(c) for c in self.cells if c not in self.records],
                "superseded": list(self.superseded),
                "code": self.code_versions(),
                "total_train_seconds": sum(float(r.get("train_seconds") or 0.0)
                                           for r in self.records.values()),
                "seconds_this_invocation": self.seconds_this_invocation}


def run_grid(recipe: str, out_dir: str | os.PathLike, cells: Sequence[Cell], *,
             identity: Callable[[Cell], Mapping[str, Any]],
             compute: Callable[[Cell], dict[str, Any] | None] | None,
             trains: Callable[[Cell], bool] | bool = True,
             on_record: Callable[[GridRun], None] | None = None,
             progress_bar: bool = True) -> GridRun:
    """Compute every cell whose stored record is missing or stale; reuse the others.

    ``identity(cell)`` returns everything that determines the cell's result (JSON-able);
    ``compute(cell)`` returns its record (``metrics``, ``optimisation_steps``, ``train_seconds``
    and anything else), or ``None`` on a process that does not own the result (a non-zero
    rank of a distributed run); ``compute=None`` only collects what is stored. Each record is checked
    with :func:`check_record` before it is stored; ``on_record`` is called after each computed
    cell (to rewrite partial result files).
    """
    _git_commit()  # the commit the runs start from (cached for the result's environment)
    store = RunStore(out_dir)
    grid = GridRun(cells=list(cells))
    start = time.perf_counter()
    todo: list[Cell] = []
    for cell in grid.cells:
        grid.identities[cell] = identity(cell)
        record = store.load(cell, grid.identities[cell])
        if record is not None:
            grid.records[cell] = record
            grid.reused.append(cell)
        else:
            todo.append(cell)
    grid.superseded = store.superseded
    if compute is not None and todo:
        bar = progress(total=len(grid.cells), initial=len(grid.reused), desc=f"{recipe} runs",
                       enabled=progress_bar, leave=True)
        try:
            for cell in todo:
                bar.set_postfix_str(cell.label())
                record = compute(cell)
                if record is None:  # computed and stored by another process (rank 0 of DDP)
                    bar.update(1)
                    continue
                check_record(cell, record, trains=trains(cell) if callable(trains) else trains)
                store.save(cell, grid.identities[cell], record)
                grid.records[cell] = record
                grid.computed.append(cell)
                grid.seconds_this_invocation = time.perf_counter() - start
                if on_record is not None:
                    on_record(grid)
                bar.update(1)
        finally:
            bar.close()
    grid.records = {c: grid.records[c] for c in grid.cells if c in grid.records}  # grid order
    grid.seconds_this_invocation = time.perf_counter() - start
    return grid


# ---------------------------------------------------------------------------------- summaries


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
              scale: float = 1.0) -> dict[str, dict[str, Any]]:
    """Per dataset: mean +- population std of ``metrics[metric] * scale`` per method, and the
    paired difference of every other method against ``baseline`` (``"paired"``)."""
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
        if baseline is not None and baseline in per_seed:
            for method, values in per_seed.items():
                if method != baseline:
                    entry["paired"][method] = paired_difference(values, per_seed[baseline])
        summary[name] = entry
    return summary


def format_mean_std(stats: Mapping[str, Any] | None, digits: int = 2) -> str:
    if not stats:
        return "-"
    return f"{stats['mean']:.{digits}f} ± {stats['std']:.{digits}f} (n={stats['n']})"


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
    are paired against; ``details(grid)`` adds recipe-specific JSON fields; ``drop`` names
    record fields left out of the result's ``runs`` (long per-step histories).
    """

    recipe: str
    out_dir: str | os.PathLike
    config: Any
    metrics: Sequence[str]
    datasets: Sequence[str]
    methods: Sequence[str]
    baseline: str | None = None
    header: str = ""
    scale: float = 100.0
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

    def write(self, grid: GridRun) -> dict[str, Any]:
        summaries, tables = {}, {}
        for metric in self.metrics:
            summaries[metric] = summarize(grid.records, metric, datasets=self.datasets,
                                          methods=self.methods, baseline=self.baseline,
                                          scale=self.scale)
            tables[metric] = summary_table(summaries[metric], methods=self.methods,
                                           baseline=self.baseline, labels=self.labels,
                                           dataset_labels=self.dataset_labels, extra=self.extra)
        env = environment(frameworks=self.frameworks, device=self.device,
                          data_root=self.data_root, data_fingerprint=self.data_fingerprint)
        config = (dataclasses.asdict(self.config) if dataclasses.is_dataclass(self.config)
                  else self.config)
        result: dict[str, Any] = {
            "recipe": self.recipe, "config": config, "environment": env, **grid.bookkeeping(),
            "summary": summaries, "tables": tables,
            "table_markdown": tables[self.metrics[0]],
            "runs": [{"cell": list(c), **{k: v for k, v in r.items() if k not in self.drop}}
                     for c, r in grid.records.items()]}
        if self.details is not None:
            result.update(self.details(grid))
        body = "\n".join(f"## {metric}\n\n{tables[metric]}" for metric in self.metrics)
        result["outputs"] = write_results(self.out_dir, self.stem, result, self.header + body)
        return result


#: config fields that never change what a cell computes (recipes name their own on top)
BOOKKEEPING = ("datasets", "losses", "inits", "seeds", "data_root", "output_dir", "work_dir",
               "cache_dir", "threads", "progress", "plot", "logger", "device", "devices",
               "strategy", "num_workers", "download")


def result_settings(cfg: Any, exclude: Sequence[str] = ()) -> dict[str, Any]:
    """Every field of the dataclass ``cfg`` that can change a result (part of a run's identity):
    all but :data:`BOOKKEEPING` and ``exclude``; the device enters as its type (cpu / cuda)."""
    skip = set(BOOKKEEPING) | set(exclude)
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in skip}
    if hasattr(cfg, "device"):
        settings["device_type"] = torch_device_type(cfg.device)
    return settings


def validate_config(cfg: Any, *, positive: Sequence[str] = (),
                    choices: Mapping[str, Sequence[Any]] | None = None,
                    non_empty: Sequence[str] = ()) -> None:
    """Check a recipe's dataclass config; ``ValueError`` naming the field and the bad value.

    ``positive``: numbers > 0; ``choices``: field -> allowed values; ``non_empty``: lists.
    ``precision`` and ``logger`` are always checked when the config has them.
    """
    allowed_all = dict(choices or {})
    for name, allowed in (("precision", PRECISIONS), ("logger", LOGGERS)):
        if hasattr(cfg, name):
            allowed_all.setdefault(name, allowed)
    for name in positive:
        value = getattr(cfg, name)
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value <= 0):
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    for name, allowed in allowed_all.items():
        if getattr(cfg, name) not in allowed:
            raise ValueError(f"{name} must be one of {tuple(allowed)}, got {getattr(cfg, name)!r}")
    for name in non_empty:
        if not getattr(cfg, name):
            raise ValueError(f"{name} must not be empty")


# ---------------------------------------------------------------------------------- environment


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def _git_commit() -> str | None:
    """HEAD of the checkout adaptcl runs from (``+dirty`` with uncommitted changes to the
    package), read once per process: :func:`run_grid` reads it before computing, so a result
    names the commit its runs started from, not the one at the time it was written."""
    here = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=False)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--", "."],
                               capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _version_of(module: str) -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version(module)
    except PackageNotFoundError:
        return None


def environment(*, frameworks: Sequence[str] = (), device: str | None = None,
                data_root: str | os.PathLike | None = None,
                data_fingerprint: Any = None) -> dict[str, Any]:
    """What a reader needs to reproduce a result: versions, host, threads, time, commit, data."""
    import torch

    env: dict[str, Any] = {
        "adaptcl": package_version(), "python": platform.python_version(),
        "torch": torch.__version__,
        "frameworks": {name: _version_of(name) for name in frameworks},
        "platform": platform.platform(), "cpu": _cpu_model(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "device": device,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": _git_commit(),
        "data_root": str(Path(data_root).resolve()) if data_root is not None else None,
        "data_fingerprint": data_fingerprint,
    }
    return env


def write_results(out_dir: str | os.PathLike, stem: str, result: Mapping[str, Any],
                  markdown: str) -> dict[str, str]:
    """Write ``<stem>.json`` (``allow_nan=False``) and ``<stem>.md`` atomically.

    The markdown gets a PARTIAL banner when ``result["partial"]`` and an environment footer.
    """
    out = Path(out_dir)
    env = result.get("environment") or {}
    head = ""
    if result.get("partial"):
        missing = result.get("missing") or []
        head = (f"> **PARTIAL**: {len(missing)} of the planned runs are missing; rows average "
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


def write_measurements(path: str | os.PathLike, measurements: Mapping[str, Any], *,
                       device: str | None = None) -> Path:
    """Write a benchmark's measurements to ``path`` as strict JSON, atomically, under an
    ``environment`` key saying what produced them (:func:`environment`), so a number in the
    docs can always be traced to its machine."""
    return write_json_atomic(path, {"environment": environment(device=device), **measurements})


def _short_fingerprint(fingerprint: Any) -> str:
    if isinstance(fingerprint, Mapping):
        if "sha256" in fingerprint:
            return f"sha256 {str(fingerprint['sha256'])[:12]}"
        return ", ".join(f"{k} {_short_fingerprint(v)}" for k, v in fingerprint.items())
    return str(fingerprint)[:12] if fingerprint else "no fingerprint"


# ------------------------------------------------------------------------ progress and threads


class _NoBar:
    def __init__(self, iterable: Iterable | None = None) -> None:
        self._iterable = iterable

    def __iter__(self):
        return iter(self._iterable or ())

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_postfix_str(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def progress(iterable: Iterable | None = None, *, enabled: bool = True, desc: str = "",
             total: int | None = None, initial: int = 0, leave: bool = False) -> Any:
    """The one progress display (tqdm, to stderr); a silent stand-in when ``enabled`` is false."""
    if not enabled:
        return _NoBar(iterable)
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, initial=initial, leave=leave,
                dynamic_ncols=True)


def apply_thread_policy(threads: int | None) -> int:
    """Set torch's intra-op threads (``None``: leave torch's default); return the count in use.

    Recipes default to one thread: their models are small, so OpenMP synchronisation costs more
    than a second thread saves, and a shared machine stays responsive. The count is recorded in
    every result because it changes floating-point summation order.
    """
    import torch

    if threads is not None:
        if int(threads) < 1:
            raise RecipeError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(int(threads))
    return torch.get_num_threads()


# ------------------------------------------------------------------------ device and precision

PRECISIONS = ("32", "bf16-mixed", "16-mixed")


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when available else ``cpu``; validate ``cpu`` / ``cuda[:N]``."""
    import torch

    name = str(device).lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return name
    if name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        if not torch.cuda.is_available():
            raise RecipeError(f"--device {device}: CUDA is not available on this machine")
        return name
    raise RecipeError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")


def check_precision(precision: str) -> str:
    if str(precision) not in PRECISIONS:
        raise RecipeError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return str(precision)


def autocast(device: str, precision: str):
    """``torch.autocast`` for ``bf16-mixed`` / ``16-mixed`` on ``device``; a no-op for ``32``."""
    import torch

    if check_precision(precision) == "32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float16
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def grad_scaler(device: str, precision: str):
    """The gradient scaler fp16 needs (``16-mixed``); disabled (a pass-through) otherwise."""
    import torch

    return torch.amp.GradScaler(torch.device(device).type, enabled=precision == "16-mixed")


def loader_options(device: str, workers: int = 0) -> dict[str, Any]:
    """DataLoader options that help a GPU: pinned memory, persistent workers."""
    on_gpu = torch_device_type(device) == "cuda"
    return {"num_workers": workers, "pin_memory": on_gpu, "persistent_workers": workers > 0}


def torch_device_type(device: str) -> str:
    return str(device).split(":", 1)[0]


# ------------------------------------------------------------------------------------ loggers

LOGGERS = ("none", "csv", "tensorboard")


class MetricLogger:
    """Training curves (loss, temperature, alignment, mean W, label confidence, eval metrics).

    ``kind``: ``none``, ``csv`` (``<log_dir>/metrics.csv``: step, name, value) or
    ``tensorboard`` (``torch.utils.tensorboard.SummaryWriter`` event files in ``log_dir``).
    """

    def __init__(self, kind: str, log_dir: str | os.PathLike) -> None:
        if kind not in LOGGERS:
            raise RecipeError(f"--logger must be one of {', '.join(LOGGERS)}, got {kind!r}")
        self.kind, self.log_dir = kind, Path(log_dir)
        self._writer: Any = None
        self._csv: Any = None
        if kind == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise RecipeError("--logger tensorboard needs the tensorboard package: "
                                  "pip install 'adaptcl[recipes]'") from err
            self._writer = SummaryWriter(log_dir=str(self.log_dir))
        elif kind == "csv":
            self.log_dir.mkdir(parents=True, exist_ok=True)
            path = self.log_dir / "metrics.csv"
            new = not path.exists()
            self._csv = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            if new:
                self._csv.write("step,name,value\n")

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for name, value in metrics.items():
            if value is None or isinstance(value, (list, tuple, dict, str)):
                continue
            value = float(value)
            if self._writer is not None:
                self._writer.add_scalar(name, value, step)
            elif self._csv is not None:
                self._csv.write(f"{step},{name},{value!r}\n")

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._csv is not None:
            self._csv.close()

    def __enter__(self) -> MetricLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def metric_logger(kind: str, log_dir: str | os.PathLike) -> MetricLogger:
    """The logger of plain-torch recipes (graphs, demo) for ``--logger kind``."""
    return MetricLogger(kind, log_dir)


def lightning_logger(kind: str, log_dir: str | os.PathLike, name: str = ""):
    """Lightning's own logger for ``--logger kind`` (``False`` for ``none``)."""
    if kind not in LOGGERS:
        raise RecipeError(f"--logger must be one of {', '.join(LOGGERS)}, got {kind!r}")
    if kind == "none":
        return False
    if kind == "csv":
        from pytorch_lightning.loggers import CSVLogger

        return CSVLogger(str(log_dir), name=name)
    from pytorch_lightning.loggers import TensorBoardLogger

    return TensorBoardLogger(str(log_dir), name=name)


# ------------------------------------------------------------------------------- plot hook


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
    for ax in axes:
        if not ax.lines and not ax.collections and not ax.patches and not ax.images:
            reason = getattr(ax, "_adaptcl_empty_reason", None) or "no data recorded for this panel"
            ax.text(0.5, 0.5, reason, ha="center", va="center", wrap=True, fontsize=9,
                    transform=ax.transAxes)
        elif ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return str(save_figure_atomic(fig, path))


def explain_empty(ax: Any, reason: str) -> None:
    """Mark a plot panel as intentionally empty, with the reason shown in the figure."""
    ax._adaptcl_empty_reason = reason


# ------------------------------------------------------------------------------ derived data


def load_or_rebuild(path: str | os.PathLike, load: Callable[[], Any], rebuild: Callable[[], Any],
                    *, what: str, stream: Any = None) -> Any:
    """``load()``; if the file at ``path`` is corrupt or truncated, say so, delete, ``rebuild()``.

    Used for files a framework writes on our behalf (torch-geometric's ``processed/``), caches
    and checkpoints: a kill mid-write must not break a dataset for good.
    """
    try:
        return load()
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, pickle.UnpicklingError) as err:
        target = Path(path)
        print(f"adaptcl: {what} at {target} is corrupt or truncated ({type(err).__name__}: "
              f"{str(err).splitlines()[0] if str(err) else ''}); rebuilding it",
              file=stream or sys.stderr, flush=True)
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
        return rebuild()


def torch_load_checked(path: str | os.PathLike, *, what: str, **kwargs: Any) -> Any | None:
    """``torch.load`` a checkpoint/cache; ``None`` if it is missing, or if it is corrupt (then a
    message names it and it is kept aside as ``<name>.corrupt`` for inspection)."""
    import torch

    path = Path(path)
    if not path.is_file():
        return None
    try:
        return torch.load(path, **kwargs)
    except Exception as err:  # noqa: BLE001 - any failure to read means: recompute
        print(f"adaptcl: {what} at {path} is corrupt or truncated ({type(err).__name__}); "
              f"kept aside as {path.name}.corrupt and recomputed", file=sys.stderr, flush=True)
        os.replace(path, path.with_name(path.name + ".corrupt"))
        return None


# ------------------------------------------------------------------------------ CLI vocabulary


def deprecation_note(message: str) -> None:
    print(f"adaptcl: note: {message}", file=sys.stderr, flush=True)


class _DeprecatedAlias(argparse.Action):
    """An old spelling of an option: stores into the new one and prints a deprecation note."""

    def __init__(self, option_strings, dest, new: str = "", convert=None, **kwargs):
        self.new, self.convert = new, convert
        kwargs["default"] = argparse.SUPPRESS  # the new spelling owns the default
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        deprecation_note(f"{option_string} is deprecated; use {self.new}")
        setattr(namespace, self.dest, self.convert(values) if self.convert else values)


def _split_items(values: Sequence[str], option: str) -> list[str]:
    items: list[str] = []
    for value in values:
        if "," in value:
            deprecation_note(f"comma-separated {option} is deprecated; separate values with "
                             "spaces")
            items.extend(v for v in value.split(",") if v.strip())
        else:
            items.append(value)
    return items


class ListAction(argparse.Action):
    """A space-separated list (``nargs='+'``); old comma-separated values still parse, with a note.

    ``item_type`` converts each item (argparse's ``type`` would see the comma form whole).
    """

    def __init__(self, option_strings, dest, item_type=str, **kwargs):
        self.item_type = item_type
        kwargs.setdefault("nargs", "+")
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        items = _split_items(list(values), option_string or self.dest)
        try:
            converted = [self.item_type(v) for v in items]
        except (ValueError, argparse.ArgumentTypeError) as err:
            parser.error(f"argument {option_string}: {err}")
        setattr(namespace, self.dest, converted)


def choice_type(choices: Sequence[str], what: str) -> Callable[[str], str]:
    """An argparse ``type`` matching ``choices`` case-insensitively; returns the canonical name."""
    canonical = {c.casefold(): c for c in choices}

    def parse(text: str) -> str:
        try:
            return canonical[text.casefold()]
        except KeyError:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {text!r}; choose from {', '.join(choices)}") from None

    parse.__name__ = what
    return parse


def canonical_choice(value: str, choices: Sequence[str], what: str) -> str:
    """The canonical spelling of ``value`` among ``choices`` (case-insensitive) or ValueError."""
    try:
        return choice_type(choices, what)(value)
    except argparse.ArgumentTypeError as err:
        raise ValueError(str(err)) from None


def _seed_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def add_common_arguments(parser: argparse.ArgumentParser, *, output_dir: str,
                         seeds: Sequence[int] | None = (0,), data_root: bool = True,
                         data_root_help: str = "benchmark data folder",
                         threads: int | None = 1, device: bool = True,
                         devices: bool = False, logger: bool = True) -> None:
    """The options every recipe spells the same way.

    ``--data-root`` (default ``$ADAPTCL_DATA``), ``--output-dir`` (old ``--out-dir``),
    ``--seeds`` space-separated (``seeds=None``: the recipe's preset supplies them) (old comma form and ``--seed`` accepted with a note),
    ``--threads`` (old ``--num-threads``), ``--device``, ``--precision``, ``--devices`` /
    ``--strategy`` (where the framework supports several devices), ``--logger``,
    ``--no-progress``.
    """
    if data_root:
        parser.add_argument("--data-root", default=None,
                            help=f"{data_root_help} (default: $ADAPTCL_DATA)")
    parser.add_argument("--output-dir", default=output_dir, help="where results are written")
    parser.add_argument("--out-dir", dest="output_dir", action=_DeprecatedAlias,
                        new="--output-dir", help=argparse.SUPPRESS)
    parser.add_argument("--seeds", action=ListAction, item_type=int, metavar="SEED",
                        default=argparse.SUPPRESS if seeds is None else list(seeds),
                        help="seeds, space-separated" + (" (default: the preset's)"
                                                         if seeds is None else ""))
    parser.add_argument("--seed", dest="seeds", action=_DeprecatedAlias, new="--seeds",
                        convert=_seed_list, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=threads,
                        help="torch CPU threads (recorded in the results)")
    parser.add_argument("--num-threads", dest="threads", action=_DeprecatedAlias, new="--threads",
                        convert=int, help=argparse.SUPPRESS)
    if device:
        parser.add_argument("--device", default="auto",
                            help="auto (CUDA when available, else CPU), cpu, cuda or cuda:N")
        parser.add_argument("--precision", choices=PRECISIONS, default="32",
                            help="training precision: 32, bf16-mixed or 16-mixed (fp16 with a "
                                 "gradient scaler)")
    if devices:
        parser.add_argument("--devices", type=int, default=1,
                            help="number of devices (Lightning; with --strategy ddp)")
        parser.add_argument("--strategy", default="auto", help="Lightning strategy, e.g. ddp")
    if logger:
        parser.add_argument("--logger", choices=LOGGERS, default="none",
                            help="training curves through the framework's logger")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bars")


def _optional(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return None if text.lower() == "none" else kind(text)

    parse.__name__ = getattr(kind, "__name__", "value")
    return parse


def add_config_arguments(parser: argparse.ArgumentParser, config_cls: type, *,
                         helps: Mapping[str, str] | None = None,
                         choices: Mapping[str, Sequence[str]] | None = None,
                         exclude: Sequence[str] = ()) -> None:
    """One option per field of the dataclass ``config_cls`` not registered yet.

    ``--field-name`` with the field's type (``X | None`` also takes ``none``; lists are
    space-separated; a ``bool`` defaulting to false is a flag, one defaulting to true gets
    ``--no-field-name``); ``choices`` entries match case-insensitively. Options not given on
    the command line stay absent from the namespace, so the dataclass (or a preset) supplies
    the default, which the help shows.
    """
    hints = typing.get_type_hints(config_cls)
    defaults = config_cls()
    registered = {action.dest for action in parser._actions}
    for spec in dataclasses.fields(config_cls):
        name = spec.name
        option = "--" + name.replace("_", "-")
        if name in exclude or name in registered:
            continue
        default = getattr(defaults, name)
        text = (helps or {}).get(name, name.replace("_", " "))
        if choices and name in choices:
            text += f"; one of {', '.join(choices[name])}"
        if not isinstance(default, bool):
            text += f" (default: {default})"
        hint = hints[name]
        args = typing.get_args(hint)
        optional = (isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union) \
            and type(None) in args
        if optional:
            hint = next(a for a in args if a is not type(None))
        kind: Any = typing.get_args(hint)[0] if typing.get_origin(hint) in (list, tuple) else hint
        if choices and name in choices:
            kind = choice_type(choices[name], name.replace("_", " "))
        common = dict(dest=name, default=argparse.SUPPRESS, help=text)
        if hint is bool:
            flag = option if not default else "--no-" + name.replace("_", "-")
            parser.add_argument(flag, action="store_false" if default else "store_true", **common)
        elif typing.get_origin(hint) in (list, tuple):
            parser.add_argument(option, action=ListAction, item_type=kind, metavar=name.upper(),
                                **common)
        else:
            parser.add_argument(option, type=_optional(kind) if optional else kind,
                                metavar=name.upper(), **common)


def config_kwargs(config_cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The fields of ``config_cls`` present in ``args`` (given, or common options)."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(config_cls)
            if hasattr(args, f.name)}
