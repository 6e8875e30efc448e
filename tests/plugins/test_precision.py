"""The precision policy of the products (:mod:`adaptcl.plugins._products`).

bf16/fp16 inputs multiply in that dtype, float32 inputs on CUDA follow
``torch.get_float32_matmul_precision()`` ("highest" IEEE, "high" TF32, "medium" bf16), float32
on the CPU is IEEE whatever it says (as PyTorch's own CPU matmul) unless
``tiling(emulate_tensor_cores=True)``, float64 is exact; accumulation, log-sum-exp and gradients
stay float32. Under the switch the CPU emulates the tensor cores (operands rounded, products
exact in float32, float32 accumulation); the checks here pin the rounding itself, the one
product function every path uses, and that the losses follow the policy on both the
materialised path and the PyTorch tile loop. The kernel's side is
``interpreted_fused.py`` (under Triton's interpreter) and the accuracy table's test,
``test_accuracy.py``.
"""

from __future__ import annotations

import pytest
import torch

from adaptcl.plugins import InfoNCELoss, MACLLoss, tiling
from adaptcl.plugins import _products as P

from ._helpers import LOSSES

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.fixture
def float32_setting():
    """Set ``torch.set_float32_matmul_precision`` inside a test, restored after it."""
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


@pytest.fixture
def matmul_precision(float32_setting):
    """:func:`float32_setting` with the CPU emulating the tensor cores, so that float32 inputs
    here follow it as they do on CUDA."""
    with tiling(emulate_tensor_cores=True):
        yield float32_setting


def test_the_policy_follows_the_input_dtype_and_on_cuda_pytorchs_float32_setting(
        float32_setting):
    for device in (CPU, CUDA):
        assert P.product_precision(torch.bfloat16, device) == "bf16"
        assert P.product_precision(torch.float16, device) == "fp16"
        assert P.product_precision(torch.float64, device) == "ieee"
    for setting, expected in (("highest", "ieee"), ("high", "tf32"), ("medium", "bf16")):
        float32_setting(setting)
        assert P.product_precision(torch.float32, CUDA) == expected
        assert P.product_precision(torch.float32, CPU) == "ieee"  # as PyTorch's CPU matmul
        with tiling(emulate_tensor_cores=True):
            assert P.product_precision(torch.float32, CPU) == expected
            assert P.product_precision(torch.float64, CPU) == "ieee"  # float64 is exact
    assert [P.on_tensor_cores(p) for p in P.PRECISIONS] == [False, True, True, True]


@pytest.mark.parametrize("setting", ["high", "medium"])
def test_on_the_cpu_float32_losses_are_ieee_whatever_the_matmul_precision(setting,
                                                                          float32_setting):
    """Issue 53, item 2: ``torch.set_float32_matmul_precision("high")`` (Lightning's advice on
    every tensor-core GPU) moved CPU losses, where PyTorch's own CPU matmul is bit-identical.
    Every loss of the table, materialised and tiled: value and gradients bit for bit those at
    "highest"."""
    for name, case in LOSSES.items():
        for tile in ((None, 3) if case.tileable else (None,)):
            options = {"tile_size": tile} if case.tileable else {}
            inputs = case.inputs(n=7, seed=3)
            results = []
            for current in ("highest", setting):
                float32_setting(current)
                fn = case.build(**options)
                value = fn(*inputs)
                params = [p for p in fn.parameters() if p.requires_grad]
                results.append([value, *torch.autograd.grad(value, [*inputs, *params],
                                                            allow_unused=True)])
            for a, b in zip(*results, strict=True):
                assert (a is None and b is None) or torch.equal(a, b), (name, tile)


