"""The numbers of each part of ``tools/gpu_check.py``, read from what it wrote, and the one
markdown report of them all.

* ``pytest``: its junit XML (counts, and each failure's test id with the first line of its
  message);
* ``bench``: ``bench_gpu.py``'s JSON: one row per loss case and SimCLR step;
* ``targets``: ``bench_gpu.py --targets``' JSON: one row per kernel case with its target;
* ``recipe``: the recipe's ``results.json``: every summary mean (metric, dataset, method),
  the failed cells, and for ``images`` the time per epoch (``results.json``'s own if a run
  records it, else its ``train_seconds`` divided by the epochs).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

MIB = 2**20


def parse_part(part, record: dict[str, Any]) -> dict[str, Any]:
    """What ``part`` (a :class:`gpu_check_run.Part`) measured; ``{"missing": why}`` when its
    output file is not there (a part that failed or timed out early)."""
    parser = {"pytest": parse_pytest, "bench": parse_bench, "recipe": parse_recipe,
              "targets": parse_targets}[part.parse]
    try:
        return parser(Path(part.artifact), record)
    except FileNotFoundError as error:
        return {"missing": f"no {Path(error.filename or part.artifact).name}"}
    except (ValueError, KeyError, TypeError, ET.ParseError) as error:
        return {"missing": f"unreadable output: {type(error).__name__}: {error}"}


def parse_pytest(junit: Path, record: dict[str, Any]) -> dict[str, Any]:
    suites = ET.parse(junit).getroot()
    suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
    counts = {k: int(suite.get(k + "s", suite.get(k, 0))) for k in ("failure", "error", "skipped")}
    tests = int(suite.get("tests", 0))
    failed = []
    for case in suite.iter("testcase"):
        bad = case.find("failure")
        bad = bad if bad is not None else case.find("error")
        if bad is not None:
            test_id = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            failed.append({"test": test_id, "message": (message or [""])[0][:300]})
    return {"counts": {"passed": tests - sum(counts.values()), "failed": counts["failure"],
                       "errors": counts["error"], "skipped": counts["skipped"]},
            "seconds": float(suite.get("time", 0.0)), "failures": failed}


def parse_bench(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    data = json.loads(path.read_text())
    rows = []
    for r in data["losses"]:
        rows.append({"loss": r["loss"], "dtype": r["dtype"], "dim": r["dim"], "batch": r["batch"],
                     "status": r["status"], **_timing(r), "peer": r.get("peer"),
                     "time_vs_peer": _round(r.get("time_vs_peer"), 3),
                     "memory_vs_peer": _round(r.get("memory_vs_peer"), 3)})
    for r in data.get("simclr_step", []):
        rows.append({"loss": f"SimCLR step: {r['loss']}", "dtype": r["dtype"], "dim": None,
                     "batch": r["batch"], "status": r["status"], **_timing(r),
                     "peer": "lightly NTXentLoss",
                     "time_vs_peer": _round(r.get("time_vs_lightly_ntxent"), 3),
                     "memory_vs_peer": _round(r.get("memory_vs_lightly_ntxent"), 3)})
    return {"rows": rows, "gpu": data["environment"].get("gpu")}


def parse_targets(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    data = json.loads(path.read_text())
    rows = [{"case": r["case"], "batch": r.get("batch"), "dim": r.get("dim"),
             "backend": r.get("backend"), "status": r["status"], **_timing(r),
             "first_s": _round(r.get("first_s"), 2), "target": r.get("target"),
             "ratio": _round(r.get("ratio"), 3), "met": r.get("met")} for r in data["targets"]]
    return {"targets": rows, "gpu": data["environment"].get("gpu")}


def _round(value, digits: int):
    return None if value is None else round(value, digits)


def _timing(r: dict[str, Any]) -> dict[str, Any]:
    ok = r["status"] == "ok"
    peak = r.get("peak_bytes") if ok else None
    return {"time_ms": _round(r["time_s"] * 1e3, 3) if ok else None,
            "peak_mib": None if peak is None else round(peak / MIB, 1),
            "error": None if ok else r.get("error")}


def parse_recipe(folder: Path, record: dict[str, Any]) -> dict[str, Any]:
    data = json.loads((folder / "results.json").read_text())
    means = [{"metric": metric, "dataset": dataset, "method": method,
              "value": _round(stats["mean"], 4), "n": stats.get("n")}
             for metric, by_dataset in data["summary"].items()
             for dataset, table in by_dataset.items()
             for method, stats in table["methods"].items()]
    out = {"means": means, "failed_cells": len(data.get("failed") or []),
           "train_seconds": _round(data.get("total_train_seconds"), 2)}
    if data.get("recipe") == "images" or folder.name == "images":
        out["epoch_seconds"] = [epoch_time(run, data) for run in data.get("runs", [])]
    return out


def epoch_time(run: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """Seconds per epoch of one images run: a field of the run naming epochs and seconds or
    time if there is one, else ``train_seconds`` / epochs (first epoch's start-up included)."""
    label = "/".join(str(v) for v in run.get("cell", {}).values())
    for key, value in run.items():
        if "epoch" in key and ("second" in key or "time" in key):
            if isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
                return {"run": label, "seconds": round(sum(value) / len(value), 3),
                        "per_epoch": [round(v, 3) for v in value], "source": f"results.json {key}"}
            if isinstance(value, (int, float)):
                return {"run": label, "seconds": round(value, 3), "source": f"results.json {key}"}
    epochs = (data.get("config") or {}).get("epochs")
    epochs = epochs[0] if isinstance(epochs, list) else epochs
    train = run.get("train_seconds")
    if not epochs or train is None:
        return {"run": label, "seconds": None, "source": "no epoch count or train_seconds"}
    return {"run": label, "seconds": round(train / epochs, 3),
            "source": f"train_seconds / {epochs} epochs (start-up included)"}


# ------------------------------------------------------------------------------ markdown


def _cell(value, fmt: str = "") -> str:
    return "-" if value is None else format(value, fmt)


def render(report: dict[str, Any]) -> str:
    """``report.md``: where it ran, one line per part, then each part's command and numbers."""
    env = report["environment"]
    out = [f"# GPU check: {env.get('gpu') or report['device']}", "",
           f"`tools/gpu_check.py {' '.join(report['argv'])}`: device {report['device']}, "
           f"{report['size']} settings, started {report['started']}, {report['wall_s']:.0f} s "
           f"of a {report['budget_s']:.0f} s budget; data {report['data_root']}.", "",
           "## Environment", "", "| | |", "| --- | --- |"]
    out += [f"| {key} | {_cell(value)} |" for key, value in env.items()]
    out += ["", "## Parts", "", "| part | status | exit status | wall s | limit s |",
            "| --- | --- | ---: | ---: | ---: |"]
    out += [f"| {p['name']} | {p['status']} | {_cell(p['exit_status'])} | {p['wall_s']:.1f} "
            f"| {p['limit_s']:g} |" for p in report["parts"]]
    for part in report["parts"]:
        out += ["", f"## {part['name']}: {part['title']}", "", "```bash", part["command"], "```",
                "", f"**{part['status']}**" + (f": {part['reason']}" if part.get("reason") else ""),
                *[f"\n{note}" for note in part.get("notes", [])]]
        results = part.get("results") or {}
        if "missing" in results:
            out += ["", f"No numbers: {results['missing']}."]
        out += RENDERERS.get(_kind(results), lambda _r: [])(results)
        if part["status"] not in ("ok", "skipped") and part.get("log_tail"):
            out += ["", "End of its output:", "", "```text", part["log_tail"].rstrip(), "```"]
    return "\n".join(out) + "\n"


def _kind(results: dict[str, Any]) -> str:
    return next((k for k in ("counts", "rows", "means", "targets") if k in results), "")


def _render_pytest(results: dict[str, Any]) -> list[str]:
    counts = ", ".join(f"{n} {k}" for k, n in results["counts"].items())
    out = ["", f"Tests: {counts} in {results['seconds']:.0f} s."]
    if results.get("failures"):
        out += ["", "Failed:", ""]
        out += [f"- `{f['test']}`: {f['message']}" for f in results["failures"]]
    return out


def _render_bench(results: dict[str, Any]) -> list[str]:
    out = ["", "| loss | dtype | dim | batch | time ms | peak MiB | peer | time / peer |",
           "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in results["rows"]:
        time_ms = _cell(r["time_ms"], ".2f") if r["status"] == "ok" else r["status"]
        out.append(f"| {r['loss']} | {r['dtype']} | {_cell(r['dim'])} | {r['batch']:,} "
                   f"| {time_ms} | {_cell(r['peak_mib'], '.1f')} | {r['peer'] or '-'} "
                   f"| {_cell(r['time_vs_peer'], '.2f')} |")
    return out


def _render_recipe(results: dict[str, Any]) -> list[str]:
    out = ["", "| metric | dataset | method | mean | seeds |", "| --- | --- | --- | ---: | ---: |"]
    out += [f"| {m['metric']} | {m['dataset']} | {m['method']} | {_cell(m['value'], '.2f')} "
            f"| {_cell(m['n'])} |" for m in results["means"]]
    out += ["", f"Failed cells: {results['failed_cells']}; training "
                f"{_cell(results['train_seconds'], '.1f')} s in all."]
    for e in results.get("epoch_seconds", []):
        out.append(f"- time per epoch, {e['run']}: {_cell(e['seconds'], '.2f')} s ({e['source']})")
    return out


def _render_targets(results: dict[str, Any]) -> list[str]:
    out = ["", "| case | rows x dim | backend | time ms | first call s | peak MiB | target "
               "| ratio | met |", "| --- | ---: | --- | ---: | ---: | ---: | --- | ---: | :---: |"]
    for r in results["targets"]:
        size = "-" if r["batch"] is None else f"{r['batch']:,} x {r['dim']}"
        time_ms = _cell(r["time_ms"], ",.2f") if r["status"] == "ok" else r["status"]
        met = {True: "yes", False: "**no**", None: "-"}[r["met"]]
        out.append(f"| {r['case']} | {size} | {r['backend']} | {time_ms} "
                   f"| {_cell(r['first_s'], '.2f')} | {_cell(r['peak_mib'], '.0f')} "
                   f"| {r['target'] or '-'} | {_cell(r['ratio'], '.2f')} | {met} |")
    return out


RENDERERS = {"counts": _render_pytest, "rows": _render_bench, "means": _render_recipe,
             "targets": _render_targets}
