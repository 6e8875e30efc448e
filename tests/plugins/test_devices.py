"""Device discipline of the loss core: every tensor follows the inputs' device, and a loss's
forward + backward never synchronises host and device.

On this CPU machine device mistakes are caught anyway: the ``meta`` device has no data, so a
tensor created on the CPU inside a loss meets a meta tensor and fails loudly; and a dispatch
mode records every operation that needs a value on the host (``item()``, ``bool()``,
``int()``, ``nonzero()``, ``tolist()``), each of which would stall a GPU once per step. With
CUDA, the same losses run under ``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from adaptcl.plugins import InfoNCELoss, MACLLoss

from ._helpers import LOSSES


def _inputs(device, needs_queue, n=6, d=8):
    g = torch.Generator().manual_seed(0)
    z0, z1, queue = (torch.randn(k, d, generator=g).to(device) for k in (n, n, 5))
    return z0.requires_grad_(), z1.requires_grad_(), (queue if needs_queue else None)


def _prepared(name, device, tile, check_finite=True):
    """The table's loss ``name`` (``tile`` only where it takes one) and its inputs, on ``device``."""
    case = LOSSES[name]
    fn = case.build(tile_size=tile, check_finite=check_finite).to(device)
    return fn, case.inputs(device=device)


def _step(fn, x):
    """Forward and backward: what a training step asks of a loss."""
    loss = fn(*x)
    loss.backward()
    return loss


def _run(name, device, tile, check_finite=True):
    fn, x = _prepared(name, device, tile, check_finite)
    return fn, _step(fn, x), x[0]


@pytest.mark.parametrize("tile", [None, 4])
@pytest.mark.parametrize("name", list(LOSSES))
def test_every_loss_runs_forward_and_backward_on_the_meta_device(name, tile):
    fn, loss, z0 = _run(name, "meta", tile)
    assert loss.device.type == "meta"
    assert z0.grad is not None and z0.grad.device.type == "meta"
    assert all(v.device.type == "meta" for v in fn.last_stats.values()), fn.last_stats


def test_meta_device_catches_a_tensor_created_on_the_cpu():
    """The purpose-made regression: a loss that adds a constant built on the CPU."""
    class CPUConstantLoss(InfoNCELoss):
        def compute(self, z0, z1, negatives):
            per_anchor, stats = super().compute(z0, z1, negatives)
            return per_anchor + torch.zeros(per_anchor.shape[0]), stats  # the mistake

    z0, z1, _ = _inputs("meta", False)
    with pytest.raises((RuntimeError, NotImplementedError)):
        CPUConstantLoss(0.1)(z0, z1).backward()


class HostSyncDetector(TorchDispatchMode):
    """Records every operation that needs a tensor's value on the host.

    ``item()``, ``bool()``, ``int()`` and ``float()`` dispatch to ``_local_scalar_dense``;
    ``nonzero()`` must know its output size; ``tolist()`` reads the data directly, so it is
    patched for the duration.
    """

    SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "unique_dim", "_unique2"}

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.SYNCING:
            self.calls.append(name)
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._tolist = torch.Tensor.tolist

        def tolist(t):
            self.calls.append("tolist")
            return self._tolist(t)

        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)


@pytest.mark.parametrize("tile", [None, 4])
@pytest.mark.parametrize("name", list(LOSSES))
def test_forward_and_backward_never_synchronise(name, tile):
    """With the finiteness check off (on CPU it reads one bool; on CUDA it is asynchronous)."""
    with HostSyncDetector() as detector:
        _run(name, "cpu", tile, check_finite=False)
    assert detector.calls == [], f"{name} synchronises: {detector.calls}"


def test_finiteness_check_reads_one_value_on_cpu_only():
    with HostSyncDetector() as detector:
        _run("macl", "cpu", None, check_finite=True)
    assert detector.calls == ["_local_scalar_dense"] * 2  # z0 and z1, once each