def test_tf32_rounding_keeps_ten_mantissa_bits_to_nearest_ties_away_from_zero():
    one = 1.0
    ulp = 2.0**-10  # TF32's ulp at 1
    x = torch.tensor([one + ulp / 2, one + ulp / 2 - 2.0**-23, one + 3 * ulp / 2, -(one + ulp / 2),
                      0.0, 2.0**-130, float("inf")])
    got = P.rounded(x, "tf32")
    want = torch.tensor([one + ulp, one, one + 2 * ulp, -(one + ulp), 0.0, 2.0**-130,
                         float("inf")])
    assert torch.equal(got, want)
    g = torch.Generator().manual_seed(0)
    y = torch.randn(1000, generator=g)
    r = P.rounded(y, "tf32")
    assert torch.all((r.view(torch.int32) & 0x1FFF) == 0)  # the 13 dropped bits are zero
    assert torch.all((r - y).abs() <= y.abs() * 2.0**-11)  # within half a TF32 ulp


@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_half_rounding_is_a_cast_to_nearest(precision, dtype):
    y = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    assert torch.equal(P.rounded(y, precision), y.to(dtype).float())
    assert P.rounded(y, "ieee") is y


def _reference(x, y, precision):
    """Float64 product of the operands rounded as ``precision`` rounds them."""
    return P.rounded(x, precision).double() @ P.rounded(y, precision).double()


@pytest.mark.parametrize("precision", P.PRECISIONS)
def test_product_is_the_rounded_operands_accumulated_in_float32(precision):
    g = torch.Generator().manual_seed(2)
    a, k = torch.randn(33, 64, generator=g), torch.randn(17, 64, generator=g)
    got = P.product(a, k.T, precision)
    assert got.dtype == torch.float32
    exact = _reference(a, k.T, precision)
    # float32 accumulation of 64 exact products: a few float32 ulps of the sum of |terms|
    bound = 64 * 2.0**-24 * (P.rounded(a, precision).abs().double()
                             @ P.rounded(k, precision).abs().double().T)
    assert torch.all((got.double() - exact).abs() <= bound)
    if precision == "ieee":
        assert torch.equal(got, a @ k.T)
        assert torch.equal(P.logits_product(a, k, precision), a @ k.T)
    else:  # the rounding is visible: far above float32's error, within the precision's
        drift = (got.double() - (a.double() @ k.double().T)).abs().max()
        assert drift > 1e-4
        assert drift < {"tf32": 2e-2, "bf16": 2e-1, "fp16": 2e-2}[precision]
    out = torch.ones(33, 17)
    assert P.product(a, k.T, precision, out=out) is out
    torch.testing.assert_close(out, 1 + got, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("precision", P.PRECISIONS)
def test_logits_product_backward_multiplies_at_the_same_precision(precision):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(9, 24, generator=g).requires_grad_(True)
    k = torch.randn(11, 24, generator=g).requires_grad_(True)
    up = torch.randn(9, 11, generator=g)
    out = P.logits_product(a, k, precision)
    ga, gk = torch.autograd.grad(out, (a, k), up)
    if precision == "ieee":
        ra, rk = torch.autograd.grad(a @ k.T, (a, k), up)
        assert torch.equal(ga, ra) and torch.equal(gk, rk)
        return
    torch.testing.assert_close(ga, P.product(up, k.detach(), precision), rtol=0, atol=0)
    torch.testing.assert_close(gk, P.product(up.T, a.detach(), precision), rtol=0, atol=0)


def test_bf16_inputs_multiply_in_bf16_as_float32_inputs_do_at_medium(matmul_precision):
    """One policy: a bf16 batch's loss equals, bit for bit, the loss of the same values in
    float32 under ``"medium"`` (bf16 products), on the materialised path and the tile loop."""
    g = torch.Generator().manual_seed(4)
    z0, z1 = (torch.randn(20, 32, generator=g).bfloat16() for _ in range(2))
    for tile in (None, 7):
        half = MACLLoss(0.1, 0.5, tile_size=tile)(z0, z1)
        matmul_precision("medium")
        medium = MACLLoss(0.1, 0.5, tile_size=tile)(z0.float(), z1.float())
        matmul_precision("highest")
        highest = MACLLoss(0.1, 0.5, tile_size=tile)(z0.float(), z1.float())
        assert torch.equal(half, medium)
        assert half != highest  # the products are rounded
        torch.testing.assert_close(half, highest, rtol=1e-2, atol=0)


@pytest.mark.parametrize("setting,precision", [("high", "tf32"), ("medium", "bf16")])
@pytest.mark.parametrize("name", ["infonce", "dystress_exact", "macl_cross_view", "ascl_queue",
                                  "amcl_softmax", "amcl_topk", "infonce_hardness"])
def test_the_tile_loop_agrees_with_the_materialised_path_at_each_precision(
        name, setting, precision, matmul_precision):
    """Both paths form every product through the one function at the same precision, so they
    agree to float32 accumulation, not to the precision's (much larger) error."""
    matmul_precision(setting)
    case = LOSSES[name]
    inputs = case.inputs(n=10, seed=5, dim=8)
    results = []
    for tile in (None, 3):
        fn = case.build(tile_size=tile, dim=8)
        value = fn(*inputs)
        results.append((value, *torch.autograd.grad(value, inputs)))
    for tiled, materialised in zip(*results[::-1], strict=True):
        torch.testing.assert_close(tiled, materialised, rtol=2e-5, atol=2e-5)


def test_the_default_float32_path_is_the_plain_product(matmul_precision):
    """At PyTorch's default ("highest") a float32 loss is what it was before the policy, the
    emulation switched on or not:
    :func:`logits_product` returns ``a @ k.T`` itself (bit for bit; tools/bit_identity.py
    checks every loss against the commit before the policy)."""
    matmul_precision("highest")
    z0, z1 = (torch.randn(12, 16, generator=torch.Generator().manual_seed(6)) for _ in range(2))
    assert InfoNCELoss(0.1)(z0, z1) == InfoNCELoss(0.1)(z0, z1)
    a, k = torch.nn.functional.normalize(z0, dim=1), torch.nn.functional.normalize(z1, dim=1)
    assert torch.equal(P.logits_product(a, k, "ieee"), a @ k.T)


@pytest.mark.parametrize("tile", [None, 5])
def test_a_loss_at_a_rounded_precision_traces_in_one_graph(tile, matmul_precision):
    """The float32 setting is read once while tracing (no graph break on its string), and the
    rounded product is an autograd function dynamo traces."""
    import torch._dynamo as dynamo

    matmul_precision("medium")
    z0, z1 = (torch.randn(12, 16, generator=torch.Generator().manual_seed(7)) for _ in range(2))
    explanation = dynamo.explain(MACLLoss(0.1, 0.5, tile_size=tile))(z0, z1)
    assert [r.reason.splitlines()[0] for r in explanation.break_reasons] == []
    assert explanation.graph_count == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["bf16", "fp16", "tf32"])
