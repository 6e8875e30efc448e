"""The dispatcher (:mod:`adaptcl.plugins.tiles._dispatch`): each loss call described once as a
frozen problem, every backend asked why not, one plan (materialise or a backend, the tile, the
precision, the reasons), every op on the plan's backend.

The CUDA decisions are tested on the CPU: a problem holds shapes, dtypes and the device, never a
tensor, so a problem on ``cuda:0`` is what the dispatcher sees of a CUDA batch.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch

from adaptcl.plugins import (
    AMCLLoss,
    ASCLLoss,
    DySTreSSLoss,
    InfoNCELoss,
    NCELoss,
    PairTemperature,
    TilePlan,
    execution,
    tiling,
)
from adaptcl.plugins.execution import TilingDebugWarning
from adaptcl.plugins.tiles import _budget as budget
from adaptcl.plugins.tiles import _dispatch as dispatch
from adaptcl.plugins.tiles import _fused as fused
from adaptcl.plugins.tiles._backend import Problem
from adaptcl.plugins.tiles._kernel_backend import KERNEL_FROM_LOGITS
from adaptcl.plugins.tiles._loop import LoopBackend
from adaptcl.plugins.tiles._terms import SameClassTargets, SimilarityTemperature

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _default_setting(monkeypatch):
    """Each test starts from the default setting and leaves it so; nothing said yet."""
    monkeypatch.setattr(execution, "_SETTING", execution.TilingSetting())
    monkeypatch.setattr(budget, "_SAID", set())
    monkeypatch.setattr(budget, "_SWITCHED", {})


def _problem(rows: int = 100, columns: int | None = None, *, device: str = "cpu",
             precision: str = "ieee", dtype: torch.dtype = torch.float32,
             **fields) -> Problem:
    base = {"method": "InfoNCE", "op": "row_stats", "device": torch.device(device),
            "dtype": dtype, "key_dtype": dtype, "precision": precision,
            "shapes": ((rows, columns or rows),), "width": 128, "form": "nt_xent", "masks": 2}
    return Problem(**{**base, **fields})


def _cuda(rows: int, precision: str = "bf16", **fields) -> Problem:
    return _problem(rows, device="cuda:0", precision=precision, **fields)


@pytest.fixture
def kernel_covers(monkeypatch):
    """The kernels' own answer on a CUDA problem, as if Triton were importable here."""
    monkeypatch.setattr(fused, "_HAS_TRITON", True)


@pytest.fixture
def cuda_budget(monkeypatch):
    """The CUDA budget, faked: ``state["bytes"]`` (the default: room for anything)."""
    state = {"bytes": 2**62, "reads": 0}

    def device_budget(device):
        state["reads"] += 1
        return state["bytes"] if device.type == "cuda" else None

    monkeypatch.setattr(budget, "device_budget", device_budget)
    return state


def plan(problem: Problem, tile_size="auto") -> TilePlan:
    return dispatch.plan(problem, tile_size)


# --------------------------------------------------------------------------------------------
# The plan on the CPU
# --------------------------------------------------------------------------------------------

def test_on_the_cpu_auto_materialises_none_materialises_and_an_int_is_the_loops_tile():
    p = _problem()
    assert plan(p) == TilePlan("materialise")
    assert plan(p, None) == TilePlan("materialise")
    assert plan(p, 48) == TilePlan("torch", 48)
    with tiling(max_logits_bytes=1), pytest.warns(budget.LogitsBudgetWarning):
        assert plan(p) == TilePlan("torch", budget.MIN_TILE, chosen=budget.MIN_TILE)
    with tiling(max_logits_bytes=1):  # None and an int are the loss's own choice
        assert plan(p, None) == TilePlan("materialise")
        assert plan(p, 48) == TilePlan("torch", 48)
        # a configuration without a tiled path materialises under "auto"
        assert plan(replace(p, tileable=False)) == TilePlan("materialise")


