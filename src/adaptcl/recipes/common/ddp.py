"""Lightning's DDP as the recipes start it on several devices: the ranks meet before
torch.distributed's rendezvous, so that a SIGTERM or a Ctrl-C stops them at any moment of the
start-up too (:class:`StartTogether`).

Lightning's launcher starts ranks 1.. as the same command and rank 0 goes straight into
``init_process_group``, whose store waits in C++ (``TCPStore::waitForWorkers``) until every rank
has connected: up to the process group's timeout (30 minutes), with no Python signal handler
run meanwhile. A rank stopped by a signal while it starts never connects, so rank 0 slept on
after its SIGTERM (and on a Ctrl-C, Lightning's process observer SIGKILLed it: exit 137).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
from lightning_fabric.plugins.environments import LightningEnvironment
from pytorch_lightning.strategies import DDPStrategy

from adaptcl.recipes.common.devices import STRATEGIES
from adaptcl.recipes.engine.errors import RunStopped

#: the signals that stop a run (``kill``, ``timeout`` and schedulers; Ctrl-C)
STOPS = frozenset({signal.SIGINT, signal.SIGTERM})
#: set by rank 0 (its pid) before Lightning's launcher starts the other ranks: they inherit it
#: and meet rank 0 in :meth:`StartTogether.setup_distributed`
HOST = "ADAPTCL_DDP_HOST"
_ARRIVED, _GO, _STOP, _LEFT = "adaptcl/arrived", "adaptcl/go", "adaptcl/stop", "adaptcl/left"
_POLL = 0.05  # seconds between two looks at the store: a signal is handled in between
_GRACE = 5.0  # at most, for the ranks that arrived to read rank 0's stop
_CONNECT = timedelta(seconds=60)  # a rank's wait for rank 0's store (up before it started)


class Stopping(Exception):
    """A stop that every rank raises at one agreed point of ``trainer.fit``.

    Not a ``KeyboardInterrupt``: Lightning answers that by SIGKILLing the ranks it started
    (``_call_and_handle_interrupt``), whose deaths its process observer then answers by
    SIGKILLing rank 0 before it says why it stopped. An exception like any other only tears
    the trainer down."""


def peer_stopped(world: int, rank: int) -> RunStopped:
    """The one line of a rank whose run lost another rank (it was killed or crashed)."""
    other = f"rank {1 - rank}" if world == 2 else "another rank"
    return RunStopped(f"{other} of {world} processes stopped (it was killed or crashed; its own "
                      f"output says why), so rank {rank} stopped too")


class StartTogether(DDPStrategy):
    """``DDPStrategy`` whose ranks meet before the rendezvous of ``init_process_group``.

    Rank 0 (the process that started the others, :data:`HOST`) hosts the process group's
    store itself (multi-tenant, so ``init_process_group`` takes the same server) and waits for
    the other ranks in Python, a look at the store every 50 ms: each rank says it arrived and
    waits for rank 0's word. When all have arrived, rank 0 says go and every rank enters the
    rendezvous, which then completes at once. When a stop was requested first
    (:attr:`stop_requested`: the recipes' signal notes), rank 0 says stop, waits for the ranks
    that arrived to read it (they raise :class:`Stopping`), and raises :class:`Stopping`; a
    rank that had not arrived stops on its own signal (the whole process group gets it) without
    ever arriving. A rank that ends before it arrives without a stop of rank 0's is
    :class:`~adaptcl.recipes.engine.errors.RunStopped` for rank 0, and so is rank 0's end for a
    rank waiting for it. A rank that arrived obeys rank 0 alone, whatever it noted itself:
    rank 0 may already be in the rendezvous, which would wait for it.

    Ranks started otherwise (``torchrun``, SLURM) meet as Lightning's ``DDPStrategy`` does.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: the signal of the stop requested, or ``None`` (set by
        #: :func:`adaptcl.recipes.common.lightning.fit`)
        self.stop_requested: Callable[[], int | None] = lambda: None
        self._store: Any = None  # rank 0's server: alive until the rendezvous has taken it

    def setup_distributed(self) -> None:
        host = os.environ.get(HOST)
        if (host is not None and isinstance(self.cluster_environment, LightningEnvironment)
                and not torch.distributed.is_initialized()):
            if threading.current_thread() is threading.main_thread():
                # the other ranks are started: signals that waited for it are noted now
                signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
            if int(host) == os.getpid():
                self._host()
            else:
                self._guest(int(host))
        super().setup_distributed()

    def _connect(self, host: bool) -> Any:
        from torch.distributed import TCPStore

        env = self.cluster_environment
        return TCPStore(env.main_address, env.main_port, self.world_size, is_master=host,
                        timeout=self._timeout if host else _CONNECT, wait_for_workers=False,
                        multi_tenant=host)

    def _host(self) -> None:
        store = self._store = self._connect(host=True)
        procs = list(getattr(self.launcher, "procs", ()))
        start = time.monotonic()
        first = True
        while True:
            signum = self.stop_requested()
            if signum is not None:  # before the arrivals: stopping here is quickest
                if first:
                    # it may have come before the ranks were started, which then never got it;
                    # they have not unblocked it yet (their CLI takes longer than this), so a
                    # second copy of the same signal merges with the one they may have
                    self.launcher.kill(signum)
                store.set(_STOP, "1")
                deadline = time.monotonic() + _GRACE
                while (store.add(_LEFT, 0) < store.add(_ARRIVED, 0)
                       and time.monotonic() < deadline):
                    time.sleep(_POLL)
                raise Stopping
            if store.add(_ARRIVED, 0) >= self.world_size - 1:
                store.set(_GO, "1")
                return
            if any(proc.poll() is not None for proc in procs):
                raise peer_stopped(self.world_size, 0)
            if (self._timeout is not None
                    and time.monotonic() - start > self._timeout.total_seconds()):
                raise TimeoutError(f"rank 0 waited {self._timeout} for the other ranks to start")
            first = False
            time.sleep(_POLL)

    def _guest(self, host_pid: int) -> None:
        if self.stop_requested() is not None:  # not arrived: rank 0 stops, or sees this end
            raise Stopping
        if os.getppid() != host_pid:  # rank 0 has ended (killed, or stopped by a signal)
            raise peer_stopped(self.world_size, self.global_rank)
        store = self._connect(host=False)
        store.add(_ARRIVED, 1)
        while not store.check([_GO]):
            if store.check([_STOP]):
                store.add(_LEFT, 1)
                raise Stopping
            if os.getppid() != host_pid:
                raise peer_stopped(self.world_size, self.global_rank)
            time.sleep(_POLL)


def ddp_strategy(name: str, devices: int) -> str | StartTogether:
    """The strategy to give Lightning's ``Trainer`` for ``--strategy name`` on ``devices``:
    :class:`StartTogether` where Lightning would run its DDP (``auto`` or ``ddp`` on several
    devices), else ``name``."""
    if devices > 1 and name in STRATEGIES:
        return StartTogether()
    return name
