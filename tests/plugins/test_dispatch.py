"""The dispatcher (:mod:`adaptcl.plugins.tiles.dispatch`): the scoped ``tiling`` setting and the
one plan per loss call (materialise, the PyTorch loop or the fused kernel, and the tile).

The CUDA decisions are tested on the CPU with a CUDA-typed stand-in: only the shapes, dtypes and
device of the candidates are read, never a value, so a namespace with those attributes is what
the dispatcher sees of a CUDA batch.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from adaptcl.plugins import (
    AMCLLoss,
    ASCLLoss,
    DySTreSSLoss,
    InfoNCELoss,
    NCELoss,
    PairTemperature,
    current_tiling,
    tiling,
)
from adaptcl.plugins.candidates import Candidates
from adaptcl.plugins.hardness import HardnessBias
from adaptcl.plugins.targets import LabelTargets
from adaptcl.plugins.tiles import budget, dispatch

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _default_setting(monkeypatch):
    """Each test starts from the default setting and leaves it so; nothing said yet."""
    monkeypatch.setattr(dispatch, "_SETTING", dispatch.TilingSetting())
    monkeypatch.setattr(budget, "_SAID", set())
    monkeypatch.setattr(budget, "_SWITCHED", {})


# --------------------------------------------------------------------------------------------
# The scoped setting
# --------------------------------------------------------------------------------------------

def test_tiling_is_a_function_and_a_context_manager_as_set_grad_enabled():
    default = dispatch.TilingSetting("auto", None)
    assert current_tiling() == default
    tiling(backend="torch")  # called: process-wide from now on
    assert current_tiling() == dispatch.TilingSetting("torch", None)
    with tiling(max_logits_bytes=2**20):  # each call sets both: backend back to its default
        assert current_tiling() == dispatch.TilingSetting("auto", 2**20)
        with tiling(backend="triton", max_logits_bytes=5):
            assert current_tiling() == dispatch.TilingSetting("triton", 5)
        assert current_tiling() == dispatch.TilingSetting("auto", 2**20)
    assert current_tiling() == dispatch.TilingSetting("torch", None)
    with pytest.raises(RuntimeError, match="inside"), tiling(backend="triton"):
        raise RuntimeError("inside")
    assert current_tiling() == dispatch.TilingSetting("torch", None)  # restored on error
    tiling()
    assert current_tiling() == default


def test_tiling_is_process_wide_not_thread_local():
    seen = []
    with tiling(backend="torch", max_logits_bytes=123):
        thread = threading.Thread(target=lambda: seen.append(current_tiling()))
        thread.start()
        thread.join()
    assert seen == [dispatch.TilingSetting("torch", 123)]


@pytest.mark.parametrize("kwargs, error, start", [
    ({"backend": "cuda"}, ValueError, "backend must be one of ('auto', 'triton', 'torch')"),
    ({"backend": None}, ValueError, "backend must be one of"),
    ({"max_logits_bytes": 0}, ValueError, "max_logits_bytes must be >= 1"),
    ({"max_logits_bytes": 1.5}, TypeError, "max_logits_bytes must be an int"),
    ({"max_logits_bytes": True}, TypeError, "max_logits_bytes must be an int"),
])
def test_tiling_refuses_a_bad_argument_in_one_line_naming_it(kwargs, error, start):
    with pytest.raises(error) as raised:
        tiling(**kwargs)
    message = str(raised.value)
    assert message.startswith(start) and "\n" not in message, message
    assert current_tiling() == dispatch.TilingSetting()  # nothing was set


# --------------------------------------------------------------------------------------------
# The plan on the CPU
# --------------------------------------------------------------------------------------------

def _cpu(rows: int = 100) -> list[Candidates]:
    a = torch.empty(rows, 16, device="meta")
    return [Candidates(anchors=a, keys=a, positive_sim=a[:, 0])]


def _never_asked() -> str | None:
    raise AssertionError("the kernel was asked about a case its answer cannot change")


def test_on_the_cpu_auto_materialises_and_an_int_takes_the_loop():
    cands = _cpu()
    assert dispatch.plan_tiles("InfoNCE", cands, "auto", kernel=_never_asked) \
        == dispatch.MATERIALISED
    assert dispatch.plan_tiles("InfoNCE", cands, None, kernel=_never_asked) \
        == dispatch.MATERIALISED
    assert dispatch.plan_tiles("InfoNCE", cands, 48, kernel=_never_asked) \
        == dispatch.TilePlan("loop", 48)
    with tiling(max_logits_bytes=1), pytest.warns(budget.LogitsBudgetWarning):
        plan = dispatch.plan_tiles("InfoNCE", cands, "auto", kernel=_never_asked)
    assert plan == dispatch.TilePlan("loop", budget.MIN_TILE, chosen=budget.MIN_TILE)
    with tiling(max_logits_bytes=1):  # None and an int are the loss's own choice
        assert dispatch.plan_tiles("InfoNCE", cands, None) == dispatch.MATERIALISED
        assert dispatch.plan_tiles("InfoNCE", cands, 48) == dispatch.TilePlan("loop", 48)
    # a configuration without a tiled path materialises under "auto"
    with tiling(max_logits_bytes=1):
        assert dispatch.plan_tiles("AMCL", cands, "auto", tileable=False) \
            == dispatch.MATERIALISED


def test_triton_takes_the_kernel_for_every_tiled_call_or_refuses_in_one_line():
    cands = _cpu()
    with tiling(backend="triton"):
        assert dispatch.plan_tiles("InfoNCE", cands, None) == dispatch.MATERIALISED
        assert dispatch.plan_tiles("InfoNCE", cands, 8, kernel=lambda: None) \
            == dispatch.TilePlan("kernel", 8)
        assert dispatch.plan_tiles("InfoNCE", cands, "auto", kernel=lambda: None) \
            == dispatch.TilePlan("kernel")
        for tile_size in (8, "auto"):
            with pytest.raises(ValueError) as raised:
                dispatch.plan_tiles("NCE", cands, tile_size)
            assert str(raised.value) == ("tiling(backend='triton') cannot run here: NCE has no "
                                         "kernel path; use backend='auto' or 'torch'")


# --------------------------------------------------------------------------------------------
# The plan on CUDA (a stand-in: shapes, dtypes and device are all the dispatcher reads)
# --------------------------------------------------------------------------------------------

def _cuda(rows: int, input_dtype: torch.dtype, *, columns: int | None = None) -> list[Candidates]:
    def tensor(n):
        return SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.float32,
                               shape=(n, 128), element_size=lambda: 4)

    return [Candidates(anchors=tensor(rows), keys=tensor(columns or rows), positive_sim=None,
                       input_dtype=input_dtype)]


@pytest.fixture
def cuda_budget(monkeypatch):
    """The CUDA budget, faked: ``state["bytes"]`` (the default: room for anything)."""
    state = {"bytes": 2**62, "reads": 0}

    def device_budget(device):
        state["reads"] += 1
        return state["bytes"]

    monkeypatch.setattr(budget, "device_budget", device_budget)
    return state


def _path(cands, tile_size="auto", why=None):
    return dispatch.plan_tiles("InfoNCE", cands, tile_size, kernel=lambda: why)


def test_auto_takes_the_kernel_on_cuda_from_the_threshold_on_tensor_cores(cuda_budget):
    side = 2**13  # 8,192 x 8,192 logits: KERNEL_FROM_LOGITS
    assert side * side == dispatch.KERNEL_FROM_LOGITS
    for dtype, precision in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        assert _path(_cuda(side, dtype)) == dispatch.TilePlan("kernel", precision=precision)
    assert cuda_budget["reads"] == 0  # the kernel pays: the budget is not even read
    # one row short of the threshold: materialised while the logits fit
    assert _path(_cuda(side - 1, torch.bfloat16, columns=side)) == dispatch.MATERIALISED
    # over the budget below the threshold: the tiled path, which is the kernel on tensor cores
    cuda_budget["bytes"] = 2**20
    with pytest.warns(budget.LogitsBudgetWarning):
        plan = _path(_cuda(4096, torch.bfloat16))
    assert plan == dispatch.TilePlan("kernel", 256, chosen=256, precision="bf16")


def test_float32_follows_the_matmul_precision_and_ieee_stays_off_the_kernel(cuda_budget):
    big = _cuda(2**14, torch.float32)
    previous = torch.get_float32_matmul_precision()
    try:
        assert torch.get_float32_matmul_precision() == "highest"  # PyTorch's default
        assert _path(big) == dispatch.MATERIALISED  # IEEE products: not on tensor cores
        assert _path(big, 1024) == dispatch.TilePlan("loop", 1024)
        for setting, precision in (("high", "tf32"), ("medium", "bf16")):
            torch.set_float32_matmul_precision(setting)
            assert _path(big) == dispatch.TilePlan("kernel", precision=precision)
    finally:
        torch.set_float32_matmul_precision(previous)
    cuda_budget["bytes"] = 2**20
    with pytest.warns(budget.LogitsBudgetWarning):
        assert _path(big).path == "loop"  # IEEE over the budget: the PyTorch loop
    assert _path(_cuda(2**14, torch.float64)).path == "loop"


def test_a_case_the_kernel_does_not_cover_and_backend_torch_stay_off_it(cuda_budget):
    big = _cuda(2**14, torch.bfloat16)
    assert _path(big, why="it has no HardnessBias") == dispatch.MATERIALISED
    assert _path(big, 512, why="it has no HardnessBias") == dispatch.TilePlan(
        "loop", 512, precision="bf16")
    with tiling(backend="torch"):
        assert _path(big) == dispatch.MATERIALISED
        assert _path(big, 512) == dispatch.TilePlan("loop", 512, precision="bf16")
    with tiling(backend="triton"):
        assert _path(_cuda(64, torch.float32)) == dispatch.TilePlan("kernel")  # any size
        with pytest.raises(ValueError, match=r"cannot run here: it has no HardnessBias; use "):
            _path(big, why="it has no HardnessBias")


# --------------------------------------------------------------------------------------------
# What each loss tells the dispatcher (the kernel's question, spied on)
# --------------------------------------------------------------------------------------------

@pytest.fixture
def asked(monkeypatch):
    """The kernel's question, spied: it records the parts it was asked about and refuses, so
    that ``tiling(backend="triton")`` raises with the spy's reason."""
    questions = []

    def unsupported(a, k, masks, weights, bias, term):
        questions.append({"weights": weights, "bias": bias, "term": term, "masks": len(masks)})
        return "spied"

    def pair_unsupported(a, k, pa, pk, masks, pair, precision=None):
        questions.append({"pair": pair})
        return "spied"

    monkeypatch.setattr(dispatch.fused, "unsupported", unsupported)
    monkeypatch.setattr(dispatch.fused, "pair_unsupported", pair_unsupported)
    return questions


