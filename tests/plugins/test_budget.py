"""The logits budget (:mod:`adaptcl.plugins.tiles._budget`): a ``tile_size="auto"`` loss whose
materialised logits would exceed ``tiling(max_logits_bytes=...)`` takes its exact tiled path,
says so once and in ``last_stats``.

Every loss of the shared table that takes ``tile_size`` is run three ways on one batch:
with a budget far below its logits (it must switch: the same bits as the explicit tiled path
at the tile the budget chose, value and input gradients, and the materialised value to float
rounding), with the explicit tile, and materialised. The CPU default (no budget) must not
switch, warn or add a statistic; the CUDA default reads the device's free memory, faked here.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from adaptcl.plugins import InfoNCELoss, LogitsBudgetWarning, MACLLoss, TilePlan, execution, tiling
from adaptcl.plugins.tiles import _budget as budget
from adaptcl.plugins.tiles import _dispatch as dispatch
from adaptcl.plugins.tiles._backend import Problem

from ._helpers import LOSSES, names

pytestmark = pytest.mark.usefixtures("one_thread")

METHODS = names(shared=True, tileable=True)
TOL = {"rtol": 1e-5, "atol": 1e-5}
TINY = 1  # byte: every batch is over it, the tile is budget.MIN_TILE


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    """Each test starts with nothing said yet, no CUDA budget read, no shape switched and the
    default setting (restored after it)."""
    monkeypatch.setattr(budget, "_SAID", set())
    monkeypatch.setattr(budget, "_CUDA_BUDGETS", {})
    monkeypatch.setattr(budget, "_SWITCHED", {})
    monkeypatch.setattr(execution, "_SETTING", execution.TilingSetting())


def _value_and_grads(fn, x):
    loss = fn(*x)
    return loss.detach(), torch.autograd.grad(loss, x[:2], materialize_grads=True)


def _inputs(name, n=100):
    # 100 pairs: 200 anchors in the NT-Xent form, more than three tiles of MIN_TILE = 64
    return LOSSES[name].inputs(n=n, seed=7, k=150)


@pytest.mark.parametrize("name", METHODS)
def test_over_budget_a_module_takes_its_tiled_path(name):
    case, x = LOSSES[name], _inputs(name)
    capped = case.build()
    with pytest.warns(LogitsBudgetWarning, match=r"tile_size=64 instead"), tiling(
            max_logits_bytes=TINY):
        value, grads = _value_and_grads(capped, x)
    assert capped.last_stats["auto_tile_size"].item() == budget.MIN_TILE
    tiled = case.build(tile_size=budget.MIN_TILE)
    t_value, t_grads = _value_and_grads(tiled, x)
    assert torch.equal(value, t_value)  # the tiled path itself, not merely a close number
    assert all(torch.equal(g, t) for g, t in zip(grads, t_grads, strict=True))
    materialised = case.build()
    m_value, m_grads = _value_and_grads(materialised, x)
    torch.testing.assert_close(value, m_value, **TOL)
    for g, m in zip(grads, m_grads, strict=True):
        torch.testing.assert_close(g, m, **TOL)
    assert "auto_tile_size" not in tiled.last_stats
    assert "auto_tile_size" not in materialised.last_stats


@pytest.mark.parametrize("name", METHODS)
def test_over_budget_a_functional_form_takes_its_tiled_path(name):
    case, x = LOSSES[name], _inputs(name)
    with pytest.warns(LogitsBudgetWarning), tiling(max_logits_bytes=TINY):
        capped = case.functional(*x)
    assert torch.equal(capped, case.functional(*x, tile_size=budget.MIN_TILE))
    torch.testing.assert_close(capped, case.functional(*x), **TOL)


@pytest.mark.parametrize("form", ["nt_xent", "cross_view"])
def test_the_issue_example_tiles_a_1024_pair_batch_and_gives_the_materialised_value(form):
    g = torch.Generator().manual_seed(0)
    z0, z1 = (torch.randn(1024, 64, generator=g).requires_grad_() for _ in range(2))
    capped = InfoNCELoss(temperature=0.1, form=form)
    with pytest.warns(LogitsBudgetWarning), tiling(max_logits_bytes=2**20):
        value, grads = _value_and_grads(capped, (z0, z1))
    # [tile, tile] float32 temporaries within 1 MiB: 4 * 4 * 256^2 bytes
    assert capped.last_stats["auto_tile_size"].item() == 256
    m_value, m_grads = _value_and_grads(InfoNCELoss(temperature=0.1, form=form), (z0, z1))
    torch.testing.assert_close(value, m_value, **TOL)
    for a, b in zip(grads, m_grads, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_the_switch_is_said_once_and_in_last_stats_on_every_call():
    x = _inputs("macl")
    fn = MACLLoss(0.1, 0.5)
    with warnings.catch_warnings(record=True) as caught, tiling(max_logits_bytes=TINY):
        warnings.simplefilter("always")  # not the filters' once-per-location: our own once
        for _ in range(3):
            fn(*x)
            assert fn.last_stats["auto_tile_size"].item() == budget.MIN_TILE
        MACLLoss(0.1, 0.5)(*x)  # another instance: still once a process
        with tiling(max_logits_bytes=2):  # another budget, the same tile: still once
            fn(*x)
    said = [w for w in caught if issubclass(w.category, LogitsBudgetWarning)]
    assert len(said) == 1, [str(w.message) for w in caught]
    message = str(said[0].message)
    assert "\n" not in message
    assert message.startswith("MACL: the materialised logits would take about")
    assert "tiling(max_logits_bytes=...)" in message and "tile_size=64" in message


def test_under_budget_the_loss_stays_materialised_bit_for_bit():
    x = _inputs("infonce")
    roomy = InfoNCELoss(0.1)
    with warnings.catch_warnings(), tiling(max_logits_bytes=2**40):
        warnings.simplefilter("error")
        value = roomy(*x)
    assert torch.equal(value, InfoNCELoss(0.1)(*x))
    assert "auto_tile_size" not in roomy.last_stats


def test_an_explicit_tile_size_or_none_is_the_losss_choice_whatever_the_budget(monkeypatch):
    from adaptcl.plugins.tiles import _loop as loop

    tiles = []
    apply = loop._StreamedRowStats.apply
    monkeypatch.setattr(loop._StreamedRowStats, "apply",
                        lambda *args: tiles.append(args[2]) or apply(*args))
    x = _inputs("infonce")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is switched, so nothing is said
        for bytes_ in (TINY, 2**40):
            with tiling(max_logits_bytes=bytes_):
                fixed, never = InfoNCELoss(0.1, tile_size=48), InfoNCELoss(0.1, tile_size=None)
                fixed(*x)
                assert tiles == [48]  # the tile loop, at the loss's tile
                never(*x)
                assert tiles == [48]  # materialised: no tile
                assert "auto_tile_size" not in fixed.last_stats
                assert "auto_tile_size" not in never.last_stats
            tiles.clear()


def test_an_amcl_network_that_cannot_be_tiled_stays_materialised():
    from adaptcl.plugins import AMCLLoss, ConstantTemperature

    class Untileable(ConstantTemperature):  # no per-tile features: only the whole matrix
        features = squash = squash_grad = property()

    fn = AMCLLoss(Untileable(0.2))
    x = _inputs("infonce")
    with warnings.catch_warnings(), tiling(max_logits_bytes=TINY):
        warnings.simplefilter("error")
        value = fn(*x)
    assert "auto_tile_size" not in fn.last_stats
    assert torch.equal(value, AMCLLoss(ConstantTemperature(0.2))(*x))


def test_the_cpu_default_never_switches_warns_or_adds_a_statistic():
    x = _inputs("macl", n=600)  # 1,200 x 1,200 logits: 17 MiB, over any small budget
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn = MACLLoss(0.1, 0.5)
        value = fn(*x)
        roomy = MACLLoss(0.1, 0.5, tile_size=None)(*x)
    assert torch.equal(value, roomy)
    assert "auto_tile_size" not in fn.last_stats
    # and at the 65,536-pair batch that needs 206 GB materialised, shapes only
    huge = _problem(2 * 65536, 2 * 65536)
    assert dispatch.plan(huge, "auto") == TilePlan("materialise")
    assert budget.tile_over_budget(huge, None) is None
    assert budget.logits_peak_bytes(huge) == 3 * 4 * (2 * 65536) ** 2


def _problem(rows: int, cols: int, *directions: tuple[int, int], dtype=torch.float32,
             **fields) -> Problem:
    """A problem of these shapes on the CPU (all the budget reads)."""
    return Problem(method="InfoNCE", op=fields.pop("op", "row_stats"),
                   device=torch.device("cpu"), dtype=dtype, key_dtype=dtype, precision="ieee",
                   shapes=((rows, cols), *directions), width=16, form="nt_xent", masks=2,
                   **fields)


def test_the_estimate_counts_directions_heads_labels_and_float64():
    one = 3 * 4 * 100 * 300
    assert budget.logits_peak_bytes(_problem(100, 300)) == one
    assert budget.logits_peak_bytes(_problem(100, 300, (100, 300))) == 2 * one
    assert budget.logits_peak_bytes(_problem(100, 300, heads=4, copies=12)) == 4 * 4 * one
    labelled = _problem(100, 300, labels=True)
    assert budget.logits_peak_bytes(labelled) == 4 * 4 * 100 * 300  # the targets' matrix
    assert budget.logits_peak_bytes(_problem(100, 300, dtype=torch.float64)) == 2 * one
    assert budget.logits_peak_bytes(_problem(100, 300, dtype=torch.bfloat16)) == one


def test_the_default_budget_comes_from_the_device(monkeypatch):
    """Without ``max_logits_bytes`` the budget is ``device_budget``'s (CUDA's free memory):
    faked here so a CPU loss sees a small device."""
    monkeypatch.setattr(budget, "device_budget", lambda device: 2**20)
    x = _inputs("infonce", n=300)  # 600 x 600 logits, 4.3 MB materialised
    fn = InfoNCELoss(0.1)
    with pytest.warns(LogitsBudgetWarning, match=r"the default budget"):
        value = fn(*x)
    assert fn.last_stats["auto_tile_size"].item() == 256
    assert torch.equal(value, InfoNCELoss(0.1, tile_size=256)(*x))


def _fake_cuda(monkeypatch, free: int, reserved: int, allocated: int) -> list[int]:
    """CUDA's memory queries, faked: returns the list of driver reads (device indices)."""
    calls = []

    def mem_get_info(index):
        calls.append(index)
        return free, 80 * 2**30

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index: reserved)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda index: allocated)
    return calls


