"""The fused Triton kernel of the tiled losses (:mod:`adaptcl.plugins.tiles._fused`).

The kernel's values and gradients are tested under Triton's interpreter in
``interpreted_fused.py``, run here in a fresh process with ``TRITON_INTERPRET=1``: Triton
fixes interpreted or compiled when it is first imported (``import torch._dynamo`` imports it),
so the variable cannot be switched on inside this process, and setting it here would turn every
later Triton kernel of the process into an interpreted one. The tests below need no kernel (the
choice of backend, the refusals) or a GPU (``gpu``: the compiled kernel at a large batch).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from adaptcl.plugins import (
    AMCLLoss,
    DySTreSSLoss,
    InfoNCELoss,
    MACLLoss,
    NCELoss,
    PairTemperature,
    tiling,
)
from adaptcl.plugins.tiles import _dispatch as dispatch
from adaptcl.plugins.tiles import _fused as fused
from adaptcl.plugins.tiles._backend import Problem
from tests._interpreted import run_interpreted

HERE = Path(__file__).resolve().parent


def _pair(n: int = 13, d: int = 20, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)


@pytest.mark.slow
def test_kernels_under_the_interpreter_equal_the_float64_reference():
    pytest.importorskip("triton")
    run_interpreted(HERE / "interpreted_fused.py")


def test_triton_on_cpu_tensors_without_the_interpreter_refuses_in_one_line(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    z0, z1 = _pair()
    with pytest.raises(ValueError, match=r"tiling\(backend='triton'\) cannot run InfoNCE here: ") \
            as err, tiling(backend="triton"):
        InfoNCELoss(0.1)(z0, z1)
    assert "\n" not in str(err.value)
    expected = ("Triton is not installed" if not fused._HAS_TRITON else
                "the tensors are on the CPU and TRITON_INTERPRET=1 is not set")
    assert expected in str(err.value)


def test_the_interpreter_switched_on_after_triton_was_imported_is_refused(monkeypatch):
    pytest.importorskip("triton")  # imported here without the interpreter, as torch._dynamo does
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    z0, z1 = _pair()
    with pytest.raises(ValueError, match=r"TRITON_INTERPRET=1 was set after Triton was imported"), \
            tiling(backend="triton"):
        MACLLoss(0.1, 0.5)(z0, z1)


def test_auto_on_the_cpu_is_the_pytorch_loop_bit_for_bit():
    z0, z1 = _pair()
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 3, 3, 2, 0, 1, 4, 0])
    for make, pairs in ((lambda **t: MACLLoss(0.1, 0.5, **t), {}),
                        (lambda **t: DySTreSSLoss(0.1, 0.2, form="cross_view", **t),
                         {"labels": labels})):
        a, b = (x.clone().requires_grad_(True) for x in (z0, z1))
        auto = make(tile_size=8)(a, b, **pairs)
        c, d = (x.clone().requires_grad_(True) for x in (z0, z1))
        with tiling(backend="torch"):
            loop = make(tile_size=8)(c, d, **pairs)
        assert torch.equal(auto, loop)
        for got, ref in zip(torch.autograd.grad(auto, (a, b)), torch.autograd.grad(loop, (c, d)),
                            strict=True):
            assert torch.equal(got, ref)


def test_the_backend_is_validated_and_losses_without_a_kernel_refuse_triton_when_tiled():
    with pytest.raises(ValueError, match=r"^backend must be one of \('auto', 'triton', "):
        tiling(backend="cuda")
    z0, z1 = _pair()
    with tiling(backend="triton"):
        with pytest.raises(ValueError, match=r"here: survey loss has no kernel path"):
            NCELoss()(z0, z1)
        for tile_size, why in ((None, "tile_size=None materialises the logits"),
                               (8, "tile_size=8 is a tile of the PyTorch loop")):
            with pytest.raises(ValueError, match=why):  # nothing it asks is on the kernel
                InfoNCELoss(0.1, tile_size=tile_size)(z0, z1)


# --------------------------------------------------------------------------------------------
# Large shapes: the compiled kernel on a GPU
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["ieee", "bf16"])
@pytest.mark.parametrize("form", ["nt_xent", "cross_view"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_kernel_equals_the_pytorch_tiles_at_a_large_batch(form, dtype):
    """Both backends at the same product precision (float32 at "highest": IEEE; bf16 inputs:
    bf16 tensor cores in the kernel, cuBLAS bf16 with a float32 output in the loop)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    z0, z1 = (torch.randn(6000, 128, device="cuda", generator=g).to(dtype) for _ in range(2))
    labels = torch.randint(0, 50, (6000,), device="cuda", generator=g)
    bank = torch.randn(3000, 128, device="cuda", generator=g)
    net = PairTemperature(128).cuda()
    for make, args, pairs in (
            (lambda **t: MACLLoss(0.1, 0.5, form=form, **t), (), {}),
            (lambda **t: InfoNCELoss(0.1, form=form, **t), (bank,), {}),
            (lambda **t: DySTreSSLoss(0.1, 0.2, form=form, detach_temperature=False, **t), (),
             {"labels": labels}),
            (lambda **t: AMCLLoss(net, beta=1e-3, form=form, **t), (), {})):
        results = []
        for backend, tile_size in (("triton", "auto"), ("torch", 2048)):
            a, b = z0.clone().requires_grad_(True), z1.clone().requires_grad_(True)
            with tiling(backend=backend):
                loss = make(tile_size=tile_size)(a, b, *args, **pairs)
            results.append((loss, *torch.autograd.grad(loss, (a, b))))
        for got, ref in zip(*results, strict=True):
            tol = {"rtol": 1e-3, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2e-2,
                                                                               "atol": 1e-5}
            torch.testing.assert_close(got.float(), ref.float(), **tol)


