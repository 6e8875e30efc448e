"""Gradient caching on one device: time per step and peak memory of a training step that does
not fit, against the uncached step (the issue-48 targets).

Two cases, each the step the recipe trains (its module's own code):

* ``images``: ``adaptcl images``' SimCLR (Lightly's CIFAR ResNet-18 at ``--width``, its head,
  adaptcl's ``NTXentLoss``, Adam) on two views of ``--images-batch`` random 32x32 images;
* ``clip``: ``adaptcl clip``'s ``ClipModule`` with its ``paper`` preset's towers (ViT 6 x 256
  with 4x4 patches, text transformer 6 x 256; ``--clip-towers cpu`` for the small ones) and
  ``InfoNCEClipLoss`` on ``--clip-batch`` random images and token ids.

Random inputs: the time and memory of a step do not depend on the pixels, and no data set
holds 65,536 CIFAR-10 training images. Every step runs under ``torch.autocast`` in bfloat16 (as
``--precision bf16-mixed``); the loss takes its tiled path by itself where its logits would not
fit (the budget of :mod:`adaptcl.plugins.tiles._budget`).

Per case, in one process:

1. ``mini step``: the uncached step at ``--mini-batch-size``;
2. ``loss alone``: the loss's forward and backward on random embeddings of the whole batch
   (the loss's own memory, linear once tiled);
3. ``uncached``: the uncached step at ``--mini-batch-size`` x 2, x 4, ... up to the batch (or
   ``--uncached-max``), until one runs out of memory: the largest that fits;
4. ``cached``: the whole batch with ``--mini-batch-size`` (gradient caching).

Memory is the peak CUDA memory a step adds to what was allocated before it (model, optimiser
state, inputs; not measured on the CPU); time is the median of ``--repeats`` steps after one
untimed step, CUDA synchronised. The ``cached`` row carries the targets as ratios:
``memory / (mini step + loss alone)`` (target <= 1.3) and ``time per sample / the largest
uncached step's`` (target <= 1.4). The JSON (``--out``) has ``bench_gpu.py``'s row format, so
``tools/gpu_check.py`` reads it.

``--saved-activations B ...`` measures instead, on any device and deterministically, the
activations autograd keeps for the backward of the ``images`` step (bytes of the saved tensors
that are no parameter's, peak over the step; ``torch.autograd.graph.saved_tensors_hooks``) at
each batch ``B``, uncached and cached, in float32.

Examples::

    python benchmarks/bench_gradcache.py --out gradcache.json               # on a CUDA machine
    python benchmarks/bench_gradcache.py --device cpu --images-batch 64 --clip-batch 32 \\
        --mini-batch-size 16 --width 0.0625 --clip-towers cpu --repeats 1   # the smoke path
    python benchmarks/bench_gradcache.py --device cpu --width 0.125 --mini-batch-size 64 \
        --saved-activations 256 1024                    # docs/large_batches.md's table
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import statistics
import sys
import time
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--cases", nargs="+", default=["images", "clip"], choices=("images", "clip"))
    parser.add_argument("--images-batch", type=int, default=65536)
    parser.add_argument("--clip-batch", type=int, default=32768)
    parser.add_argument("--mini-batch-size", type=int, default=1024)
    parser.add_argument("--uncached-max", type=int, default=None,
                        help="the largest uncached batch tried (default: the case's batch)")
    parser.add_argument("--width", type=float, default=1.0, help="the ResNet-18's width")
    parser.add_argument("--clip-towers", choices=("paper", "cpu"), default="paper",
                        help="the towers of adaptcl clip's preset")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--saved-activations", type=int, nargs="+", default=None, metavar="B",
                        help="measure the images step's saved activations at these batches")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON")
    args = parser.parse_args(argv)
    for name in ("images_batch", "clip_batch", "mini_batch_size", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(step: Callable[[], None], device: torch.device, repeats: int) -> dict[str, Any]:
    """Median seconds of ``repeats`` calls of ``step`` after an untimed one, and the peak
    memory a call adds (CUDA); ``status`` ``oom`` where it ran out of memory."""
    try:
        step()  # warm-up: kernels chosen, optimiser state allocated
        _sync(device)
        before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            _sync(device)
            times.append(time.perf_counter() - start)
        peak = torch.cuda.max_memory_allocated(device) - before if device.type == "cuda" else None
        return {"status": "ok", "time_s": statistics.median(times), "peak_bytes": peak}
    except torch.OutOfMemoryError as error:
        return {"status": "oom", "time_s": None, "peak_bytes": None, "error": str(error)[:200]}
    finally:
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def images_case(args: argparse.Namespace, device: torch.device) -> tuple[Any, Callable, Any]:
    """(module, inputs of a batch, the loss on embeddings) of ``adaptcl images``' SimCLR."""
    from adaptcl.adapters.lightning.factory import build_ssl_module

    module = build_ssl_module("simclr", "infonce", width=args.width).to(device).train()

    def inputs(batch: int) -> Any:
        return [torch.randn(batch, 3, 32, 32, device=device) for _ in range(2)]

    def train_step(views: Any) -> torch.Tensor:
        return module.training_loss(views)

    return module, inputs, train_step


