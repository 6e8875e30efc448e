"""Loss values and gradients, saved at one commit and compared bit for bit at another.

For a change that must not move a number (a refactoring, a new policy whose default is the old
behaviour): save at the base commit, compare at the head. Every loss of the core test table
(``tests/plugins/_helpers.py``'s ``LOSSES``: each method, form and option a test covers), as a
module and as its functional form, at several tile sizes (``None``: materialised; 3 and 4: the
PyTorch tile loop, a tile that divides the batch and one that does not; 64: one tile), two
seeds, float32 and float64 inputs, plus multi-positive ``labels`` for the losses that take them;
the value and every gradient (inputs and parameters) of each case, compared with
``torch.equal``.

Usage (the base's sources exported, so no checkout changes)::

    git archive BASE src | tar -x -C /tmp/base
    PYTHONPATH=/tmp/base/src:. python tools/bit_identity.py save /tmp/base.pt
    PYTHONPATH=src:. python tools/bit_identity.py compare /tmp/base.pt

``compare`` prints the cases that differ (or are missing) and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

import torch

TILES = (None, 3, 4, 64)
SEEDS = (0, 1)
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def cases() -> Iterator[tuple[str, object]]:
    """``(case id, run())`` for every case; ``run()`` returns the value and the gradients."""
    from tests.plugins._helpers import LOSSES

    for name, case in LOSSES.items():
        for tile in TILES if case.tileable else (None,):
            for seed in SEEDS:
                for dtype_name, dtype in DTYPES.items():
                    for form in ("module", "functional"):
                        labels = [False]
                        cls = case.spec(case.temperature, 8)[0]
                        if getattr(cls, "takes_labels", False) and case.kind == "pair":
                            labels.append(True)
                        for with_labels in labels:
                            key = f"{name}|tile={tile}|seed={seed}|{dtype_name}|{form}|labels={with_labels}"
                            yield key, _runner(case, tile, seed, dtype, form, with_labels)


def _runner(case, tile, seed, dtype, form, with_labels):
    def run():
        inputs = case.inputs(n=6, seed=seed, dtype=dtype)
        extra = {}
        if with_labels:
            extra["labels"] = torch.tensor([0, 1, 0, 2, 1, 0])
        options = {"tile_size": tile} if case.tileable else {}
        if form == "module":
            fn = case.build(**options)
            if dtype == torch.float64:
                fn = fn.double()
            value = fn(*inputs, **extra)
            params = [p for p in fn.parameters() if p.requires_grad]
        else:
            if dtype == torch.float64 and case.spec(case.temperature, 8)[0].__name__.startswith("AMCL"):
                return None  # the functional AMCL takes the float32 network as built
            try:
                value = case.functional(*inputs, **options, **extra)
            except (AttributeError, KeyError):
                return None  # no functional form in the table
            params = []
        grads = torch.autograd.grad(value, list(inputs) + params, allow_unused=True)
        return [value.detach()] + [g for g in grads]
    return run


def compute() -> dict[str, list | str | None]:
    out = {}
    for key, run in cases():
        try:
            out[key] = run()
        except Exception as error:  # noqa: BLE001 - a refusal is part of the behaviour
            out[key] = f"{type(error).__name__}: {error}"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["save", "compare"])
    parser.add_argument("path")
    args = parser.parse_args(argv)
    torch.use_deterministic_algorithms(True)
    results = compute()
    if args.action == "save":
        torch.save(results, args.path)
        print(f"saved {len(results)} cases to {args.path}")
        return 0
    base = torch.load(args.path, weights_only=False)
    differ = []
    for key, want in base.items():
        got = results.get(key, "missing")
        if isinstance(want, list) and isinstance(got, list):
            same = len(want) == len(got) and all(
                (a is None and b is None) or (a is not None and b is not None and a.dtype == b.dtype
                                              and torch.equal(a, b))
                for a, b in zip(want, got, strict=True))
        else:
            same = want == got
        if not same:
            differ.append(key)
    computed = sum(isinstance(v, list) for v in base.values())
    print(f"{len(base)} cases ({computed} computed, {len(base) - computed} refused or absent): "
          f"{len(base) - len(differ)} identical, {len(differ)} differ")
    for key in differ[:50]:
        print("  differs:", key)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