def test_the_plan_says_why_each_backend_did_not_run():
    p = _problem()
    assert dict(plan(p).declined) == {
        "triton": fused.why_not(p),
        "torch": "tile_size='auto' materialises: no budget is set on cpu"}
    assert fused.why_not(p) in ("Triton is not installed",
                                "the tensors are on the CPU and TRITON_INTERPRET=1 is not set")
    assert dict(plan(p, 16).declined) == {
        "triton": "tile_size=16 is the PyTorch loop's tile; it runs its own blocks "
                  "(tile_size='auto' takes it)"}
    assert str(plan(p, 16)) == ("torch, tile 16, ieee products; not triton: tile_size=16 is the "
                                "PyTorch loop's tile; it runs its own blocks (tile_size='auto' "
                                "takes it)")
    assert dict(plan(p, None).declined) == {
        "triton": "tile_size=None materialises the logits",
        "torch": "tile_size=None materialises the logits"}


# --------------------------------------------------------------------------------------------
# The plan on CUDA (problems on cuda:0: shapes, dtypes and device are all a plan reads)
# --------------------------------------------------------------------------------------------

def test_auto_takes_the_kernel_on_cuda_from_the_threshold_on_tensor_cores(cuda_budget,
                                                                         kernel_covers):
    side = 2**13  # 8,192 x 8,192 logits: KERNEL_FROM_LOGITS
    assert side * side == KERNEL_FROM_LOGITS
    for precision in ("bf16", "fp16", "tf32"):
        assert plan(_cuda(side, precision)) == TilePlan("triton", precision=precision)
    assert cuda_budget["reads"] == 0  # the kernel pays: the budget is not even read
    # one row short of the threshold: materialised while the logits fit
    short = _cuda(side - 1, shapes=((side - 1, side),))
    assert plan(short) == TilePlan("materialise", precision="bf16")
    # over the budget below the threshold: the tiled path, which is the kernel on tensor cores
    cuda_budget["bytes"] = 2**20
    with pytest.warns(budget.LogitsBudgetWarning):
        assert plan(_cuda(4096)) == TilePlan("triton", None, chosen=256, precision="bf16")


def test_an_int_tile_size_is_the_loops_tile_on_every_device_and_dtype(cuda_budget,
                                                                     kernel_covers):
    """Issue 53, item 3: on CUDA with bf16 inputs an int planned the kernel (its own blocks)
    whatever the int, and skipped ``"auto"``'s threshold; an int is the loop's tile now."""
    for device, precision in (("cpu", "ieee"), ("cuda:0", "bf16"), ("cuda:0", "tf32"),
                              ("cuda:0", "ieee")):
        for rows in (64, 2**14):
            p = _problem(rows, device=device, precision=precision)
            for tile in (64, 4096):
                assert plan(p, tile) == TilePlan("torch", tile, precision=precision)


def test_float32_on_cuda_follows_the_matmul_precision_and_ieee_stays_off_the_kernel(
        cuda_budget, kernel_covers):
    big = _cuda(2**14, "ieee")
    assert plan(big) == TilePlan("materialise")  # IEEE products: not on tensor cores
    assert "off the tensor cores" in dict(plan(big).declined)["triton"]
    cuda_budget["bytes"] = 2**20
    with pytest.warns(budget.LogitsBudgetWarning):
        assert plan(big).path == "torch"  # IEEE over the budget: the PyTorch loop
    assert plan(_cuda(2**14, "ieee", dtype=torch.float64)).path == "torch"


def test_a_case_the_kernel_does_not_cover_and_backend_torch_stay_off_it(cuda_budget,
                                                                       kernel_covers):
    big = _cuda(2**14, bias="HardnessBias")
    assert plan(big) == TilePlan("materialise", precision="bf16")
    assert dict(plan(big).declined)["triton"] == "it has no HardnessBias"
    assert plan(big, 512) == TilePlan("torch", 512, precision="bf16")
    with tiling(backend="torch"):
        assert plan(_cuda(2**14)) == TilePlan("materialise", precision="bf16")
        assert plan(_cuda(2**14), 512) == TilePlan("torch", 512, precision="bf16")