def clip_case(args: argparse.Namespace, device: torch.device) -> tuple[Any, Callable, Any]:
    """(module, inputs of a batch, the loss on a batch) of ``adaptcl clip``'s ClipModule."""
    from adaptcl.adapters.open_clip import build_clip_loss
    from adaptcl.recipes.clip.config import PRESETS, ClipConfig
    from adaptcl.recipes.clip.model import ClipModule, build_clip

    towers = ("patch_size", "vision_width", "vision_layers", "text_width", "text_layers",
              "embed_dim")
    cfg = ClipConfig(**{k: v for k, v in PRESETS[args.clip_towers].items() if k in towers})
    module = ClipModule(build_clip(cfg), build_clip_loss("infonce"), multi_positive=False,
                        lr=5e-4, weight_decay=0.1, warmup_steps=1).to(device).train()

    def inputs(batch: int) -> Any:
        return (torch.randn(batch, 3, 32, 32, device=device),
                torch.randint(1, 49000, (batch, cfg.context_length), device=device),
                torch.arange(batch, device=device))

    def train_step(batch: Any) -> torch.Tensor:
        return module.training_step(batch, 0)

    return module, inputs, train_step


def run_case(name: str, args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    make = images_case if name == "images" else clip_case
    module, inputs, loss_of = make(args, device)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-4)
    batch = args.images_batch if name == "images" else args.clip_batch
    mini = min(args.mini_batch_size, batch)

    def step(data: Any, cached: bool) -> None:
        module.set_gradient_cache(mini if cached else None)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_of(data)
        loss.backward()
        optimizer.step()

    def row(label: str, size: int, result: dict[str, Any]) -> dict[str, Any]:
        return {"loss": f"{name}: {label}", "dtype": "bf16", "dim": None, "batch": size,
                **result, "peer": None}

    rows = [row("mini step (uncached)", mini, measure(
        functools.partial(step, inputs(mini), False), device, args.repeats))]
    rows.append(row("loss alone", batch, loss_alone(name, module, batch, device, args.repeats)))
    largest, size = None, mini * 2
    while size <= min(batch, args.uncached_max or batch):
        result = measure(functools.partial(step, inputs(size), False), device, args.repeats)
        rows.append(row("uncached", size, result))
        if result["status"] != "ok":
            break
        largest, size = rows[-1], size * 2
    cached = row(f"cached, mini-batch {mini}", batch, measure(
        functools.partial(step, inputs(batch), True), device, args.repeats))
    rows.append(cached)
    targets(cached, rows[0], rows[1], largest or rows[0])
    return rows


def loss_alone(name: str, module: Any, batch: int, device: torch.device,
               repeats: int) -> dict[str, Any]:
    """The loss's forward and backward on random embeddings of ``batch`` rows."""
    dim = 128 if name == "images" else module.model.text_projection.shape[1]
    z = [torch.randn(batch, dim, device=device, requires_grad=True) for _ in range(2)]

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            if name == "images":
                loss = module.criterion(*z)
            else:
                loss = module.criterion(*z, module.model.logit_scale.exp())
        loss.backward()

    return measure(step, device, repeats)


