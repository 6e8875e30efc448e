"""Helpers for the two-process gloo tests."""

from __future__ import annotations

import socket
from collections.abc import Callable


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now, for ``MASTER_PORT``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_results(worker: Callable, world: int) -> dict:
    """Run ``worker(rank, port, results)`` in ``world`` processes and return what each rank put
    in ``results[rank]`` (a managed dict); skips where torch.distributed is unavailable."""
    import pytest
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(worker, args=(free_port(), results), nprocs=world, join=True)
    return dict(results)
