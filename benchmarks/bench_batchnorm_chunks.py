"""How far a cached step with ``batch_norm="chunk"`` is from the whole-batch step (issue 54).

:func:`adaptcl.plugins.cached_forward` with ``batch_norm="chunk"`` normalises every chunk with
its own BatchNorm statistics, so its gradient is not the uncached whole-batch step's. This
measures by how much, on a small BatchNorm CNN trained SimCLR-style on real CIFAR-10 images:

* the model: three conv-BatchNorm-ReLU-max-pool blocks (16, 32, 64 channels), global average
  pooling and a SimCLR projection head with BatchNorm (64 -> 64 -> 32), float32;
* the step: NT-Xent (:class:`adaptcl.plugins.InfoNCELoss`, temperature 0.2) on two views
  (random 4-pixel-padded crops and horizontal flips) of ``--batch`` images, each view through
  the encoder (uncached: the whole batch at once, as every SimCLR loop does; cached: through
  ``cached_forward(..., mini_batch_size, batch_norm="chunk")``), from the same parameters and
  running statistics;
* the figure: the cosine between the two steps' gradients, over every parameter flattened
  into one vector, and the relative distance ``|g_cached - g| / |g|``;
* when: at initialisation and after ``--train-steps`` uncached Adam steps (lr 1e-3) on the
  training images, on a batch of held-out images, per seed (``--seeds``), per chunk size
  (``--mini-batch-sizes``);
* the scale it is read against: the cosine between the whole-batch gradients of two disjoint
  batches of held-out images (the sampling noise of one step's gradient).

It also counts the momentum updates of the running statistics in one cached step: one per
chunk and view (``num_batches_tracked``), against one per view uncached.

Data: the lossless CIFAR-10 copy in ``--data-root`` (``../shared/data/cifar10`` from a
checkout; ``$ADAPTCL_DATA`` otherwise), images 0-2,999 for training and 3,000-3,999 held out.

Examples::

    python benchmarks/bench_batchnorm_chunks.py --json bn_chunks.json      # the docs' figures
    python benchmarks/bench_batchnorm_chunks.py --smoke                    # seconds: checks it runs
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from adaptcl.plugins import InfoNCELoss, cached_forward

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data"
TRAIN, HELD_OUT = slice(0, 3000), slice(3000, 4000)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-root", type=Path,
                   default=Path(os.environ.get("ADAPTCL_DATA", DEFAULT_ROOT)),
                   help="folder holding cifar10/cifar10_train_lossless_*.npz")
    p.add_argument("--batch", type=int, default=256, help="images per step (default 256)")
    p.add_argument("--mini-batch-sizes", type=int, nargs="+", default=[16, 32, 64, 128],
                   help="chunk sizes to measure (default 16 32 64 128)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--train-steps", type=int, default=200,
                   help="uncached Adam steps before the second measurement (default 200)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--json", type=Path, default=None, help="write the measurements here")
    p.add_argument("--smoke", action="store_true",
                   help="batch 32, chunks 8 and 16, one seed, 2 training steps: checks the script")
    args = p.parse_args(argv)
    if args.smoke:
        args.batch, args.mini_batch_sizes, args.seeds, args.train_steps = 32, [8, 16], [0], 2
    if args.batch < 4:
        p.error(f"--batch must be at least 4, got {args.batch}")
    if any(m < 2 or m > args.batch for m in args.mini_batch_sizes):
        p.error(f"--mini-batch-sizes must lie in [2, --batch ({args.batch})] (BatchNorm needs "
                f"2 rows per chunk), got {args.mini_batch_sizes}")
    if args.train_steps < 0:
        p.error(f"--train-steps must be >= 0, got {args.train_steps}")
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    return args


def load_images(root: Path) -> torch.Tensor:
    """The lossless CIFAR-10 training images as float ``[N, 3, 32, 32]``, normalised."""
    from adaptcl.recipes.common.cifar import load_npz_arrays, npz_dir_of

    folder = npz_dir_of(root)
    files = sorted(folder.glob("cifar10_train_lossless_*.npz")) if folder else []
    if not files:
        raise SystemExit(f"bench_batchnorm_chunks.py: no cifar10_train_lossless_*.npz under "
                         f"{root} (--data-root)")
    images = torch.from_numpy(load_npz_arrays(files)[0]).permute(0, 3, 1, 2).float() / 255
    mean, std = images.mean((0, 2, 3), keepdim=True), images.std((0, 2, 3), keepdim=True)
    return (images - mean) / std


def view(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A random 4-pixel-padded crop and horizontal flip of each image."""
    padded = nn.functional.pad(images, (4, 4, 4, 4), mode="reflect")
    offsets = torch.randint(0, 9, (len(images), 2), generator=generator)
    flips = torch.rand(len(images), generator=generator) < 0.5
    out = torch.stack([padded[i, :, y:y + 32, x:x + 32]
                       for i, (y, x) in enumerate(offsets.tolist())])
    out[flips] = out[flips].flip(-1)
    return out


def model() -> nn.Module:
    """Three conv-BatchNorm-ReLU blocks and a SimCLR projection head with BatchNorm."""
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                nn.MaxPool2d(2)]

    return nn.Sequential(*block(3, 16), *block(16, 32), *block(32, 64),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(64, 64, bias=False), nn.BatchNorm1d(64), nn.ReLU(),
                         nn.Linear(64, 32))


