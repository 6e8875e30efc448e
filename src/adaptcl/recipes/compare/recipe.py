"""``adaptcl compare``: one table and one plot over a setting, from several runs of one recipe.

Files that differ in anything but the ``--by`` settings (another setting, data, code or recipe)
are refused, naming the field; the docs page ``docs/recipes/compare.md`` has the details.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adaptcl.recipes.engine.cells import Cell
from adaptcl.recipes.engine.command_line import terminal_text
from adaptcl.recipes.engine.errors import RecipeError, user_errors
from adaptcl.recipes.engine.files import check_output_dir
from adaptcl.recipes.engine.plots import draw_summaries, save_plot
from adaptcl.recipes.engine.provenance import same_data
from adaptcl.recipes.engine.report import read_results, write_results
from adaptcl.recipes.engine.summary import summarize, summary_table

EXAMPLE = """adaptcl compare results/b32/results.json results/b256/results.json --by batch_size
adaptcl compare results/tu/MUTAG/results.json results/tu/DD/results.json --by datasets"""


def _hashable(value: Any) -> Any:
    """A setting as a dict key (list-valued settings such as ``datasets`` become tuples)."""
    return tuple(_hashable(v) for v in value) if isinstance(value, list | tuple) else value


def _label(by: Sequence[str], values: Sequence[Any]) -> str:
    def show(value: Any) -> str:
        return " ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)

    return ", ".join(f"{field}={show(value)}" for field, value in zip(by, values, strict=True))


def _numeric(values: tuple) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def _value(result: dict[str, Any], field: str) -> Any:
    """A file's value of the setting ``field``."""
    if field in result["config"]:
        return result["config"][field]
    raise RecipeError(f"--by {field}: not a setting of {result['recipe']} "
                      f"({', '.join(result['config'])})")


def _fixed(result: dict[str, Any], by: Sequence[str]) -> dict[str, Any]:
    """What determines the file's results, but the ``--by`` settings and its swept ones."""
    skip = set(by) | set(result.get("sweep") or {})
    return {k: v for k, v in result["settings"].items() if k not in skip}


def _check_same(path: Path, result: dict[str, Any], first: tuple[Path, dict[str, Any]],
                seen: Sequence[tuple[Path, dict[str, Any]]], by: Sequence[str]) -> None:
    """Refuse a file that differs from the first in anything but ``by``, naming the field."""
    first_path, first_result = first
    if result["recipe"] != first_result["recipe"]:
        raise RecipeError(f"{path} is a {result['recipe']!r} result, {first_path} a "
                          f"{first_result['recipe']!r} one")
    fixed, other = _fixed(first_result, by), _fixed(result, by)
    for key in sorted(set(fixed) | set(other)):
        if fixed.get(key) != other.get(key):
            raise RecipeError(f"{path} differs from {first_path} in {key} ({other.get(key)!r} vs "
                              f"{fixed.get(key)!r}); only the --by settings ({', '.join(by)}) "
                              "may differ")
    data = (result.get("environment") or {}).get("data_fingerprint")
    for seen_path, seen_result in seen:
        if not same_data(data, (seen_result.get("environment") or {}).get("data_fingerprint")):
            raise RecipeError(f"{path} was computed on other data than {seen_path} (data "
                              "fingerprints differ)")
    code, first_code = ({json.dumps(c, sort_keys=True) for c in r.get("code") or []}
                        for r in (result, first_result))
    if len(code) > 1:
        raise RecipeError(f"the runs of {path} were computed with {len(code)} code versions")
    if code and first_code and code != first_code:
        raise RecipeError(f"{path} was computed with other code than {first_path}")


