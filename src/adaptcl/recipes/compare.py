"""``adaptcl compare``: one table and one plot over a setting, from several runs of one recipe.

A sweep is several invocations of one recipe that differ in one setting, each with its own
``--output-dir`` (``adaptcl images --batch-size 32``, ``64``, ``128``). ``adaptcl compare`` reads
their result JSONs and writes, per value of the ``--by`` setting(s): each loss's mean ±
population std over seeds, and each loss minus the baseline paired over seeds with a 95%
t-interval (the statistics of :mod:`adaptcl.recipes.template.store`). It refuses files that differ in
anything else that determines a result (a setting, the data fingerprint, the code version its
runs were computed with, as the run store beside each file records it, the recipe), naming
the field and both values, so a table never mixes runs made under other conditions; a partial
input makes a table marked partial. Recipes that fingerprint each dataset apart (``tu``,
``moleculenet``) can also be compared ``--by datasets``: one file per dataset, pooled into one
table, each dataset checked against the files that share it.

Outputs in ``--output-dir``: ``compare_<recipe>.json`` (inputs with their SHA-256, commit and
environment, the summaries), ``compare_<recipe>.md`` and ``compare_<recipe>.png`` (each metric
against the setting with std error bars per loss, and the paired difference with its 95% CI).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adaptcl.recipes.template.config import BOOKKEEPING
from adaptcl.recipes.template.errors import RecipeError, user_errors
from adaptcl.recipes.template.files import check_output_dir, read_json
from adaptcl.recipes.template.plots import draw_summaries, save_plot
from adaptcl.recipes.template.provenance import same_data
from adaptcl.recipes.template.report import read_results, summarize, summary_table, write_results
from adaptcl.recipes.template.store import Cell, RunStore

EXAMPLE = """for b in 32 64 128; do adaptcl images --batch-size $b --seeds 0 1 2 \\
    --output-dir results/sweep/b$b; done
adaptcl compare results/sweep/b*/images_simclr_cpu.json --by batch_size \\
    --output-dir results/sweep