def test_the_cuda_budget_is_half_the_free_memory_read_again_when_memory_changed(monkeypatch):
    calls = _fake_cuda(monkeypatch, 10 * 2**30, 6 * 2**30, 4 * 2**30)
    cuda1 = torch.device("cuda", 1)
    # free 10 GiB + 2 GiB the caching allocator holds unused, half of it
    assert budget.device_budget(cuda1) == 6 * 2**30
    assert budget.device_budget(cuda1) == 6 * 2**30
    assert calls == [1]  # nothing changed: the driver is read once
    # the optimiser's state arrives: the allocator reserves more, the budget is read again
    _fake_cuda(monkeypatch, 2 * 2**30, 14 * 2**30, 12 * 2**30)
    monkeypatch.setattr(torch.cuda, "mem_get_info",
                        lambda index: calls.append(index) or (2 * 2**30, 80 * 2**30))
    assert budget.device_budget(cuda1) == 2 * 2**30
    assert calls == [1, 1]
    assert budget.device_budget(torch.device("cpu")) is None
    assert budget.device_budget(torch.device("meta")) is None


def test_a_shape_the_default_budget_switched_stays_tiled_at_its_tile(monkeypatch):
    """One way: after a switch the shape keeps its tile however the free memory moves, so a
    run changes path at most once per loss and shape, never back and forth."""
    state = {"free": 2**20}
    monkeypatch.setattr(budget, "device_budget", lambda device: state["free"])
    shape = _problem(600, 600)
    with pytest.warns(LogitsBudgetWarning):
        assert budget.tile_over_budget(shape, None) == 256
    state["free"] = 2**40  # memory freed: the logits would fit now
    assert budget.tile_over_budget(shape, None) == 256
    other = _problem(500, 500)
    assert budget.tile_over_budget(other, None) is None  # another shape: it fits
    # an explicit budget depends on the shapes alone
    assert budget.tile_over_budget(shape, 2**40) is None