def _load(paths: Sequence[str | Path], by: Sequence[str]) -> dict[tuple, tuple[Path, dict]]:
    """The files by their ``by`` values, each checked against the first."""
    groups: dict[tuple, tuple[Path, dict[str, Any]]] = {}
    first: tuple[Path, dict[str, Any]] | None = None
    for path in map(Path, paths):
        result, digest = read_results(path)
        result["sha256"] = digest
        first = first or (path, result)
        _check_same(path, result, first, list(groups.values()), by)
        key = tuple(_hashable(_value(result, f)) for f in by)
        if key in groups:
            raise RecipeError(f"{path} and {groups[key][0]} both have {_label(by, key)}")
        groups[key] = (path, result)
    position = {key: i for i, key in enumerate(groups)}
    # numbers in ascending order (a batch-size sweep); anything else in command-line order
    order = sorted(groups, key=lambda k: (0, k, 0) if _numeric(k) else (1, (), position[k]))
    return {k: groups[k] for k in order}


def _methods(groups: dict[tuple, tuple[Path, dict]], losses: Sequence[str] | None,
             baseline: str | None) -> tuple[list[str], str | None]:
    found = list(dict.fromkeys(m for _, r in groups.values() for s in r["summary"].values()
                               for e in s.values() for m in e["methods"]))
    unknown = [m for m in losses or () if m not in found]
    if unknown:
        raise RecipeError(f"--losses {' '.join(unknown)}: not in these results "
                          f"({', '.join(found)})")
    methods = list(losses or found)
    if baseline is None:  # the files' own baseline, else the first loss
        own = next(iter(groups.values()))[1].get("baseline")
        baseline = own if own in methods else (methods[0] if methods else None)
    if baseline is not None and baseline not in methods:
        raise RecipeError(f"--baseline {baseline!r} is not a loss of these results "
                          f"({', '.join(methods)})")
    return methods, baseline


def _pool(groups: dict[tuple, tuple[Path, dict]], by: Sequence[str], metrics: Sequence[str]
          ) -> tuple[dict[Cell, dict[str, Any]], list[str], bool]:
    """Every file's values per seed as the records of one grid: a row per file (per file and
    dataset where a file holds several), and whether every file holds one row."""
    held = {k: list(r["summary"][metrics[0]]) for k, (_, r) in groups.items()}
    single = all(len(rows) == 1 for rows in held.values())
    records: dict[Cell, dict[str, Any]] = {}
    rows: list[str] = []
    for key, (_, result) in groups.items():
        for own in held[key]:
            row = _label(by, key) if single else f"{own}, {_label(by, key)}"
            rows.append(row)
            for metric in metrics:
                entry = result["summary"][metric].get(own, {"methods": {}})
                for method, stats in entry["methods"].items():
                    for seed, value in zip(stats["seeds"], stats["values"], strict=True):
                        cell = Cell((("row", row), ("method", method)), int(seed))
                        records.setdefault(cell, {"metrics": {}})["metrics"][metric] = value
    return records, rows, single


def _markdown(result: dict[str, Any], n_methods: int) -> str:
    """``results.md``: what was pooled, a table per metric, and each input's provenance."""
    by, baseline = result["by"], result["baseline"]
    header = (f"# {result['compared_recipe']} by {', '.join(by)}\n\nMean ± population std over "
              "seeds" + (f"; each loss minus {baseline} paired over seeds with a 95% t-interval"
                         if n_methods > 1 else "") + ".\n\n")
    foot = "\n_Inputs: " + "; ".join(
        f"{i['path']} ({_label(by, list(i['by'].values()))}: commit "
        f"{(i['environment'] or {}).get('git_commit')}, {(i['environment'] or {}).get('cpu')}, "
        f"{float(i['total_train_seconds'] or 0):.0f} s training"
        f"{', PARTIAL' if i['partial'] else ''})" for i in result["inputs"]) + "._\n"
    return header + "\n".join(f"## {m}\n\n{result['tables'][m]}" for m in result["metrics"]) + foot