def targets(cached: dict[str, Any], mini: dict[str, Any], loss: dict[str, Any],
            largest: dict[str, Any]) -> None:
    """The issue's two ratios on the cached row (``None`` where a part did not run)."""
    if cached["status"] != "ok":
        return
    if None not in (cached["peak_bytes"], mini["peak_bytes"], loss["peak_bytes"]):
        cached["memory_vs_peer"] = cached["peak_bytes"] / (mini["peak_bytes"]
                                                           + loss["peak_bytes"])
    if largest["status"] == "ok":
        cached["time_vs_peer"] = ((cached["time_s"] / cached["batch"])
                                  / (largest["time_s"] / largest["batch"]))
        cached["peer"] = (f"memory: mini step + loss alone (target <= 1.3); time per sample: "
                          f"uncached at {largest['batch']:,} (target <= 1.4)")


class _Saved:
    """The bytes of the tensors autograd keeps alive for the backward (no parameter's), and
    their peak; what :func:`torch.autograd.graph.saved_tensors_hooks` packs."""

    class _Holder:
        def __init__(self, tensor: torch.Tensor) -> None:
            self.tensor = tensor

    def __init__(self, module: torch.nn.Module) -> None:
        self.live = self.peak = 0
        self.params = {p.untyped_storage().data_ptr() for p in module.parameters()}

    def pack(self, tensor: torch.Tensor) -> Any:
        holder = self._Holder(tensor)
        if tensor.untyped_storage().data_ptr() not in self.params:
            size = tensor.numel() * tensor.element_size()
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(holder, self._free, size)
        return holder

    def _free(self, size: int) -> None:
        self.live -= size

    @staticmethod
    def unpack(holder: Any) -> torch.Tensor:
        return holder.tensor


def saved_activations(args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    """The ``images`` step's saved activations at each batch, uncached and cached (float32)."""
    rows = []
    for batch in args.saved_activations:
        for mini in (None, args.mini_batch_size):
            torch.manual_seed(0)
            module, inputs, loss_of = images_case(args, device)
            module.set_gradient_cache(mini)
            meter = _Saved(module)
            with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
                loss_of(inputs(batch)).backward()
            label = "uncached" if mini is None else f"cached, mini-batch {mini}"
            rows.append({"loss": f"images saved activations: {label}", "dtype": "float32",
                         "dim": None, "batch": batch, "status": "ok", "time_s": None,
                         "saved_bytes": meter.peak, "peak_bytes": None, "peer": None})
            print(f"{rows[-1]['loss']:<48} {batch:>7,}  {meter.peak / 2**20:8.1f} MiB")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_gradcache.py: CUDA is not available (--device cpu runs the smoke path)")
        return 0
    warnings.filterwarnings("ignore", "You are trying to `self.log")  # no Trainer here
    torch.manual_seed(0)
    if args.saved_activations:
        rows = saved_activations(args, device)
        write(args, argv, device, rows)
        return 0
    rows = [r for case in args.cases for r in run_case(case, args, device)]
    for r in rows:
        time_ms = f"{r['time_s'] * 1e3:10.1f} ms" if r["status"] == "ok" else f"{r['status']:>13}"
        peak = "" if r.get("peak_bytes") is None else f"{r['peak_bytes'] / 2**20:10.0f} MiB"
        ratios = "".join(f"  {k} {r[k]:.2f}" for k in ("memory_vs_peer", "time_vs_peer")
                         if r.get(k) is not None)
        print(f"{r['loss']:<36} {r['batch']:>7,}  {time_ms}  {peak}{ratios}")
    write(args, argv, device, rows)
    return 0


def write(args: argparse.Namespace, argv: list[str] | None, device: torch.device,
          rows: list[dict[str, Any]]) -> None:
    """The rows as JSON at ``--out``, with the device."""
    if args.out is None:
        return
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"environment": {"gpu": gpu, "torch": torch.__version__,
                                                    "device": str(device)},
                                    "argv": sys.argv[1:] if argv is None else argv,
                                    "losses": rows}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