def gradient(net: nn.Module, views: tuple[torch.Tensor, torch.Tensor],
             mini_batch_size: int | None) -> tuple[torch.Tensor, int]:
    """The flattened gradient of one NT-Xent step of a copy of ``net`` (``None``: uncached),
    and how many momentum updates its BatchNorm layers' running statistics took."""
    net = copy.deepcopy(net)
    net.zero_grad()
    before = int(net[1].num_batches_tracked)
    if mini_batch_size is None:
        z = [net(v) for v in views]
    else:
        z = [cached_forward(net, v, mini_batch_size, batch_norm="chunk") for v in views]
    InfoNCELoss(0.2)(*z).backward()
    flat = torch.cat([p.grad.reshape(-1) for p in net.parameters()])
    return flat, int(net[1].num_batches_tracked) - before


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(nn.functional.cosine_similarity(a.double(), b.double(), dim=0))


def train(net: nn.Module, images: torch.Tensor, steps: int, batch: int,
          generator: torch.Generator) -> None:
    """``steps`` uncached SimCLR steps (Adam, lr 1e-3) on random batches of ``images``."""
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    criterion = InfoNCELoss(0.2)
    for _ in range(steps):
        chosen = images[torch.randperm(len(images), generator=generator)[:batch]]
        loss = criterion(net(view(chosen, generator)), net(view(chosen, generator)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def measure(args: argparse.Namespace, images: torch.Tensor) -> list[dict[str, Any]]:
    """One row per seed, stage and chunk size (plus the two-batch reference per seed and
    stage)."""
    rows = []
    train_images, held_out = images[TRAIN], images[HELD_OUT]
    for seed in args.seeds:
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        net = model().train()
        for stage in ("initialisation", f"after {args.train_steps} steps"):
            if stage != "initialisation":
                train(net, train_images, args.train_steps, args.batch, generator)
            order = torch.randperm(len(held_out), generator=generator)
            first, second = (held_out[order[:args.batch]],
                             held_out[order[args.batch:2 * args.batch]])
            views = (view(first, generator), view(first, generator))
            whole, updates = gradient(net, views, None)
            other = (view(second, generator), view(second, generator))
            if len(second) == args.batch:
                rows.append({"seed": seed, "stage": stage, "mini_batch_size": None,
                             "reference": "another batch",
                             "cosine": cosine(gradient(net, other, None)[0], whole),
                             "relative_distance": None, "running_stat_updates": updates})
            for size in args.mini_batch_sizes:
                cached, cached_updates = gradient(net, views, size)
                rows.append({"seed": seed, "stage": stage, "mini_batch_size": size,
                             "reference": "whole batch", "cosine": cosine(cached, whole),
                             "relative_distance": float((cached - whole).norm() / whole.norm()),
                             "running_stat_updates": cached_updates})
            print(f"seed {seed}, {stage}: " + ", ".join(
                f"{r['mini_batch_size'] or 'another batch'}: {r['cosine']:.3f}"
                for r in rows if r["seed"] == seed and r["stage"] == stage), flush=True)
    return rows


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean, standard deviation, minimum and maximum of the cosine over the seeds, per stage
    and chunk size."""
    out = []
    keys = dict.fromkeys((r["stage"], r["mini_batch_size"]) for r in rows)
    for stage, size in keys:
        values = [r["cosine"] for r in rows if (r["stage"], r["mini_batch_size"]) == (stage, size)]
        updates = {r["running_stat_updates"] for r in rows
                   if (r["stage"], r["mini_batch_size"]) == (stage, size)}
        out.append({"stage": stage, "mini_batch_size": size, "seeds": len(values),
                    "cosine_mean": statistics.fmean(values),
                    "cosine_sd": statistics.stdev(values) if len(values) > 1 else 0.0,
                    "cosine_min": min(values), "cosine_max": max(values),
                    "running_stat_updates": sorted(updates)})
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    images = load_images(args.data_root)
    start = time.perf_counter()
    rows = measure(args, images)
    table = summary(rows)
    print(f"\nbatch {args.batch}, {len(args.seeds)} seed(s): gradient cosine, cached "
          "(batch_norm=\"chunk\") vs the whole-batch step; mean +- sd [min, max] over seeds")
    print("| stage | mini-batch | cosine | BatchNorm running-statistics updates per step |")
    print("| --- | ---: | --- | ---: |")
    for r in table:
        size = "another batch (reference)" if r["mini_batch_size"] is None else r["mini_batch_size"]
        print(f"| {r['stage']} | {size} | {r['cosine_mean']:.3f} +- {r['cosine_sd']:.3f} "
              f"[{r['cosine_min']:.3f}, {r['cosine_max']:.3f}] | "
              f"{'/'.join(map(str, r['running_stat_updates']))} |")
    print(f"({time.perf_counter() - start:.0f} s)")
    if args.json is not None:
        from adaptcl.recipes.engine.provenance import write_measurements

        write_measurements(args.json, {"argv": sys.argv[1:] if argv is None else argv,
                                       "batch": args.batch, "rows": rows, "summary": table},
                           device="cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
