"""Featurisation throughput (molecules per second): adaptcl's OGB featuriser vs torch-geometric.

Project issue 7: time :func:`adaptcl.adapters.graphcl.molecules.featurise_smiles` (OGB's
``smiles2graph`` into ``torch_geometric.data.Data`` with integer ``x``/``edge_attr``) against
``torch_geometric.utils.from_smiles`` (PyG's own 9-feature integer featurisation) on the same
SMILES, in one process, and print both throughputs and their ratio (ours / PyG: above 1 means
ours is faster).

How it measures: the SMILES are read once (``--source``: a MoleculeNet set or the ZINC corpus
under the data root); after one untimed warm-up pass over the first 100, the two featurisers
alternate for ``--repeats`` rounds (the starting one rotates) over all ``--n`` SMILES. The
table shows each one's median molecules/second; the ratio is the median of the per-round
ratios, which cancels slow drifts of a shared machine's load. Invalid SMILES count as
processed for both (ours skips them, ``from_smiles`` is given only SMILES RDKit parses, since it
raises on the others).

Example::

    .venv/bin/python benchmarks/bench_featurisation.py --data-root /path/to/data
    .venv/bin/python benchmarks/bench_featurisation.py --source bbbp --n 2000 --repeats 5
    .venv/bin/python benchmarks/bench_featurisation.py --smoke     # seconds: checks the script
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch


def load_smiles(data_root: Path, source: str, n: int) -> list[str]:
    from adaptcl.adapters.graphcl.molecules import read_moleculenet_csv, read_smiles_file

    if source == "zinc":
        return read_smiles_file(data_root / "zinc" / "moses" / "test.csv.gz", limit=n)
    smiles, _, _ = read_moleculenet_csv(source, data_root, limit=n)
    return smiles


def ours(smiles: list[str]) -> int:
    from adaptcl.adapters.graphcl.molecules import featurise_smiles

    graphs, invalid = featurise_smiles(smiles)
    return len(graphs) + len(invalid)


def pyg(smiles: list[str]) -> int:
    from rdkit import rdBase
    from torch_geometric.utils import from_smiles

    _block = rdBase.BlockLogs()  # noqa: F841 - silences RDKit while alive
    count = 0
    for s in smiles:
        from_smiles(s)
        count += 1
    return count


def run(args: argparse.Namespace) -> dict[str, object]:
    from rdkit import Chem, rdBase

    torch.set_num_threads(1)
    data_root = Path(args.data_root or os.environ.get("ADAPTCL_DATA", ""))
    if not data_root.is_dir():
        sys.exit("no data root: pass --data-root or set $ADAPTCL_DATA")
    smiles = load_smiles(data_root, args.source, args.n)
    blocker = rdBase.BlockLogs()
    parsable = [s for s in smiles if Chem.MolFromSmiles(s) is not None]
    del blocker
    candidates = {"adaptcl featurise_smiles (OGB)": lambda: ours(smiles),
                  "torch_geometric from_smiles": lambda: pyg(parsable)}
    names = list(candidates)
    ours(smiles[:100])  # warm-up: imports, RDKit tables
    pyg(parsable[:100])
    rates: dict[str, list[float]] = {k: [] for k in names}
    ratios: list[float] = []
    for r in range(args.repeats):
        order = names[r % 2:] + names[:r % 2]
        this_round = {}
        for name in order:
            t0 = time.perf_counter()
            candidates[name]()
            elapsed = time.perf_counter() - t0
            n_done = len(smiles) if name.startswith("adaptcl") else len(parsable)
            this_round[name] = n_done / elapsed
            rates[name].append(this_round[name])
        ratios.append(this_round[names[0]] / this_round[names[1]])
    medians = {k: statistics.median(v) for k, v in rates.items()}
    ratio = statistics.median(ratios)
    print(f"featurisation throughput on {len(smiles)} SMILES from {args.source} "
          f"({len(smiles) - len(parsable)} invalid), {args.repeats} rounds, 1 thread")
    print("| featuriser | molecules/s (median) |")
    print("| --- | --- |")
    for name in names:
        print(f"| {name} | {medians[name]:.0f} |")
    print(f"ratio adaptcl / torch_geometric (median of per-round ratios): {ratio:.2f}x")
    print(f"load average: {os.getloadavg()[0]:.2f}")
    result = {"source": args.source, "n": len(smiles), "invalid": len(smiles) - len(parsable),
              "repeats": args.repeats, "molecules_per_second": medians,
              "per_round": rates, "ratio": ratio, "per_round_ratio": ratios,
              "loadavg": os.getloadavg()[0]}
    if args.json:
        from adaptcl.recipes.engine.provenance import write_measurements

        write_measurements(args.json, result, device="cpu")
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default=None, help="default $ADAPTCL_DATA")
    parser.add_argument("--source", default="zinc",
                        choices=["zinc", "bbbp", "tox21", "toxcast", "sider", "clintox", "muv",
                                 "hiv", "bace"])
    parser.add_argument("--n", type=int, default=5000, help="number of SMILES")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true", help="200 SMILES, 1 round")
    args = parser.parse_args(argv)
    if args.smoke:
        args.n, args.repeats = 200, 1
    return args


if __name__ == "__main__":
    run(parse_args())
