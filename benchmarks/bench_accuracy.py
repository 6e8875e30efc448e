"""The accuracy of each product precision and backend against float64 (docs/large_batches.md).

For cross-view InfoNCE at temperature 0.1 (logits up to 10) on ``--rows`` pairs of ``--dim``
features, each precision of the policy (:mod:`adaptcl.plugins._products`: IEEE, TF32,
bf16, fp16) on each backend (the materialised logits, the PyTorch tile loop, the fused kernel)
against the same loss in float64:

* ``loss``: the largest error of a per-anchor loss (``reduction="none"``; the row's log-sum-exp
  less its positive logit, so this is the log-sum-exp's error);
* ``grad``: the relative error ``|g - g64| / |g64|`` (Frobenius) of the gradient of the mean
  loss, the larger of the two views'. The backward's products round their gradient tiles to
  the operands' precision, as autocast's matmuls do, so fp16 needs the loss scaled (what
  ``torch.amp.GradScaler`` does); every precision's backward runs on the loss times
  ``GRAD_SCALE`` (GradScaler's initial scale, 2^16), the gradient divided back (both exact).

The inputs are float32 leaves and the products are set to each precision, so the gradients
stay float32 and the table shows the products' error alone (a bf16 leaf would add its own
rounding of the gradient, 2^-9). On the CPU the tensor cores are emulated exactly
(:func:`~adaptcl.plugins._products.rounded`); the kernel column runs under Triton's
interpreter in a fresh process, at ``--kernel-rows`` and beside the loop at that size (the
interpreter is slow; the kernel and the loop round identically,
``tests/plugins/interpreted_fused.py``). ``--device cuda`` runs all three on the GPU, the
kernel compiled, at ``--rows``.

Examples::

    python benchmarks/bench_accuracy.py                      # 4,099 x 128; kernel at 256 rows
    python benchmarks/bench_accuracy.py --rows 512 --kernel-rows 128 --out results/acc.json
    python benchmarks/bench_accuracy.py --device cuda
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

PRECISIONS = ("ieee", "tf32", "bf16", "fp16")
BACKENDS = ("materialised", "loop", "kernel")
TEMPERATURE = 0.1
TILE = 1024
GRAD_SCALE = 2.0**16


@contextlib.contextmanager
def products_at(precision: str):
    """Every loss's products at ``precision`` for float32 inputs (the policy's choice for
    the inputs' dtype, replaced for the measurement)."""
    from adaptcl.plugins import candidates

    saved = candidates.product_precision

    def forced(dtype, device):
        return precision if dtype == torch.float32 else saved(dtype, device)

    candidates.product_precision = forced
    try:
        yield
    finally:
        candidates.product_precision = saved


def loss_for(backend: str):
    """Cross-view InfoNCE on ``backend`` (the one place this file selects a backend): the loop
    at ``TILE``, the kernel in its own blocks (``tile_size="auto"`` under
    ``tiling(backend="triton")``)."""
    from adaptcl.plugins import InfoNCELoss, tiling

    tile_size, name = {"materialised": (None, "auto"), "loop": (TILE, "torch"),
                       "kernel": ("auto", "triton")}[backend]
    loss = InfoNCELoss(TEMPERATURE, form="cross_view", reduction="none", tile_size=tile_size)

    def on_backend(*args):
        with tiling(backend=name):
            return loss(*args)
    return on_backend


def inputs(rows: int, dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    z0 = torch.randn(rows, dim, generator=g)
    z1 = z0 + 0.5 * torch.randn(rows, dim, generator=g)  # aligned pairs, as in training
    return z0.to(device), z1.to(device)


def value_and_grads(fn, z0, z1, dtype):
    leaves = [z.to(dtype).requires_grad_(True) for z in (z0, z1)]
    per_anchor = fn(*leaves)
    grads = torch.autograd.grad(per_anchor.mean() * GRAD_SCALE, leaves)
    return per_anchor.detach(), [g / GRAD_SCALE for g in grads]


def measure(backends, rows: int, dim: int, device: torch.device) -> list[dict]:
    z0, z1 = inputs(rows, dim, device)
    reference, ref_grads = value_and_grads(loss_for("materialised"), z0, z1, torch.float64)
    out = []
    for backend in backends:
        for precision in PRECISIONS:
            with products_at(precision):
                value, grads = value_and_grads(loss_for(backend), z0, z1, torch.float32)
            grad = max(float((g.double() - r).norm() / r.norm()) for g, r in zip(grads, ref_grads,
                                                                                strict=True))
            out.append({"backend": backend, "precision": precision, "rows": rows, "dim": dim,
                        "device": device.type,
                        "loss_max_abs": float((value.double() - reference).abs().max()),
                        "grad_relative": grad})
    return out


def kernel_under_interpreter(rows: int, dim: int) -> list[dict]:
    """The kernel column, beside the loop at the same size: this script again, in a fresh
    process under Triton's interpreter."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, __file__, "--backends", "loop", "kernel", "--rows",
                           str(rows), "--dim", str(dim), "--json-only"], env=env,
                          capture_output=True, text=True, check=False, timeout=7200)
    if proc.returncode != 0:
        raise SystemExit(f"the interpreted kernel run failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def render(records: list[dict]) -> str:
    """One column pair (loss, grad) per backend and size, one row per precision."""
    columns = list(dict.fromkeys((r["backend"], r["rows"], r["dim"], r["device"])
                                 for r in records))
    cell = {(r["backend"], r["rows"], r["precision"]): r for r in records}

    def title(backend, rows, dim, device):
        where = ", interpreted" if backend == "kernel" and device == "cpu" else ""
        return f"{backend} {rows:,} x {dim} ({device}{where})"

    out = [f"Cross-view InfoNCE, temperature {TEMPERATURE}, against float64: largest per-anchor "
           f"loss error / gradient relative error", "",
           "| products | " + " | ".join(title(*c) for c in columns) + " |",
           "| --- | " + " | ".join("---:" for _ in columns) + " |"]
    for precision in PRECISIONS:
        cells = []
        for backend, rows, _dim, _device in columns:
            r = cell.get((backend, rows, precision))
            cells.append("-" if r is None else
                         f"{r['loss_max_abs']:.1e} / {r['grad_relative']:.1e}")
        out.append(f"| {precision} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4099)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--kernel-rows", type=int, default=256,
                        help="rows of the interpreted kernel column (CPU only)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--out", type=Path, default=None, help="JSON file with every number")
    parser.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.rows, args.dim, args.kernel_rows) < 2:
        parser.error("need --rows, --dim and --kernel-rows >= 2")
    device = torch.device(args.device)
    interpreted = device.type == "cpu" and "kernel" in args.backends and not args.json_only
    here = [b for b in args.backends if not (interpreted and b == "kernel")]
    records = measure(here, args.rows, args.dim, device)
    if args.json_only:
        print(json.dumps(records))
        return 0
    if interpreted:
        records += kernel_under_interpreter(args.kernel_rows, args.dim)
    print(render(records))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command": sys.argv, "records": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