def test_triton_runs_every_call_on_the_kernel_or_refuses_it_in_one_line(kernel_covers):
    """Issue 53, item 3: ``tiling(backend="triton")`` with ``tile_size=None`` materialised
    without a word; every call it cannot run is refused now, naming why."""
    def refusal(p, tile_size="auto"):
        with pytest.raises(ValueError) as raised:
            plan(p, tile_size)
        assert "\n" not in str(raised.value)
        return str(raised.value)

    with tiling(backend="triton"):
        assert plan(_cuda(64, "ieee")) == TilePlan("triton")  # any size, any precision
        assert refusal(_cuda(64), None) == (
            "tiling(backend='triton') cannot run InfoNCE here: tile_size=None materialises the "
            "logits (pass tile_size='auto'); use backend='auto' or 'torch'")
        assert "tile_size=64 is a tile of the PyTorch loop, and it runs its own blocks" in (
            refusal(_cuda(64), 64))
        assert "cannot run InfoNCE here: it has no HardnessBias;" in (
            refusal(_cuda(64, bias="HardnessBias")))
        assert "this configuration has no tiled path" in refusal(_cuda(64, tileable=False))
        assert refusal(_cuda(64, method="NCE", op="row_blocks")) == (
            "tiling(backend='triton') cannot run NCE here: NCE has no kernel path; use "
            "backend='auto' or 'torch'")


# --------------------------------------------------------------------------------------------
# What each loss tells the dispatcher (the kernels' question, spied on)
# --------------------------------------------------------------------------------------------

@pytest.fixture
def asked(monkeypatch):
    """The kernels' question, spied: each problem it is asked about, refused as "spied"."""
    problems = []

    def why_not(problem):
        problems.append(problem)
        return "spied"

    monkeypatch.setattr(fused, "why_not", why_not)
    return problems


def _refused(loss_fn, *inputs, **pairs) -> str:
    with tiling(backend="triton"), pytest.raises(ValueError) as raised:
        loss_fn(*inputs, **pairs)
    return str(raised.value)


def test_each_loss_describes_its_call_as_one_problem(asked):
    g = torch.Generator().manual_seed(0)
    z0, z1 = torch.randn(12, 8, generator=g), torch.randn(12, 8, generator=g)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 3, 4])
    assert "cannot run InfoNCE here: spied" in _refused(InfoNCELoss(0.1), z0, z1)
    p = asked.pop()
    assert (p.op, p.form, p.masks, p.shapes, p.width, p.labels) == (
        "row_stats", "nt_xent", 2, ((24, 24),), 8, False)
    assert (p.weights, p.bias, p.term, p.pair) == (None, None, None, None)
    _refused(InfoNCELoss(0.1, form="cross_view"), z0, z1, labels=labels)
    p = asked.pop()
    assert p.labels and isinstance(p.weights, SameClassTargets) and p.form == "cross_view"
    _refused(InfoNCELoss(0.1, hardness_mode="all_negatives", hardness_strength=1.0,
                         form="cross_view_symmetric"), z0, z1)
    p = asked.pop()
    assert p.bias == "HardnessBias" and p.form == "cross_view_symmetric" and len(p.shapes) == 2
    _refused(DySTreSSLoss(0.1, 0.2), z0, z1)
    assert isinstance(asked.pop().term, SimilarityTemperature)
    _refused(AMCLLoss(PairTemperature(8)), torch.stack([z0, z1]), torch.stack([z1, z0]))
    p = asked.pop()
    assert (p.op, p.heads, type(p.pair).__name__) == ("pair_lse", 2, "RegularisedPairTerm")
    _refused(AMCLLoss(PairTemperature(8), negative_term="topk"), z0, z1)
    p = asked.pop()
    assert p.op == "top_columns" and "top-kappa" in p.pair
    _refused(ASCLLoss(0.1, 0.05, 1, form="cross_view"), z0, z1)
    assert "ASCL soft targets" in asked.pop().weights
    assert "spied" in _refused(NCELoss(), z0, z1)
    assert asked.pop().op == "row_blocks"
    assert asked == []


def test_the_kernels_answer_names_what_they_lack():
    assert fused.why_not(_problem(method="NCE", op="row_blocks")) == "NCE has no kernel path"
    topk = _problem(op="top_columns", pair="AMCL top-kappa term (negative_term='topk')")
    assert fused.why_not(topk) == "it has no AMCL top-kappa term (negative_term='topk')"


