"""A toy grid in a process of its own, for the run store's concurrency tests (no training).

``python _toy_grid.py OUT EVENTS --epochs N --seeds S [S ...] [--barrier K]``: each compute
writes ``EVENTS/start-seed<S>-<pid>``, then waits until ``EVENTS/go`` exists (with
``--barrier K``: until K start files exist, i.e. K computes run at the same time), then
returns a record. Prints ``{"computed": [seeds], "reused": [seeds], "superseded": n}``; a
``RecipeError`` prints its message on stderr and exits 2 (as the CLI does).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from adaptcl.recipes.engine.cells import Cell
from adaptcl.recipes.engine.errors import RecipeError
from adaptcl.recipes.engine.grid import run_grid


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("events", type=Path)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    parser.add_argument("--barrier", type=int, default=0)
    args = parser.parse_args()

    def compute(cell: Cell) -> dict:
        (args.events / f"start-seed{cell.seed}-{os.getpid()}").touch()
        deadline = time.monotonic() + 20
        while not (len(list(args.events.glob("start-*"))) >= args.barrier if args.barrier
                   else (args.events / "go").exists()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{cell.label()}: nothing released it")
            time.sleep(0.02)
        return {"metrics": {"acc": args.epochs + cell.seed / 10}, "optimisation_steps": 1,
                "train_seconds": 0.0}

    try:
        grid = run_grid("toy", args.out, [Cell((("dataset", "d"), ("loss", "m")), s) for s in args.seeds],
                        identity=lambda c: {"epochs": args.epochs}, compute=compute,
                        progress_bar=False)
    except RecipeError as err:
        print(f"toy: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps({"computed": [c.seed for c in grid.computed],
                      "reused": [c.seed for c in grid.reused],
                      "superseded": len(grid.superseded)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
