"""Loss values and gradients, saved at one commit and compared bit for bit at another.

For a change that must not move a number (a refactoring, a new policy whose default is the old
behaviour): save at the base commit, compare at the head. Every loss of the core test table
(``tests/plugins/_helpers.py``'s ``LOSSES``: each method, form and option a test covers), as a
module and as its functional form, two seeds, float32 and float64 inputs, at several tile sizes
(``None``: materialised; ``"auto"``, the default; 3, 4 and 7: the PyTorch tile loop, tiles that
divide the batch and tiles that do not; 64: one tile) and under two logits budgets
(``tiling(max_logits_bytes=1)``: ``"auto"`` switches to its tiled path; ``2**30``: it stays
materialised); each with ``reduction="none"`` too (the per-anchor losses), with multi-positive
``labels`` for the losses that take them, and the AMCL losses on two heads (``[2, N, D]``). The
value and every gradient (inputs and parameters) of each case are compared with
``torch.equal``.

``--matmul-precision`` computes under ``torch.set_float32_matmul_precision(...)``: on the CPU
float32 products are IEEE whatever it says (issue 53), so a head computed at ``"high"`` must
equal a base computed at ``"highest"``.

Usage (the base's sources exported, so no checkout changes)::

    git archive BASE src tests | tar -x -C /tmp/base
    cd /tmp/base && PYTHONPATH=src:. python /path/to/tools/bit_identity.py save /tmp/base.pt
    PYTHONPATH=src:. python tools/bit_identity.py compare /tmp/base.pt
    PYTHONPATH=src:. python tools/bit_identity.py compare /tmp/base.pt --matmul-precision high

``compare`` prints the cases that differ (or are missing) and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator

import torch

TILES = (None, "auto", 3, 4, 7, 64)
#: ``tile_size="auto"`` under these ``tiling(max_logits_bytes=...)`` budgets
BUDGETS = (1, 2**30)
SEEDS = (0, 1)
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _scenarios(case) -> Iterator[tuple[str, object, int | None]]:
    """``(label, tile_size, budget)`` of one case: its tiles, then ``"auto"`` under budgets."""
    if not case.tileable:
        yield "tile=None", None, None
        return
    for tile in TILES:
        yield f"tile={tile}", tile, None
    for budget in BUDGETS:
        yield f"tile=auto|budget={budget}", "auto", budget


def cases() -> Iterator[tuple[str, object]]:
    """``(case id, run())`` for every case; ``run()`` returns the value and the gradients."""
    from tests.plugins._helpers import LOSSES

    for name, case in LOSSES.items():
        cls = case.spec(case.temperature, 8)[0]
        amcl = cls.__name__ == "AMCLLoss"
        for label, tile, budget in _scenarios(case):
            for seed in SEEDS:
                for dtype_name, dtype in DTYPES.items():
                    for form in ("module", "functional"):
                        labels = [False]
                        if getattr(cls, "takes_labels", False) and case.kind == "pair":
                            labels.append(True)
                        reductions = ["mean", "none"] if case.per_anchor else ["mean"]
                        heads = [1, 2] if amcl else [1]
                        for with_labels in labels:
                            for reduction in reductions:
                                for h in heads:
                                    key = (f"{name}|{label}|seed={seed}|{dtype_name}|{form}|"
                                           f"labels={with_labels}|reduction={reduction}|heads={h}")
                                    yield key, _runner(case, tile, budget, seed, dtype, form,
                                                       with_labels, reduction, h)


def _runner(case, tile, budget, seed, dtype, form, with_labels, reduction, heads):
    def run():
        from adaptcl.plugins import tiling

        inputs = case.inputs(n=6, seed=seed, dtype=dtype)
        if heads > 1:  # the same rows as two heads, the second one shifted
            inputs = tuple(torch.stack([x.detach(), x.detach().roll(1, dims=0)]).requires_grad_()
                           for x in inputs)
        extra = {}
        if with_labels:
            extra["labels"] = torch.tensor([0, 1, 0, 2, 1, 0])
        options = {"tile_size": tile} if case.tileable else {}
        if reduction != "mean":
            options["reduction"] = reduction
        scope = tiling(max_logits_bytes=budget) if budget else contextlib.nullcontext()
        with scope:
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
            up = torch.linspace(0.5, 1.5, value.numel(), dtype=value.dtype).reshape(value.shape)
            grads = torch.autograd.grad(value, list(inputs) + params, up, allow_unused=True)
        return [value.detach()] + [g for g in grads]
    return run


def compute() -> dict[str, list | str | None]:
    import warnings

    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the budget's switch is said once: not compared
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
    parser.add_argument("--matmul-precision", default="highest",
                        choices=["highest", "high", "medium"],
                        help="torch.set_float32_matmul_precision while computing")
    args = parser.parse_args(argv)
    torch.use_deterministic_algorithms(True)
    torch.set_float32_matmul_precision(args.matmul_precision)
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