adaptcl compare results/tu/MUTAG/results.json results/tu/DD/results.json --by datasets"""


def _code_versions(path: Path, result: dict[str, Any]) -> set[str]:
    """The code versions its runs were computed with: the result's ``code`` field, or (in files
    written before it existed) the identities in the run store beside the result file
    (``runs/<dataset>/<method>/seed<k>.json``); empty when neither is there."""
    if result.get("code"):
        return {json.dumps(code, sort_keys=True) for code in result["code"]}
    store = RunStore(path.parent)
    versions = set()
    for run in result.get("runs") or []:
        record = store.path(Cell(*run["cell"]))
        if record.is_file():
            code = (read_json(record).get("identity") or {}).get("code")
            if code is not None:
                versions.add(json.dumps(code, sort_keys=True))
    return versions


def _fixed_settings(result: dict[str, Any], by: Sequence[str]) -> dict[str, Any]:
    skip = set(BOOKKEEPING) | set(by)
    return {k: v for k, v in result["config"].items() if k not in skip}


def _hashable(value: Any) -> Any:
    """A config value as a dict key (list-valued settings such as ``datasets`` become tuples)."""
    return tuple(_hashable(v) for v in value) if isinstance(value, list | tuple) else value


def _label(by: Sequence[str], values: Sequence[Any]) -> str:
    def show(value: Any) -> str:
        return " ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)

    return ", ".join(f"{field}={show(value)}" for field, value in zip(by, values, strict=True))


def _numeric(values: tuple) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def _sort_key(values: tuple, position: int) -> tuple:
    """Numbers in ascending order (a batch-size sweep); anything else in command-line order."""
    return (0, values, 0) if _numeric(values) else (1, (), position)


def compare_results(paths: Sequence[str | Path], by: Sequence[str], *,
                    metrics: Sequence[str] | None = None, losses: Sequence[str] | None = None,
                    baseline: str | None = None, output_dir: str | Path = "results/compare",
                    plot: bool = True) -> dict[str, Any]:
    """Pool the result files ``paths`` over the settings ``by``; write JSON, markdown and PNG.

    Every other setting that determines a result (all config fields but
    :data:`adaptcl.recipes.template.config.BOOKKEEPING` and ``by``), the recipe, the data fingerprint
    and the code version of the runs (read from the run store beside each file, where there is
    one) must agree across files, and each file must have its own value of ``by``. ``metrics``
    defaults to every metric of the first file, ``losses`` to every loss found (in order of
    appearance), ``baseline`` to the one the first file's recipe paired against (else the first
    loss).

    Examples:
        >>> compare_results(["b32/images_simclr_cpu.json", "b64/images_simclr_cpu.json"],
        ...                 by=["batch_size"], output_dir="sweep")  # doctest: +SKIP
    """
    if not paths:
        raise RecipeError("give at least one result file")
    by = list(by)
    if not by:
        raise RecipeError("--by needs at least one setting")
    with user_errors():
        check_output_dir(output_dir)
    loaded = [read_results(Path(p)) for p in paths]
    results = [result for result, _ in loaded]
    digests = {Path(p): digest for p, (_, digest) in zip(paths, loaded, strict=True)}
    first, first_path = results[0], Path(paths[0])
    fixed = _fixed_settings(first, by)
    groups: dict[tuple, tuple[Path, dict[str, Any]]] = {}
    codes: set[str] = set()
    for path, result in zip(map(Path, paths), results, strict=True):
        if result["recipe"] != first["recipe"]:
            raise RecipeError(f"{path} is a {result['recipe']!r} result, {first_path} a "
                              f"{first['recipe']!r} one")
        absent = [f for f in by if f not in result["config"]]
        if absent:
            raise RecipeError(f"--by {' '.join(absent)}: not a setting of {result['recipe']} "
                              f"(in {path})")
        other = _fixed_settings(result, by)
        for key in sorted(set(fixed) | set(other)):
            if fixed.get(key) != other.get(key):
                raise RecipeError(
                    f"{path} differs from {first_path} in {key} ({other.get(key)!r} vs "
                    f"{fixed.get(key)!r}); only the --by settings ({', '.join(by)}) may differ")
        data = (result.get("environment") or {}).get("data_fingerprint")
        for seen_path, seen in groups.values():  # every file before this one, the first included
            if not same_data(data, (seen.get("environment") or {}).get("data_fingerprint")):
                raise RecipeError(f"{path} was computed on other data than {seen_path} (data "
                                  "fingerprints differ)")
        code = _code_versions(path, result)
        if len(code) > 1:
            raise RecipeError(f"the runs of {path} were computed with {len(code)} code versions")
        if code and codes and code != codes:
            raise RecipeError(f"{path} was computed with other code than {first_path} "
                              f"({sorted(code)[0]} vs {sorted(codes)[0]})")
        codes = codes or code
        key = tuple(_hashable(result["config"][f]) for f in by)
        if key in groups:
            raise RecipeError(f"{path} and {groups[key][0]} both have {_label(by, key)}")
        groups[key] = (path, result)

    position = {key: i for i, key in enumerate(groups)}
    order = sorted(groups, key=lambda key: _sort_key(key, position[key]))
    metrics = list(metrics or first["summary"])
    methods = list(dict.fromkeys(m for k in order for summary in groups[k][1]["summary"].values()
                                 for entry in summary.values() for m in entry["methods"]))
    if losses:
        unknown = [m for m in losses if m not in methods]
        if unknown:
            raise RecipeError(f"--losses {' '.join(unknown)}: not in these results "
                              f"({', '.join(methods)})")
        methods = list(losses)
    if baseline is None:  # the files' own baseline (Report records it), else the first loss
        own = first.get("baseline")
        baseline = own if own in methods else (methods[0] if methods else None)
    if baseline is not None and baseline not in methods:
        raise RecipeError(f"--baseline {baseline!r} is not a loss of these results "
                          f"({', '.join(methods)})")
    for key in order:
        path, result = groups[key]
        for metric in metrics:
            if metric not in result["summary"]:
                raise RecipeError(f"{path} has no metric {metric!r} (it has "
                                  f"{', '.join(result['summary'])})")
    # a file's datasets: one per file (a sweep, or --by datasets) labels rows by the setting alone
    held = {k: list(groups[k][1]["summary"][metrics[0]]) for k in order}
    single = all(len(names) == 1 for names in held.values())
    records: dict[Cell, dict[str, Any]] = {}
    rows: list[str] = []
    for key in order:
        path, result = groups[key]
        for dataset in held[key]:
            row = _label(by, key) if single else f"{dataset}, {_label(by, key)}"
            rows.append(row)
            for metric in metrics:
                entry = result["summary"][metric].get(dataset, {"methods": {}})
                for method, stats in entry["methods"].items():
                    for seed, value in zip(stats["seeds"], stats["values"], strict=True):
                        cell = Cell(row, method, int(seed))
                        records.setdefault(cell, {"metrics": {}})["metrics"][metric] = value

    summaries = {m: summarize(records, m, datasets=rows, methods=methods,
                                     baseline=baseline) for m in metrics}
    head = ", ".join(by) if single else f"dataset, {', '.join(by)}"
    tables = {m: summary_table(summaries[m], methods=methods, baseline=baseline,
                                      row_header=head) for m in metrics}
    inputs = [{"path": str(groups[k][0]), "sha256": digests[groups[k][0]],
               "by": dict(zip(by, k, strict=True)),
        "partial": bool(groups[k][1].get("partial")),
        "total_train_seconds": groups[k][1].get("total_train_seconds"),
        "environment": groups[k][1].get("environment")} for k in order]
    partial = any(i["partial"] for i in inputs)
    out = Path(output_dir)
    stem = f"compare_{first['recipe']}"
    result: dict[str, Any] = {
        "recipe": "compare", "compared_recipe": first["recipe"], "by": by,
        "metrics": metrics, "baseline": baseline, "settings": fixed,
        "code": [json.loads(c) for c in sorted(codes)], "inputs": inputs,
        "partial": partial, "missing": [c for k in order for c in groups[k][1].get("missing") or []],
        "summary": summaries, "tables": tables, "table_markdown": tables[metrics[0]]}
    header = (f"# {first['recipe']} by {', '.join(by)}\n\nMean ± population std over seeds"
              + (f"; each loss minus {baseline} paired over seeds with a 95% t-interval"
                 if len(methods) > 1 else "") + ".\n\n")
    body = "\n".join(f"## {m}\n\n{tables[m]}" for m in metrics)
    foot = "\n_Inputs: " + "; ".join(
        f"{i['path']} ({_label(by, list(i['by'].values()))}: commit "
        f"{(i['environment'] or {}).get('git_commit')}, {(i['environment'] or {}).get('cpu')}, "
        f"{(i['environment'] or {}).get('torch_threads')} threads, "
        f"{float(i['total_train_seconds'] or 0):.0f} s training"
        f"{', PARTIAL' if i['partial'] else ''})" for i in inputs) + "._\n"
    result["outputs"] = write_results(out, stem, result, header + body + foot)
    if plot:
        result["outputs"]["png"] = save_plot(
            out / f"{stem}.png", lambda axes: draw_summaries(
                axes, summaries, rows, methods, baseline, metrics, by,
                numeric=all(map(_numeric, order))),
            title=f"{first['recipe']}: {', '.join(metrics)} by {', '.join(by)}",
            ncols=len(metrics) + (1 if baseline is not None and len(methods) > 1 else 0),
            figsize=(5.0 * (len(metrics) + 1), 4.0))
    return result


class CompareCommand:
    """``adaptcl compare``: what the CLI needs of a recipe module (``add_arguments``, ``example``,
    ``main``). Not a :class:`~adaptcl.recipes.template.recipe.Recipe`: compare computes no cells
    and has no config dataclass; it reads finished result files (positional arguments) and pools
    their summaries, so the template's grid, store and shared options (seeds, device, threads)
    do not apply."""

    name = "compare"
    example = EXAMPLE

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Register the ``adaptcl compare`` options."""
        parser.add_argument("results", nargs="+", metavar="RESULT_JSON",
                            help="result files of one recipe (e.g. <output-dir>/results.json)")
        parser.add_argument("--by", nargs="+", required=True, metavar="SETTING",
                            help="the config field(s) the files differ in, e.g. batch_size")
        parser.add_argument("--metrics", nargs="+", default=None, metavar="METRIC",
                            help="metrics to tabulate (default: every metric of the first file)")
        parser.add_argument("--losses", nargs="+", default=None, metavar="LOSS",
                            help="losses to tabulate, in this order (default: every loss found)")
        parser.add_argument("--baseline", default=None,
                            help="the loss the others are paired against (default: the first)")
        parser.add_argument("--output-dir", default="results/compare",
                            help="where compare_<recipe>.json/.md/.png go")
        parser.add_argument("--no-plot", dest="plot", action="store_false", help="skip the PNG")

    @classmethod
    def main(cls, args: argparse.Namespace) -> int:
        """Compare the files of the command line; print the table and where the files are."""
        result = compare_results(args.results, [b.replace("-", "_") for b in args.by],
                                 metrics=args.metrics, losses=args.losses,
                                 baseline=args.baseline, output_dir=args.output_dir,
                                 plot=args.plot)
        print(result["table_markdown"])
        print(f"results: {result['outputs']['json']}  table: {result['outputs']['markdown']}")
        return 0


RECIPE = CompareCommand