def test_auto_takes_the_kernel_on_cuda_tensors_on_tensor_cores(monkeypatch):
    """Flipped by issue 47: ``"auto"`` takes the kernel on CUDA where it covers the case and
    the products run on tensor cores (bf16 here), never under ``backend="torch"``; an int
    ``tile_size`` is the loop's tile (issue 53)."""
    monkeypatch.setattr(fused, "_HAS_TRITON", True)
    bf16 = Problem(method="InfoNCE", op="row_stats", device=torch.device("cuda", 0),
                   dtype=torch.float32, key_dtype=torch.float32, precision="bf16",
                   shapes=((8192, 8192),), width=128, form="cross_view", masks=2)
    assert fused.why_not(bf16) is None
    assert dispatch.plan(bf16, "auto").path == "triton"
    assert dispatch.plan(bf16, 1024).path == "torch"
    with tiling(backend="torch", max_logits_bytes=2**40):  # a budget: CUDA is not asked
        assert dispatch.plan(bf16, "auto").path == "materialise"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_kernel_compiles_in_one_graph():
    """One graph, and once compiled (and its kernels built), a step that never synchronises:
    no autotuning, no host read (torch.cuda.set_sync_debug_mode("error") refuses both)."""
    z0, z1 = (torch.randn(4096, 128, device="cuda").bfloat16().requires_grad_(True)
              for _ in range(2))
    loss_fn = MACLLoss(0.1, 0.5, check_finite=False)
    with tiling(backend="triton"):
        compiled = torch.compile(loss_fn, fullgraph=True)
        expected = loss_fn(z0, z1)
        torch.testing.assert_close(compiled(z0, z1), expected, rtol=1e-4, atol=1e-6)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            compiled(z0, z1).backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")


def test_the_labelled_row_problem_is_sorted_by_label_with_its_masks_renumbered():
    """``_row_inputs`` sorts anchors and keys by label (the kernels then skip the blocks whose
    labels cannot meet): every anchor keeps its features, its label's rank and its excluded
    columns (the same keys, renumbered); ``-1`` (no column) stays; rows come back in place."""
    g = torch.Generator().manual_seed(5)
    a, k = torch.randn(9, 3, generator=g), torch.randn(11, 3, generator=g)
    labels = torch.tensor([7, 2, 9, 2, 7, 100, 9, 2, 7])
    key_labels = torch.tensor([-1, 9, 2, 7, 100, 2, -1, 7, 9, 2, 3])
    positive = torch.tensor([3, 2, 1, 5, 7, 4, 8, 9, -1])
    inputs = fused._row_inputs(a, k, positive, None, labels, key_labels, "ieee")
    order, key_order = inputs.anchor_order, inputs.key_order
    assert torch.equal(inputs.a, a[order]) and torch.equal(inputs.k, k[key_order])
    assert torch.all(inputs.labels[1:] >= inputs.labels[:-1])
    assert torch.all(inputs.key_labels[1:] >= inputs.key_labels[:-1])
    same = labels[:, None] == key_labels[None, :]
    assert torch.equal(inputs.labels[:, None] == inputs.key_labels[None, :],
                       same[order][:, key_order])
    kept = inputs.positive_index >= 0
    assert torch.equal(key_order[inputs.positive_index[kept]], positive[order][kept])
    assert torch.equal(inputs.positive_index[~kept], positive[order][~kept])
    assert inputs.self_index is None
    assert torch.equal(inputs.to_anchors(inputs.of_anchors(labels)), labels)
    assert torch.equal(inputs.to_keys(key_labels[key_order]), key_labels)


def test_the_labelled_row_problem_is_formed_without_reading_a_value_back():
    """The labels' dense ranks come from a sort and a running count, not ``torch.unique``
    (which reads its number of values back to the host: a synchronisation on CUDA, a graph
    break under ``torch.compile``). On the meta device, where no value exists, the sorted
    problem still forms; ``unique`` cannot."""
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        x = torch.randint(-2, 6, (int(torch.randint(1, 30, (), generator=g)),), generator=g)
        assert torch.equal(fused._dense_ranks(x), torch.unique(x, return_inverse=True)[1])
    a, k = torch.empty(9, 16, device="meta"), torch.empty(11, 16, device="meta")
    labels = torch.empty(9, dtype=torch.int64, device="meta")
    key_labels = torch.empty(11, dtype=torch.int64, device="meta")
    positive = torch.empty(9, dtype=torch.int64, device="meta")
    inputs = fused._row_inputs(a, k, positive, None, labels, key_labels, "bf16")
    assert inputs.a.shape == (9, 16) and inputs.key_labels.shape == (11,)


def test_the_one_pass_backward_where_it_is_not_laid_out_says_the_split_one_runs(monkeypatch):
    """``tiling(backward="onepass")`` is not ignored in silence: at TF32 products or beyond
    128 bf16 features (where its accumulators spill, ``_configs.ONE_PASS_WIDEST``) the split
    backward runs and a warning says so, once per precision and width."""
    monkeypatch.setattr(fused, "_SPLIT_SAID", set())
    assert fused._one_pass_laid_out("bf16", "sm_90", 128)
    assert fused._one_pass_laid_out("ieee", "sm_90", 64)
    for precision, dim in (("tf32", 128), ("bf16", 256)):
        with pytest.warns(UserWarning, match=f"split backward runs at {precision} products "
                                             f"and {dim} features"):
            assert not fused._one_pass_laid_out(precision, "sm_90", dim)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not fused._one_pass_laid_out("tf32", "sm_90", 128)  # said once
