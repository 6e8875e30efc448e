"""What the multi-process tests share: two (or more) processes joined by a gloo process group
on this machine (:func:`gloo_results`), and a Lightning DDP script run as a user runs one
(:func:`run_ddp_script`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now, for ``MASTER_PORT``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_worker(rank: int, port: int, results: Any, compute: Callable[[int], Any],
                 world: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        results[rank] = compute(rank)
    finally:
        dist.destroy_process_group()


def gloo_results(compute: Callable[[int], Any], world: int = 2) -> dict[int, Any]:
    """``{rank: compute(rank)}``, each computed in a process of its own, the ``world`` of them
    joined by a gloo process group (one torch thread each). ``compute`` must be picklable (a
    module-level function, or a ``functools.partial`` of one) and return a picklable value.
    Skips where torch.distributed is unavailable."""
    import pytest
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_gloo_worker, args=(free_port(), results, compute, world), nprocs=world,
             join=True)
    return dict(results)


def run_ddp_script(script: str, folder: Path, *, timeout: float, world: int = 2) -> list[dict]:
    """Run a Lightning training ``script`` (its text) with ``strategy="ddp"`` as a user runs
    one: a file started in a process of its own, which Lightning relaunches for the other ranks
    (no pickling of the module, as ``ddp_spawn`` would need). The script gets ``folder`` as its
    first argument, the checkout's ``src`` and the repository (``tests``) on its path and one
    thread per process, and writes what each rank saw to ``folder/rank<r>.json``: returned in
    rank order once it exited 0."""
    path = folder / "ddp_script.py"
    path.write_text(script)
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
               PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO),
                                           os.environ.get("PYTHONPATH", "")]))
    env.pop("LOCAL_RANK", None)  # rank 0 is the process started here
    proc = subprocess.run([sys.executable, str(path), str(folder)], env=env, cwd=str(folder),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world)]


def step_on_rank(loss_fn: Callable[..., Any], full: tuple, rank: int, rows: int, world: int,
                 **kwargs: Any) -> dict[str, Any]:
    """One step of ``loss_fn`` on ``rank``'s ``rows`` rows of each tensor of the full batch
    ``full`` (in a gloo process group), as DDP averages it over the ranks: ``loss``, the mean of
    the ranks' losses; ``grads``, each input's gradient divided by ``world`` (the inputs are
    per-rank leaves); ``params``, the mean over ranks of the gradient of each parameter of
    ``loss_fn`` that has one (a learned temperature). All as lists: what a single process
    computes on the full batch, row block by row block."""
    import torch.distributed as dist

    inputs = [x[rank * rows:(rank + 1) * rows].clone().requires_grad_() for x in full]
    loss = loss_fn(*inputs, **kwargs)
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    params = [p.grad.clone() for p in getattr(loss_fn, "parameters", list)()
              if p.grad is not None]
    for grad in params:  # what DDP does with a parameter's gradient
        dist.all_reduce(grad)
    return {"loss": (total / world).item(), "grads": [(x.grad / world).tolist() for x in inputs],
            "params": [(grad / world).tolist() for grad in params]}


def full_batch(rows: int, dim: int, world: int, columns: int = 2, **kwargs: Any) -> list:
    """``columns`` tensors of ``world * rows`` random rows of width ``dim`` (seed 0; ``kwargs``
    to ``torch.randn``, e.g. a dtype): the batch the ranks split, the same in every process."""
    import torch

    g = torch.Generator().manual_seed(0)
    return [torch.randn(world * rows, dim, generator=g, **kwargs) for _ in range(columns)]
