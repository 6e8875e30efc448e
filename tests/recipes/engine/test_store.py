"""Several processes on one output folder: one cell is never computed twice at once, a run with
other settings for a cell another live run computes is refused up front, different cells run
in parallel. Real processes (a toy compute that waits for an event file; no training)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adaptcl.recipes.engine.active_runs import ActiveRuns
from adaptcl.recipes.engine.cells import RunLayout
from adaptcl.recipes.engine.errors import RecipeError
from adaptcl.recipes.engine.store import RunStore
from tests.recipes.engine._toy import cell as Cell

SCRIPT = str(Path(__file__).with_name("_toy_grid.py"))
SRC = str(Path(__file__).resolve().parents[3] / "src")


def _start(out: Path, events: Path, epochs: int, seeds, barrier: int = 0) -> subprocess.Popen:
    env = os.environ | {"PYTHONPATH": os.pathsep.join(
        [SRC, *filter(None, [os.environ.get("PYTHONPATH")])])}
    for name in ("RANK", "LOCAL_RANK", "NODE_RANK"):
        env.pop(name, None)
    stderr = events.parent / f"stderr-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, str(out), str(events), "--epochs", str(epochs), "--seeds",
         *map(str, seeds), "--barrier", str(barrier)],
        env=env, stdout=subprocess.PIPE, stderr=stderr.open("w"), text=True)
    proc.stderr_path = stderr  # read while it runs
    return proc


def _finish(proc: subprocess.Popen) -> tuple[int, dict | None, str]:
    out, _ = proc.communicate(timeout=90)
    err = proc.stderr_path.read_text()
    return proc.returncode, json.loads(out) if proc.returncode == 0 else None, err


def _wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _starts(events: Path, seed: int) -> list[Path]:
    return list(events.glob(f"start-seed{seed}-*"))


def _stored_acc(out: Path, seed: int) -> float:
    return json.loads(RunStore(out).path(Cell("d", "m", seed)).read_text())["record"][
        "metrics"]["acc"]


def test_other_settings_for_a_cell_a_live_run_computes_are_refused_up_front(tmp_path):
    out, events = tmp_path / "out", tmp_path / "events"
    events.mkdir()
    first = _start(out, events, epochs=2, seeds=[0, 1])
    _wait_for(lambda: _starts(events, 0), "the first run to start computing")
    second = _start(out, events, epochs=3, seeds=[1, 0])
    code, _, err = _finish(second)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("toy: error: d/m/seed1 in ") and "with other settings" in err
    assert f"process {first.pid}" in err and "use another --output-dir or wait for it" in err
    assert len(list(events.glob("start-*"))) == 1  # the refused run computed nothing
    (events / "go").touch()
    code, first_result, _ = _finish(first)
    assert code == 0 and first_result == {"computed": [0, 1], "reused": [], "superseded": 0}
    assert [_stored_acc(out, s) for s in (0, 1)] == [2.0, 2.1]  # nothing clobbered
    assert not list((out / "runs" / ".active").glob("*.json"))  # unregistered at the end

    # once the first run is over, other settings supersede its records as before
    code, later, _ = _finish(_start(out, events, epochs=3, seeds=[0, 1]))
    assert code == 0 and later == {"computed": [0, 1], "reused": [], "superseded": 2}
    assert [_stored_acc(out, s) for s in (0, 1)] == [3.0, 3.1]


def test_same_cells_same_settings_wait_and_reuse_instead_of_computing_again(tmp_path):
    out, events = tmp_path / "out", tmp_path / "events"
    events.mkdir()
    first = _start(out, events, epochs=2, seeds=[0, 1])
    _wait_for(lambda: _starts(events, 0), "the first run to start computing")
    second = _start(out, events, epochs=2, seeds=[0, 1])
    _wait_for(lambda: "waiting for it" in second.stderr_path.read_text(),
              "the second run to wait for seed 0")
    assert second.poll() is None and len(list(events.glob("start-*"))) == 1
    (events / "go").touch()
    results = [_finish(p) for p in (first, second)]
    assert [code for code, _, _ in results] == [0, 0]
    assert [len(_starts(events, s)) for s in (0, 1)] == [1, 1]  # each cell computed once
    (_, one, _), (_, two, err) = results
    assert sorted(one["computed"] + two["computed"]) == [0, 1]
    assert 0 in two["reused"] and one["superseded"] == two["superseded"] == 0
    assert ("adaptcl: note: d/m/seed0 is being computed by another run with the same settings "
            f"(adaptcl toy, process {first.pid} on ") in err and "waiting for it" in err


def test_different_cells_run_at_the_same_time(tmp_path):
    out, events = tmp_path / "out", tmp_path / "events"
    events.mkdir()
    # each compute waits until two computes have started: only concurrent runs get through
    procs = [_start(out, events, epochs=2, seeds=seeds, barrier=2) for seeds in ([0, 1], [2, 3])]
    results = [_finish(p) for p in procs]
    assert [code for code, _, _ in results] == [0, 0], results
    assert [r["computed"] for _, r, _ in results] == [[0, 1], [2, 3]]


def test_a_killed_run_does_not_block_the_store(tmp_path):
    out, events = tmp_path / "out", tmp_path / "events"
    events.mkdir()
    dead = _start(out, events, epochs=2, seeds=[0])
    _wait_for(lambda: _starts(events, 0), "the run to start computing")
    os.kill(dead.pid, signal.SIGKILL)  # its registry entry and lock file stay behind
    dead.communicate(timeout=30)
    assert len(list((out / "runs" / ".active").glob("*.json"))) == 1
    (events / "go").touch()
    code, result, err = _finish(_start(out, events, epochs=3, seeds=[0]))
    assert code == 0 and result["computed"] == [0], err
    assert not list((out / "runs" / ".active").glob("*.json"))  # the stale entry was removed


def test_registry_in_one_process(tmp_path):
    """The registry's own contract: an entry is live while registered, gone after."""
    layout = RunLayout(tmp_path)
    first, second = ActiveRuns(layout), ActiveRuns(layout)
    first.register("toy", {"d/m/seed0": "aaa"})
    second.register("toy", {"d/m/seed0": "aaa", "d/m/seed1": "bbb"})  # same identity: fine
    assert second.owner("d/m/seed0")["cells"] == {"d/m/seed0": "aaa"}
    second.unregister()
    with pytest.raises(RecipeError, match="d/m/seed0 in .* with other settings"):
        ActiveRuns(layout).register("toy", {"d/m/seed0": "zzz"})
    first.unregister()
    ActiveRuns(layout).register("toy", {"d/m/seed0": "zzz"})  # nobody computes it any more
