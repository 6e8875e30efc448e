"""SimCLR training-step time with adaptcl's Lightly ``MACLLoss`` vs ``lightly.loss.NTXentLoss``.

One step = backbone + projection head on two views (separate passes, as Lightly's SimCLR
examples do), the loss, backward and an Adam step, on the same fixed batch of ``--batch-size``
32x32 images. The encoder is Lightly's CIFAR ResNet-18
(``adaptcl.adapters.lightning.backbones.cifar_resnet``) at ``--width`` with a
``SimCLRProjectionHead``. Each candidate trains its own copy of the same initial model (so the
candidates do not perturb each other). After ``--warmup`` rounds the
candidates run round-robin, with a rotating start, for ``--repeats`` rounds; the verdict is the
median over rounds of ``t(MACL) / t(Lightly NT-Xent)``, which cancels slow drifts of a shared
machine's load. adaptcl's ``NTXentLoss`` is timed too, to split MACL's overhead into "adapter
plumbing" and "MACL's extra maths". A loss-only section times forward+backward of each loss on
``[B, output_dim]`` embeddings (median of ``--loss-repeats``) to put the overhead in
milliseconds.

    python benchmarks/bench_lightly_step.py --threads 1
    python benchmarks/bench_lightly_step.py --threads 1 --width 0.25 --repeats 15 --json out.json
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import time

import torch

LIMIT = 1.05


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--width", type=float, default=0.125, help="CIFAR ResNet-18 width")
    parser.add_argument("--hidden-dim", type=int, default=512)
    parser.add_argument("--output-dim", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--loss-repeats", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="write the measurements here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from lightly.loss import NTXentLoss as LightlyNTXent
    from lightly.models.modules.heads import SimCLRProjectionHead

    from adaptcl.adapters.lightly import MACLLoss, NTXentLoss
    from adaptcl.adapters.lightning.backbones import cifar_resnet

    torch.manual_seed(0)
    backbone, feature_dim = cifar_resnet("resnet-18", width=args.width)
    base = torch.nn.ModuleDict({
        "backbone": backbone,
        "head": SimCLRProjectionHead(feature_dim, args.hidden_dim, args.output_dim),
    })
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(args.batch_size, 3, 32, 32, generator=g)
    x1 = x0 + 0.3 * torch.randn(args.batch_size, 3, 32, 32, generator=g)

    candidates = {
        "lightly NTXentLoss(0.1)": LightlyNTXent(temperature=0.1),
        "adaptcl NTXentLoss(0.1)": NTXentLoss(temperature=0.1),
        "adaptcl MACLLoss(0.1, 0.5, 0)": MACLLoss(temperature=0.1, alpha=0.5, a0=0.0),
    }
    reference, target = "lightly NTXentLoss(0.1)", "adaptcl MACLLoss(0.1, 0.5, 0)"
    states = {}
    for name in candidates:
        model = copy.deepcopy(base).train()
        states[name] = (model, torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-6))

    def step(name: str) -> float:
        model, optimizer = states[name]
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        z0 = model["head"](model["backbone"](x0).flatten(start_dim=1))
        z1 = model["head"](model["backbone"](x1).flatten(start_dim=1))
        loss = candidates[name](z0, z1)
        loss.backward()
        optimizer.step()
        elapsed = time.perf_counter() - start
        if not torch.isfinite(loss):
            raise RuntimeError(f"{name}: non-finite loss {loss}")
        return elapsed

    names = list(candidates)
    print(f"# SimCLR training step: CIFAR ResNet-18 width {args.width} ({feature_dim}-d), head "
          f"{args.hidden_dim}->{args.output_dim}, batch {args.batch_size} x 2 views of 32x32, "
          f"Adam; torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"{platform.processor() or platform.machine()}")
    for _ in range(args.warmup):
        for name in names:
            step(name)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            times[name].append(step(name))
    ratios = {name: [t / ref for t, ref in zip(times[name], times[reference], strict=True)]
              for name in names}

    print(f"\n{'candidate':<32} {'median step (ms)':>17} {'ratio vs lightly (median)':>26}")
    for name in names:
        print(f"{name:<32} {1e3 * statistics.median(times[name]):>17.1f} "
              f"{statistics.median(ratios[name]):>26.4f}")

    # loss alone: forward + backward on fixed embeddings
    z0 = torch.randn(args.batch_size, args.output_dim, generator=g, requires_grad=True)
    z1 = torch.randn(args.batch_size, args.output_dim, generator=g, requires_grad=True)
    loss_times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.loss_repeats + 5):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            candidates[name](z0, z1).backward()
            elapsed = time.perf_counter() - start
            z0.grad = z1.grad = None
            if r >= 5:
                loss_times[name].append(elapsed)
    print(f"\n{'loss alone (fwd+bwd)':<32} {'median (ms)':>17}")
    for name in names:
        print(f"{name:<32} {1e3 * statistics.median(loss_times[name]):>17.3f}")
    extra = statistics.median(loss_times[target]) - statistics.median(loss_times[reference])
    step_ref = statistics.median(times[reference])

    ratio = statistics.median(ratios[target])
    q = statistics.quantiles(ratios[target], n=4) if len(ratios[target]) >= 2 else [ratio] * 3
    print(f"\nMACL loss-only overhead: {1e3 * extra:+.3f} ms per step "
          f"= {100 * extra / step_ref:+.2f}% of the NT-Xent step")
    print(f"MACL / lightly NT-Xent step ratio: median {ratio:.4f} (IQR {q[0]:.4f}-{q[2]:.4f}, "
          f"{args.repeats} rounds)")
    verdict = "PASS" if ratio <= LIMIT else "FAIL"
    print(f"{verdict}: adaptcl MACLLoss SimCLR step at most {LIMIT:.2f}x lightly NTXentLoss "
          f"(median ratio {ratio:.4f})")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    if load:
        print(f"# load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    if args.json:
        from adaptcl.recipes.engine.provenance import write_measurements

        write_measurements(args.json, {"args": vars(args), "step_times_s": times,
                                       "step_ratios": ratios, "loss_times_s": loss_times,
                                       "ratio": ratio, "limit": LIMIT, "verdict": verdict,
                                       "load": load}, device="cpu")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