@pytest.mark.parametrize("regression", ["item", "nonzero", "tolist", "bool"])
def test_sync_detector_catches_a_purpose_made_regression(regression):
    class SyncingLoss(MACLLoss):
        def compute(self, z0, z1, negatives):
            per_anchor, stats = super().compute(z0, z1, negatives)
            if regression == "item":
                per_anchor = per_anchor * per_anchor.detach().max().item()
            elif regression == "nonzero":
                per_anchor = per_anchor[(per_anchor > -1).nonzero().squeeze(1)]
            elif regression == "tolist":
                per_anchor = per_anchor * len(per_anchor.detach().tolist())
            elif bool((per_anchor > 100).any()):  # Python branching on a tensor value
                per_anchor = per_anchor * 2
            return per_anchor, stats

    z0, z1, _ = _inputs("cpu", False)
    with HostSyncDetector() as detector:
        SyncingLoss(0.1, check_finite=False)(z0, z1).backward()
    assert detector.calls, regression


def test_stats_follow_the_input_device(device):
    fn, loss, _ = _run("macl_fixed", device, None)
    assert {v.device.type for v in fn.last_stats.values()} == {torch.device(device).type}


class CrossDeviceCopyDetector(HostSyncDetector):
    """:class:`HostSyncDetector` plus every copy from one device to another: what
    ``torch.cuda.set_sync_debug_mode("error")`` refuses besides the host reads (a copy from
    pageable host memory to the GPU waits for it). On the ``meta`` device the CPU machine
    sees the same copies (``.to("meta")`` of a CPU tensor)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        source = args[0].device if args and isinstance(args[0], torch.Tensor) else None
        if name == "_to_copy" and kwargs.get("device") not in (None, source):
            self.calls.append(f"_to_copy {source} -> {kwargs['device']}")
        elif name == "copy_" and isinstance(args[1], torch.Tensor) and args[1].device != source:
            self.calls.append(f"copy_ {args[1].device} -> {source}")
        return super().__torch_dispatch__(func, types, args, kwargs)


@contextmanager
def _cuda_sync_debug_error():
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _assert_steps_do_not_synchronise(device, guard, names=tuple(LOSSES)) -> None:
    """The table's losses ``names``, tiled and not: the module and its inputs are built and
    moved to ``device`` first (a copy from the host synchronises; it is the test's, not the
    loss's), then forward + backward run inside ``guard``, which must not object."""
    for name in names:
        for tile in (None, 4):
            fn, x = _prepared(name, device, tile, check_finite=True)
            with guard() as detector:
                _step(fn, x)
            if detector is not None:
                assert detector.calls == [], f"{name} (tile {tile}) synchronises: {detector.calls}"


def test_cuda_forward_and_backward_do_not_synchronise(device):
    if torch.device(device).type != "cuda":
        pytest.skip("needs CUDA: torch.cuda.set_sync_debug_mode")
    _assert_steps_do_not_synchronise(device, _cuda_sync_debug_error)


@pytest.mark.parametrize("name", list(LOSSES))
def test_the_cuda_sync_check_runs_on_the_meta_device_without_host_copies(name):
    """The CUDA test's own procedure on the meta device, with the copies and host reads
    recorded instead of refused: it passes only because the inputs are moved before the
    check starts (on CUDA the check first raised in the test's input helper, and so never
    reached a loss), and because no loss copies a tensor of its own from the host."""
    _assert_steps_do_not_synchronise("meta", CrossDeviceCopyDetector, names=[name])


def test_cross_device_copy_detector_catches_inputs_moved_inside_it():
    """What the CUDA test did first: build the inputs inside the checked region."""
    with CrossDeviceCopyDetector() as detector:
        LOSSES["macl"].inputs(device="meta")
    assert detector.calls and all(c.startswith("_to_copy cpu -> meta") for c in detector.calls)
    with CrossDeviceCopyDetector() as detector:
        torch.zeros(3, device="meta").copy_(torch.ones(3))
    assert detector.calls == ["copy_ cpu -> meta"]