def test_on_cuda_the_products_are_the_tensor_cores_with_a_float32_output(precision,
                                                                         matmul_precision):
    """cuBLAS at the precision (bf16/fp16 operands with a float32 output; TF32 where the float32
    setting allows it) equals the CPU's emulation to float32 accumulation (TF32: within three
    times the emulation's error, a kernel may truncate where it rounds), and is not the product
    rounded to the operands' dtype (0.06 off on a logit of 20 in bf16)."""
    matmul_precision("high" if precision == "tf32" else "highest")
    g = torch.Generator().manual_seed(8)
    a, k = torch.randn(256, 128, generator=g), torch.randn(300, 128, generator=g)
    got = P.logits_product(a.cuda(), k.cuda(), precision).cpu()
    emulated = P.logits_product(a, k, precision)
    assert got.dtype == torch.float32
    if precision == "tf32":
        exact = a.double() @ k.double().T
        assert (got - exact).abs().max() <= 3 * (emulated - exact).abs().max()
        ieee = (exact.float().double() - exact).abs().max()  # float32's own rounding
        assert (got - exact).abs().max() > 10 * ieee  # the operands were rounded
    else:
        torch.testing.assert_close(got, emulated, rtol=1e-5, atol=2e-5 * emulated.abs().max())
        dtype = P.OPERAND_DTYPES[precision]
        rounded_output = (a.to(dtype) @ k.to(dtype).T).float()
        assert (got - rounded_output).abs().max() > 10 * (got - emulated).abs().max()