@pytest.mark.parametrize("budget_bytes, device, tile", [
    (2**62, "cuda", 16384), (2**62, "cpu", 2048),
    (2**30, "cuda", 8192),       # 4 float32 [8192, 8192] temporaries = 1 GiB
    (2**30 - 1, "cuda", 4096),
    (2**20, "cpu", 256), (TINY, "cpu", 64), (TINY, "cuda", 64),
])
def test_the_automatic_tile_is_the_largest_that_fits_capped_by_device(budget_bytes, device,
                                                                       tile):
    assert budget.auto_tile_size(budget_bytes, device) == tile


def test_row_block_losses_pick_rows_of_the_whole_width():
    # the survey losses: 9 float32 [rows, 10,000] blocks within 48 MB -> 128 rows
    assert budget.auto_tile_size(48 * 10**6, "cpu", columns=10_000, copies=9) == 128
    rows = _problem(200, 10_000, op="row_blocks", copies=9)
    with pytest.warns(LogitsBudgetWarning):
        assert budget.tile_over_budget(rows, 48 * 10**6) == 128


@pytest.mark.parametrize("peak, said", [
    (3 * 4 * 8 * 8, "about 768 bytes"), (3 * 4 * 20 * 20, "about 4.69 KiB"),
    (3 * 4 * 1024 * 1024, "about 12 MiB"), (3 * 4 * 2**15 * 2**15, "about 12 GiB"),
])
def test_the_warning_says_the_estimate_in_a_unit_that_fits(peak, said):
    """Issue 54, item 4: a small estimate was said as "about 0 MiB"."""
    side = int((peak // 12) ** 0.5)
    with pytest.warns(LogitsBudgetWarning) as caught:
        budget.tile_over_budget(_problem(side, side), 1)
    assert f"would take {said} on cpu" in str(caught[0].message)


@pytest.mark.parametrize("bad, error", [
    (0, ValueError), (-1, ValueError), (1.5, TypeError), (2.0**20, TypeError),
    (True, TypeError), ("1MB", TypeError),
])
def test_invalid_budgets_are_refused_in_one_line_naming_the_argument(bad, error):
    before = execution.current_tiling()
    with pytest.raises(error, match=r"^max_logits_bytes must be ") as raised:
        tiling(max_logits_bytes=bad)
    assert "\n" not in str(raised.value)
    assert execution.current_tiling() == before  # a refused setting changes nothing


@pytest.mark.parametrize("name", ["infonce", "macl", "dystress", "ascl_queue", "amcl_softmax",
                                  "learnable", "nce"])
def test_deciding_and_switching_never_synchronise(name):
    from .test_devices import HostSyncDetector

    case = LOSSES[name]
    fn = case.build(check_finite=False)
    x = _inputs(name)
    with HostSyncDetector() as detector, pytest.warns(LogitsBudgetWarning), tiling(
            max_logits_bytes=TINY):
        fn(*x).backward()
    assert detector.calls == [], detector.calls
    assert "auto_tile_size" in fn.last_stats


def test_the_tile_size_shows_in_repr_unless_auto():
    assert "tile_size=64" in repr(InfoNCELoss(0.1, tile_size=64))
    assert "tile_size=None" in repr(InfoNCELoss(0.1, tile_size=None))
    assert "tile_size" not in repr(InfoNCELoss(0.1))


def test_compiled_fullgraph_loss_switches_and_says_it_once():
    torch._dynamo.reset()
    x = _inputs("infonce", n=80)
    eager = InfoNCELoss(0.1)
    compiled = torch.compile(InfoNCELoss(0.1), fullgraph=True, backend="eager")
    with warnings.catch_warnings(record=True) as caught, tiling(max_logits_bytes=TINY):
        warnings.simplefilter("always")
        for _ in range(2):
            value = compiled(*x)
        expected = eager(*x)
    said = [w for w in caught if issubclass(w.category, LogitsBudgetWarning)]
    assert len(said) == 1
    torch.testing.assert_close(value, expected, rtol=1e-6, atol=1e-6)
    torch._dynamo.reset()


@pytest.mark.gpu
def test_the_cuda_default_switches_when_free_memory_is_short(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setattr(budget, "CUDA_BUDGET_FRACTION", 1e-6)  # a device that looks full
    x = tuple(t.detach().cuda().requires_grad_() for t in _inputs("macl"))
    fn = MACLLoss(0.1, 0.5)
    with pytest.warns(LogitsBudgetWarning, match=re.escape("the default budget")):
        value, grads = _value_and_grads(fn, x)
    assert "auto_tile_size" in fn.last_stats
    m_value, m_grads = _value_and_grads(MACLLoss(0.1, 0.5, tile_size=None), x)
    torch.testing.assert_close(value, m_value, **TOL)
    for a, b in zip(grads, m_grads, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_the_budget_marks_its_constants_as_torch_compiler_does():
    """_budget.py marks its two trace-time constants by the attribute that
    torch.compiler.assume_constant_result sets (importing torch._dynamo at import time would
    cost every import of the core about 2 s): the public decorator must still work that way."""

    def probe():
        return 0

    torch.compiler.assume_constant_result(probe)
    assert probe.__dict__ == {"_dynamo_marked_constant": True}
    assert budget._cuda_budget._dynamo_marked_constant is True
    assert budget._say_once._dynamo_marked_constant is True