# --------------------------------------------------------------------------------------------
# A backend is one file and one line of registration
# --------------------------------------------------------------------------------------------

class ToyBackend:
    """A backend written for this test: the row statistics by materialising the tile-free
    logits with autograd (no tiles of its own), nothing else."""

    name = "toy"
    ops = frozenset({"row_stats"})
    own_blocks = True

    def __init__(self) -> None:
        self.calls = 0

    def why_not(self, problem):
        return None if problem.bias is None else "it has no bias"

    def auto_why_not(self, problem):
        return "it is a toy"

    def pays(self, problem):
        return False

    def row_stats(self, plan, a, k, masks, weights, bias, term):
        self.calls += 1
        s = a @ k.T
        logits = s if term is None else term.logits(s)
        rows = torch.arange(a.shape[0])
        sums = torch.zeros(a.shape[0]), torch.zeros(a.shape[0])
        if weights is not None:
            u = weights.tile(0, a.shape[0], k, masks, 0, k.shape[0])
            sums = (u * logits).sum(dim=1), u.sum(dim=1)
        for index in masks:
            if index is not None:
                logits = logits.index_put((rows, index), torch.tensor(float("-inf")))
        return torch.logsumexp(logits, dim=1), *sums

    def pair_lse(self, plan, a, k, pa, pk, masks, pair):
        raise AssertionError("the problem said pair_lse: the toy has no such op")


@pytest.fixture
def toy():
    backend = execution._register_backend(ToyBackend())  # the one line
    yield backend
    execution._unregister_backend("toy")


def test_a_toy_backend_registers_in_one_line_and_runs_what_it_has(toy):
    g = torch.Generator().manual_seed(1)
    z0, z1 = (torch.randn(10, 8, generator=g).requires_grad_() for _ in range(2))
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 3, 3, 2, 0])
    for make, pairs in ((lambda t: InfoNCELoss(0.1, tile_size=t), {}),
                        (lambda t: InfoNCELoss(0.1, tile_size=t), {"labels": labels}),
                        (lambda t: DySTreSSLoss(0.1, 0.2, tile_size=t), {}),
                        (lambda t: ASCLLoss(0.1, 0.05, 2, "hard", form="cross_view",
                                            tile_size=t), {})):
        want = make(None)(z0, z1, **pairs)
        want_grads = torch.autograd.grad(want, (z0, z1))
        loss_fn = make("auto")
        with tiling(backend="toy"):
            got = loss_fn(z0, z1, **pairs)
            assert loss_fn.last_stats.plan.path == "toy"
        torch.testing.assert_close(got, want)
        for a, b in zip(torch.autograd.grad(got, (z0, z1)), want_grads, strict=True):
            torch.testing.assert_close(a, b)
    assert toy.calls == 4
    assert plan(_problem()).path == "materialise"  # "auto" asks it and it declines
    assert dict(plan(_problem()).declined)["toy"] == "it is a toy"
    with tiling(backend="toy"), pytest.raises(ValueError, match="it has no pair_lse op"):
        AMCLLoss(PairTemperature(8))(z0, z1)
    with tiling(backend="toy"), pytest.raises(ValueError, match="it has no bias"):
        InfoNCELoss(0.1, hardness_mode="all_negatives", hardness_strength=1.0)(z0, z1)


class CountingLoop(LoopBackend):
    """The loop under another name, counting the gradient-free passes it is asked for."""

    name = "counting"

    def __init__(self) -> None:
        self.passes = []

    def softmax_stats(self, plan, *args, **kwargs):
        self.passes.append(("softmax_stats", plan.tile))
        return super().softmax_stats(plan, *args, **kwargs)

    def top_columns(self, plan, *args, **kwargs):
        self.passes.append(("top_columns", plan.tile))
        return super().top_columns(plan, *args, **kwargs)

    def pair_sum(self, plan, *args, **kwargs):
        self.passes.append(("pair_sum", plan.tile))
        return super().pair_sum(plan, *args, **kwargs)