def compare_results(paths: Sequence[str | Path], by: Sequence[str], *,
                    metrics: Sequence[str] | None = None, losses: Sequence[str] | None = None,
                    baseline: str | None = None, output_dir: str | Path = "results/compare",
                    plot: bool = True) -> dict[str, Any]:
    """Pool the result files ``paths`` over the settings ``by``; write JSON, markdown and PNG.

    ``metrics`` defaults to every metric of the first file, ``losses`` to every loss found (in
    order of appearance), ``baseline`` to the one the first file's recipe paired against.
    """
    if not paths or not by:
        raise RecipeError("give at least one result file and one --by setting")
    with user_errors():
        check_output_dir(output_dir)
    groups = _load(paths, list(by))
    first = next(iter(groups.values()))[1]
    metrics = list(metrics or first["summary"])
    methods, baseline = _methods(groups, losses, baseline)
    missing = [(p, m) for p, r in groups.values() for m in metrics if m not in r["summary"]]
    if missing:
        raise RecipeError(f"{missing[0][0]} has no metric {missing[0][1]!r}")
    records, rows, single = _pool(groups, by, metrics)
    summaries = {m: summarize(records, m, methods=methods, baseline=baseline, rows=rows)
                 for m in metrics}
    head = ", ".join(by) if single else f"dataset, {', '.join(by)}"
    tables = {m: summary_table(summaries[m], methods=methods, baseline=baseline, row_header=head)
              for m in metrics}
    inputs = [{"path": str(p), "sha256": r["sha256"], "by": dict(zip(by, k, strict=True)),
               "partial": bool(r.get("partial")), "environment": r.get("environment"),
               "total_train_seconds": r.get("total_train_seconds")}
              for k, (p, r) in groups.items()]
    result: dict[str, Any] = {
        "recipe": "compare", "compared_recipe": first["recipe"], "by": list(by),
        "metrics": metrics, "baseline": baseline, "settings": _fixed(first, by),
        "code": first.get("code"), "inputs": inputs,
        "partial": any(i["partial"] for i in inputs),
        "missing": [c for _, r in groups.values() for c in r.get("missing") or []],
        "summary": summaries, "tables": tables, "table_markdown": tables[metrics[0]]}
    result["outputs"] = write_results(output_dir, result, _markdown(result, len(methods)))
    if plot:
        result["outputs"]["png"] = save_plot(
            Path(output_dir) / "compare.png", lambda axes: draw_summaries(
                axes, summaries, rows, methods, baseline, metrics, list(by),
                numeric=all(map(_numeric, groups))),
            title=f"{first['recipe']}: {', '.join(metrics)} by {', '.join(by)}",
            ncols=len(metrics) + (1 if baseline is not None and len(methods) > 1 else 0),
            figsize=(5.0 * (len(metrics) + 1), 4.0))
    return result


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


class Compare:
    """``adaptcl compare``: reads finished result files (positional arguments) and pools their
    summaries; it computes no cell, so the engine's grid, store and settings do not apply."""

    name, example = "compare", EXAMPLE

    @classmethod
    def main(cls, argv: Sequence[str], prog: str) -> int:
        parser = _Parser(prog=prog, description=terminal_text(__doc__.splitlines()[0]),
                         epilog="example:\n" + EXAMPLE,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("paths", nargs="+", metavar="RESULT_JSON",
                            help="result files of one recipe (<output-dir>/results.json)")
        parser.add_argument("--by", nargs="+", required=True, metavar="SETTING",
                            help="the setting(s) the files differ in, e.g. batch_size")
        parser.add_argument("--metrics", nargs="+", metavar="METRIC",
                            help="metrics to tabulate (default: every metric of the first file)")
        parser.add_argument("--losses", nargs="+", metavar="LOSS",
                            help="losses to tabulate, in this order (default: every loss found)")
        parser.add_argument("--baseline", help="the loss the others are paired against")
        parser.add_argument("--output-dir", default="results/compare",
                            help="where results.json/.md and compare.png go")
        parser.add_argument("--no-plot", dest="plot", action="store_false", help="skip the PNG")
        args = vars(parser.parse_args(list(argv)))
        result = compare_results(**args | {"by": [b.replace("-", "_") for b in args["by"]]})
        print(result["table_markdown"])
        print(f"results: {result['outputs']['json']}  table: {result['outputs']['markdown']}",
              file=sys.stdout)
        return 0


RECIPE = Compare