def _refused(loss_fn, *inputs, **pairs) -> str:
    with tiling(backend="triton"), pytest.raises(ValueError) as raised:
        loss_fn(*inputs, **pairs)
    return str(raised.value)


def test_each_loss_describes_its_parts_to_the_kernel(asked):
    g = torch.Generator().manual_seed(0)
    z0, z1 = torch.randn(12, 8, generator=g), torch.randn(12, 8, generator=g)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 3, 4])
    assert "cannot run here: spied" in _refused(InfoNCELoss(0.1, tile_size=4), z0, z1)
    assert asked.pop() == {"weights": None, "bias": None, "term": None, "masks": 2}
    _refused(InfoNCELoss(0.1, tile_size=4, form="cross_view"), z0, z1, labels=labels)
    assert isinstance(asked.pop()["weights"], LabelTargets)
    _refused(InfoNCELoss(0.1, tile_size=4, hardness_mode="all_negatives",
                         hardness_strength=1.0, form="cross_view"), z0, z1)
    assert isinstance(asked.pop()["bias"], HardnessBias)
    _refused(DySTreSSLoss(0.1, 0.2, tile_size=4), z0, z1)
    assert asked.pop()["term"] is not None
    _refused(AMCLLoss(PairTemperature(8), tile_size=4), z0, z1)
    assert asked.pop()["pair"] is not None
    assert asked == []
    # what the method knows it has no kernel for is said without asking the kernel
    assert "it has no AMCL top-kappa term" in _refused(
        AMCLLoss(PairTemperature(8), negative_term="topk", tile_size=4), z0, z1)
    assert "it has no ASCL soft targets" in _refused(
        ASCLLoss(0.1, 0.05, 1, form="cross_view", tile_size=4), z0, z1)
    assert "survey loss has no kernel path" in _refused(NCELoss(tile_size=4), z0, z1)
    assert asked == []


# --------------------------------------------------------------------------------------------
# torch.compile: the setting is read while tracing, and guarded
# --------------------------------------------------------------------------------------------

def test_a_compiled_loss_recompiles_when_the_setting_changes():
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(3)
    z0, z1 = torch.randn(90, 16, generator=g), torch.randn(90, 16, generator=g)
    materialised = InfoNCELoss(0.1, tile_size=None, reduction="none")(z0, z1)
    tiled = InfoNCELoss(0.1, tile_size=budget.MIN_TILE, reduction="none")(z0, z1)
    assert not torch.equal(materialised, tiled)  # the two paths round apart on this batch
    compiled = torch.compile(InfoNCELoss(0.1, reduction="none"), backend="eager",
                             fullgraph=True)
    assert torch.equal(compiled(z0, z1), materialised)
    with tiling(max_logits_bytes=1), pytest.warns(budget.LogitsBudgetWarning):
        assert torch.equal(compiled(z0, z1), tiled)
    assert torch.equal(compiled(z0, z1), materialised)
    torch._dynamo.reset()