def test_ascls_and_amcls_streamed_passes_go_through_the_dispatcher():
    counting = execution._register_backend(CountingLoop())
    try:
        g = torch.Generator().manual_seed(2)
        z0, z1 = torch.randn(10, 8, generator=g), torch.randn(10, 8, generator=g)
        with tiling(backend="counting"):
            ASCLLoss(0.1, 0.05, 2, "ahcl", form="cross_view", tile_size=4)(z0, z1)
            AMCLLoss(PairTemperature(8), negative_term="topk", kappa=2, tile_size=3)(z0, z1)
    finally:
        execution._unregister_backend("counting")
    assert counting.passes == [("softmax_stats", 4), ("top_columns", 3), ("pair_sum", 3)]


def test_a_pass_a_backend_lacks_runs_on_the_reference_loop_at_a_tile():
    """ASCL's ``"hard"`` mode on the kernels: its first pass is the loop's, at the budget's
    tile or the device's largest (the kernels' plan has no tile of its own)."""
    reference, kernel = dispatch._REFERENCE, TilePlan("triton")
    q = torch.randn(5, 8)
    assert dispatch._pass(kernel, "softmax_stats", q) == (
        reference, replace(kernel, tile=budget.MAX_TILE["cpu"]))
    with tiling(max_logits_bytes=2**20):
        assert dispatch._pass(kernel, "softmax_stats", q)[1].tile == 256
    assert dispatch._pass(replace(kernel, chosen=128), "top_columns", q)[1].tile == 128
    loop = TilePlan("torch", 7)
    assert dispatch._pass(loop, "pair_sum", q) == (reference, loop)


# --------------------------------------------------------------------------------------------
# What a call says about itself
# --------------------------------------------------------------------------------------------

def test_last_stats_says_which_path_ran_at_which_tile_and_precision():
    """Issue 53, item 3: nothing in ``last_stats`` said which path ran."""
    z0, z1 = torch.randn(12, 8), torch.randn(12, 8)
    loss_fn = InfoNCELoss(0.1, tile_size=5)
    loss_fn(z0, z1)
    plan_ = loss_fn.last_stats.plan
    assert (plan_.path, plan_.tile, plan_.precision) == ("torch", 5, "ieee")
    assert "triton" in dict(plan_.declined)
    loss_fn = InfoNCELoss(0.1)
    loss_fn(z0.bfloat16(), z1.bfloat16())
    assert (loss_fn.last_stats.plan.path, loss_fn.last_stats.plan.precision) == (
        "materialise", "bf16")
    assert set(loss_fn.last_stats) >= {"loss", "alignment"}  # the items stay numbers
    assert all(isinstance(v, torch.Tensor) for v in loss_fn.last_stats.values())


def test_debug_says_every_calls_plan():
    z0, z1 = torch.randn(12, 8), torch.randn(12, 8)
    with tiling(debug=True), warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        InfoNCELoss(0.1, tile_size=5)(z0, z1)
        InfoNCELoss(0.1)(z0, z1)
    lines = [str(w.message) for w in said if w.category is TilingDebugWarning]
    assert lines[0].startswith("InfoNCE: torch, tile 5, ieee products; not triton: ")
    assert lines[1].startswith("InfoNCE: materialised, ieee products; not triton: ")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        InfoNCELoss(0.1)(z0, z1)  # off by default: nothing said


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
    loss_fn = InfoNCELoss(0.1, reduction="none")
    compiled = torch.compile(loss_fn, backend="eager", fullgraph=True)
    assert torch.equal(compiled(z0, z1), materialised)
    assert loss_fn.last_stats.plan.path == "materialise"
    with tiling(max_logits_bytes=1), pytest.warns(budget.LogitsBudgetWarning):
        assert torch.equal(compiled(z0, z1), tiled)
        assert loss_fn.last_stats.plan == TilePlan("torch", budget.MIN_TILE,
                                                   chosen=budget.MIN_TILE)
    with tiling(backend="torch"):  # a field the plan reads: guarded too
        assert torch.equal(compiled(z0, z1), materialised)
    assert torch.equal(compiled(z0, z1), materialised)
    torch._dynamo.reset()
