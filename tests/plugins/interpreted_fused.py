"""The fused Triton kernel of the tiled losses (``tiling(backend="triton")``) under Triton's
interpreter, against the float64 materialised losses.

Not collected by a plain ``pytest`` run (the name has no ``test_`` prefix): Triton fixes
whether its kernels, its own library included, are compiled or interpreted when it is first
imported, and ``import torch._dynamo`` imports it, so the interpreter cannot be switched on
inside a pytest process that has run other tests. ``tests/plugins/test_fused.py`` runs this
file in a fresh process with ``TRITON_INTERPRET=1``; run it by hand the same way::

    TRITON_INTERPRET=1 PYTHONPATH=src python -m pytest tests/plugins/interpreted_fused.py

Every kernel test replaces the PyTorch tile loop with a failure, so a silent fallback cannot
pass.

The interpreter runs each program in NumPy: shapes are tiny and not multiples of the
interpreter's 16-wide blocks (13 pairs, dimension 20: two feature chunks, a partial column
block). Values and gradients agree with the float64 reference to float32 accuracy; bfloat16
inputs to bfloat16 accuracy. Large shapes are the ``gpu`` tests at the end.
"""

from __future__ import annotations

import math

import pytest
import torch

from adaptcl.plugins import (
    AMCLLoss,
    ASCLLoss,
    ConstantTemperature,
    DCLLoss,
    DualTemperatureLoss,
    DySTreSSLoss,
    FlatNCELoss,
    InfoNCELoss,
    LearnableTemperatureLoss,
    MACLLoss,
    PairTemperature,
    TemperatureScheduleLoss,
    TilePlan,
    tiling,
)
from adaptcl.plugins.tiles import _fused as fused
from adaptcl.plugins.tiles import _loop as tiled_module
from adaptcl.plugins.tiles._dispatch import row_stats

pytest.importorskip("triton")
if not fused.interpreting():
    pytest.skip("run with TRITON_INTERPRET=1 (tests/plugins/test_fused.py does)",
                allow_module_level=True)

from adaptcl.plugins.tiles import _triton_rowstats as K  # noqa: E402 - Triton, interpreted

N, D, BANK = 13, 20, 7
RTOL, ATOL = 2e-4, 2e-5
#: the dispatcher's plan of a call on the kernel
KERNEL = TilePlan("triton")


@pytest.fixture(autouse=True)
def on_the_kernel():
    """Every tiled call of these tests on the kernel (or refused)."""
    with tiling(backend="triton"):
        yield


@pytest.fixture
def no_torch_tiles(monkeypatch):
    """The PyTorch tile loop fails if called: the kernel must have computed the result."""
    def fail(*args):
        raise AssertionError("the PyTorch tile loop ran instead of the kernel")
    monkeypatch.setattr(tiled_module._StreamedRowStats, "apply", fail)


def _inputs(seed: int = 0, bank: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = [torch.randn(N, D, generator=g, dtype=torch.float64) for _ in range(2)]
    if bank:
        z.append(torch.randn(bank, D, generator=g, dtype=torch.float64))
    return z


def _run(loss_fn, inputs, dtype, **pairs):
    leaves = [x.to(dtype).requires_grad_(True) for x in inputs]
    loss = loss_fn(*leaves, **pairs)
    params = [p for p in loss_fn.parameters() if p.requires_grad]
    return loss.detach(), torch.autograd.grad(loss, leaves + params)


def _check(make, *, bank: int = 0, seed: int = 0, **pairs):
    """``make(**tile options)``'s value and gradients (inputs and parameters) on the kernel in
    float32 against the materialised loss in float64."""
    inputs = _inputs(seed, bank)
    with tiling(backend="auto"):
        reference = make(tile_size=None).double()
        value, grads = _run(reference, inputs, torch.float64, **pairs)
    kernel = make(tile_size="auto")
    got, got_grads = _run(kernel, inputs, torch.float32, **pairs)
    torch.testing.assert_close(got.double(), value, rtol=RTOL, atol=ATOL)
    for a, b in zip(got_grads, grads, strict=True):
        assert b.abs().sum() > 0
        torch.testing.assert_close(a.double(), b, rtol=RTOL, atol=ATOL)


CASES = {
    "infonce_nt_xent": (lambda **t: InfoNCELoss(0.1, **t), 0),
    "infonce_cross_view_bank": (lambda **t: InfoNCELoss(0.2, form="cross_view", **t), BANK),
    "infonce_symmetric": (lambda **t: InfoNCELoss(0.1, form="cross_view_symmetric", **t), 0),
    "infonce_queue": (lambda **t: InfoNCELoss(0.1, form="queue", **t), 19),
    "dcl_nt_xent": (lambda **t: DCLLoss(0.1, **t), 0),
    "flat_nce": (lambda **t: FlatNCELoss(0.1, form="cross_view", **t), 0),
    "dual_temperature": (lambda **t: DualTemperatureLoss(0.1, 1.0, **t), 0),
    "ascl_hard_queue": (lambda **t: ASCLLoss(0.1, 0.05, 2, mode="hard", **t), 19),
    "macl_nt_xent": (lambda **t: MACLLoss(0.1, 0.5, **t), 0),
    "macl_cross_view_bank": (lambda **t: MACLLoss(0.2, 0.5, form="cross_view", **t), BANK),
    "schedule": (lambda **t: TemperatureScheduleLoss(0.1, 1.0, 40, step=7, **t), 0),
    "learned_temperature": (lambda **t: LearnableTemperatureLoss(0.07, **t), 0),
    "dystress_cosine": (lambda **t: DySTreSSLoss(0.1, 0.2, **t), 0),
    "dystress_piecewise_attached": (
        lambda **t: DySTreSSLoss(0.1, 0.2, shape="piecewise", threshold=0.1, width=0.7,
                                 detach_temperature=False, form="cross_view", **t), BANK),
}


def _two_rank_gather(x):
    """A gradient-carrying gather over two ranks in one process: this rank's rows (with their
    graph) and another rank's (built from them, so they carry gradient too)."""
    return [x, x.flip(0) * 0.5 + 0.25]


CASES["macl_gathered_nt_xent"] = (lambda **t: MACLLoss(0.1, 0.5, gather_fn=_two_rank_gather,
                                                       **t), 0)


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_equals_the_float64_materialised_loss(name, no_torch_tiles):
    make, bank = CASES[name]
    _check(make, bank=bank)


def _pair_net() -> PairTemperature:
    """The same AMCL temperature network at every call (the reference and the kernel share it)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return PairTemperature(D, eta=0.05, iota=2.0)


AMCL = {
    "amcl_pair_temperature_nt_xent": (lambda **t: AMCLLoss(_pair_net(), beta=1e-2, **t), 0),
    "amcl_constant_infonce_bank": (
        lambda **t: AMCLLoss(ConstantTemperature(0.2), beta=1e-2, objective="infonce",
                             form="cross_view", **t), BANK),
}


@pytest.mark.parametrize("name", list(AMCL))
def test_kernel_amcl_pair_log_sum_exp(name, monkeypatch):
    def fail(*args):
        raise AssertionError("the PyTorch pair loop ran instead of the kernel")
    monkeypatch.setattr(tiled_module._StreamedPairLSE, "apply", fail)
    make, bank = AMCL[name]
    _check(make, bank=bank)


@pytest.mark.parametrize("dim", [12, 20])
@pytest.mark.parametrize("net", ["pair", "constant"])
def test_kernel_amcl_backward_in_one_program_or_per_output_block(dim, net, monkeypatch):
    """The pair backward's two layouts (``_configs.pair_outputs``): 12 features (and network
    features) fit the interpreter's 16-column output block, so one program keeps both sides'
    accumulators; 20 take two blocks per side, one program each (``SQUASH=0``: the cosine
    side's two blocks). Every gradient against the float64 materialised loss."""
    from adaptcl.plugins.tiles import _configs
    from adaptcl.plugins.tiles._triton_pairlse import backward_parts

    monkeypatch.setattr(tiled_module._StreamedPairLSE, "apply", None)  # the loop must not run
    parts = []
    real = _configs.pair_outputs

    def pair_outputs(precision, arch, width, pair_width, squash):
        blocks = real(precision, arch, width, pair_width, squash)
        parts.append(backward_parts(int(squash), _configs.padded(width),
                                    _configs.padded(pair_width), *blocks))
        return blocks

    monkeypatch.setattr(_configs, "pair_outputs", pair_outputs)
    g = torch.Generator().manual_seed(14)
    z = [torch.randn(29, dim, generator=g, dtype=torch.float64) for _ in range(2)]

    def make(**t):
        with torch.random.fork_rng():
            torch.manual_seed(0)
            tau = PairTemperature(dim, eta=0.05, iota=2.0) if net == "pair" else (
                ConstantTemperature(0.2))
        return AMCLLoss(tau, beta=1e-2, **t)

    with tiling(backend="auto"):
        value, grads = _run(make(tile_size=None).double(), z, torch.float64)
    got, got_grads = _run(make(tile_size="auto"), z, torch.float32)
    assert set(parts) == {{12: 1, 20: 4 if net == "pair" else 2}[dim]}
    torch.testing.assert_close(got.double(), value, rtol=RTOL, atol=ATOL)
    for a, b in zip(got_grads, grads, strict=True):
        assert b.abs().sum() > 0
        torch.testing.assert_close(a.double(), b, rtol=RTOL, atol=ATOL)


LABELLED = {
    "infonce": lambda **t: InfoNCELoss(0.1, **t),
    "macl": lambda **t: MACLLoss(0.1, 0.5, reweight=False, form="cross_view", **t),
    "dystress": lambda **t: DySTreSSLoss(0.1, 0.2, detach_temperature=False, **t),
}


@pytest.mark.parametrize("name", list(LABELLED))
def test_kernel_multi_positive_labels_with_classless_bank_keys(name, no_torch_tiles):
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 3, 3, 2, 0, 1, 4, 0])
    negative_labels = torch.tensor([-1, 0, 2, -1, 1, -1, 0])
    _check(LABELLED[name], bank=BANK, labels=labels, negative_labels=negative_labels)


def _row_stats_reference(a, k, masks, g):
    """Float64 materialised ``lse`` of the masked ``a @ k.T`` and its gradients for ``g``."""
    a64, k64 = (x.double().requires_grad_(True) for x in (a, k))
    logits = a64 @ k64.T
    rows = torch.arange(a.shape[0])
    for idx in masks:
        logits = logits.index_put((rows, idx), torch.tensor(float("-inf"), dtype=torch.float64))
    lse = torch.logsumexp(logits, dim=1)
    return (lse.detach(), *torch.autograd.grad((lse * g.double()).sum(), (a64, k64)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_takes_half_precision_inputs(dtype, no_torch_tiles):
    g = torch.Generator().manual_seed(3)
    a = (torch.randn(21, D, generator=g) / 2).to(dtype).requires_grad_(True)
    k = (torch.randn(35, D, generator=g) / 2).to(dtype).requires_grad_(True)
    masks = (torch.randint(0, 35, (21,), generator=g), torch.randint(0, 35, (21,), generator=g))
    up = torch.randn(21, generator=g)
    lse = row_stats(KERNEL, a, k, masks)[0]
    ga, gk = torch.autograd.grad((lse * up).sum(), (a, k))
    assert lse.dtype == torch.float32 and ga.dtype == dtype and gk.dtype == dtype
    ref, ref_a, ref_k = _row_stats_reference(a.detach(), k.detach(), masks, up)
    torch.testing.assert_close(lse.double(), ref, rtol=1e-5, atol=1e-5)  # float32 accumulation
    for got, expected in ((ga, ref_a), (gk, ref_k)):  # the tile's weights round to ``dtype``
        torch.testing.assert_close(got.double(), expected, rtol=0, atol=2e-2 * expected.abs().max())


def test_a_fully_masked_row_gives_minus_infinity_and_no_gradient(no_torch_tiles):
    g = torch.Generator().manual_seed(4)
    a = torch.randn(18, D, generator=g).requires_grad_(True)
    k = torch.randn(2, D, generator=g).requires_grad_(True)
    # row 5 excludes both columns; every other row keeps at least one
    positive, own = torch.zeros(18, dtype=torch.long), torch.zeros(18, dtype=torch.long)
    own[5] = 1
    lse = row_stats(KERNEL, a, k, (positive, own))[0]
    assert lse[5] == float("-inf")
    finite = torch.ones(18, dtype=torch.bool)
    finite[5] = False
    ga, gk = torch.autograd.grad(lse[finite].sum(), (a, k))
    ref, ref_a, ref_k = _row_stats_reference(a.detach()[finite], k.detach(),
                                             (positive[finite], own[finite]), torch.ones(17))
    torch.testing.assert_close(lse[finite].double(), ref, rtol=RTOL, atol=ATOL)
    assert torch.all(ga[5] == 0)
    torch.testing.assert_close(ga[finite].double(), ref_a, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(gk.double(), ref_k, rtol=RTOL, atol=ATOL)


def test_triton_refuses_in_one_line_what_the_kernel_does_not_cover():
    z0, z1 = _inputs()
    hard = InfoNCELoss(0.1, hardness_mode="all_negatives", hardness_strength=1.0)
    with pytest.raises(ValueError,
                       match=r"tiling\(backend='triton'\) cannot run InfoNCE here: .*HardnessBias"):
        hard(z0.float(), z1.float())
    with pytest.raises(ValueError, match=r"cannot run InfoNCE here: the dtypes are torch.float64"):
        InfoNCELoss(0.1)(z0, z1)
    with pytest.raises(ValueError, match=r"cannot run AMCL here: it has no AMCL top-kappa term"):
        AMCLLoss(_pair_net(), negative_term="topk")(z0.float(), z1.float())


def test_compiled_loss_on_the_kernel_is_one_graph(no_torch_tiles):
    torch._dynamo.reset()
    loss_fn = InfoNCELoss(0.1, form="cross_view")
    compiled = torch.compile(loss_fn, backend="aot_eager", fullgraph=True, dynamic=False)
    z0, z1 = (x.float().requires_grad_(True) for x in _inputs(seed=5))
    value = compiled(z0, z1)
    grads = torch.autograd.grad(value, (z0, z1))
    expected = loss_fn(z0, z1)
    torch.testing.assert_close(value, expected)
    for got, ref in zip(grads, torch.autograd.grad(expected, (z0, z1)), strict=True):
        torch.testing.assert_close(got, ref)
    torch._dynamo.reset()


# --------------------------------------------------------------------------------------------
# The products' precision, and the kernels' block paths
# --------------------------------------------------------------------------------------------

#: each product precision: PyTorch's float32 setting and the inputs' dtype that select it
PRECISIONS = {"ieee": ("highest", torch.float32), "tf32": ("high", torch.float32),
              "bf16": ("medium", torch.float32), "fp16": ("highest", torch.float16)}
AT_PRECISION = {
    "infonce_nt_xent": lambda **t: InfoNCELoss(0.1, **t),
    "macl_cross_view": lambda **t: MACLLoss(0.1, 0.5, form="cross_view", **t),
    "dystress_attached": lambda **t: DySTreSSLoss(0.1, 0.2, detach_temperature=False, **t),
    "dystress_piecewise": lambda **t: DySTreSSLoss(0.1, 0.2, shape="piecewise", threshold=-0.3,
                                                   width=0.4, form="cross_view", **t),
    "amcl": lambda **t: AMCLLoss(_pair_net(), beta=1e-2, **t),
}


@pytest.fixture
def matmul_precision():
    """The float32 setting, followed on the CPU as on CUDA (``emulate_tensor_cores``)."""
    before = torch.get_float32_matmul_precision()
    with tiling(emulate_tensor_cores=True):
        yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


#: every precision for a plain and a pair term; one or two for the others (the interpreter is slow)
PRECISION_CASES = [(name, precision) for name in ("infonce_nt_xent", "amcl")
                   for precision in PRECISIONS] + [
    ("dystress_attached", "bf16"), ("dystress_attached", "tf32"), ("dystress_piecewise", "fp16"),
    ("macl_cross_view", "bf16")]


@pytest.mark.parametrize("name,precision", PRECISION_CASES)
def test_kernel_equals_the_tile_loop_at_each_precision(name, precision, matmul_precision):
    """The kernel rounds its operands (and the backward's tile weights) as the PyTorch loop's
    emulation does, so the two agree to float32 accumulation at every precision, far inside
    the precision's own error; 37 pairs span three column blocks, so masked and unmasked
    blocks both occur. fp16 inputs' gradients are fp16 (one rounding of a float32 gradient)."""
    setting, dtype = PRECISIONS[precision]
    matmul_precision(setting)
    g = torch.Generator().manual_seed(11)
    inputs = [torch.randn(37, D, generator=g) for _ in range(2)]
    labels = torch.randint(0, 5, (37,), generator=g) if name == "dystress_attached" else None
    pairs = {} if labels is None else {"labels": labels}
    got = _run(AT_PRECISION[name](tile_size="auto"), inputs, dtype, **pairs)
    with tiling(backend="torch"):
        want = _run(AT_PRECISION[name](tile_size=8), inputs, dtype, **pairs)
    torch.testing.assert_close(got[0], want[0], rtol=2e-6, atol=2e-6)
    grad_tol = {"rtol": 2e-2, "atol": 1e-3} if dtype == torch.float16 else {"rtol": 2e-5,
                                                                            "atol": 2e-6}
    for a, b in zip(got[1], want[1], strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, **grad_tol)


@pytest.mark.parametrize("dim", [12, 40])
def test_kernel_resident_and_chunked_features(dim, no_torch_tiles):
    """12 features fit one resident chunk; 40 are multiplied in chunks and the backward's
    output is split (the interpreter's blocks are 16 wide)."""
    g = torch.Generator().manual_seed(12)
    z = [torch.randn(29, dim, generator=g, dtype=torch.float64) for _ in range(2)]
    with tiling(backend="auto"):
        value, grads = _run(MACLLoss(0.1, 0.5, tile_size=None), z, torch.float64)
    got, got_grads = _run(MACLLoss(0.1, 0.5), z, torch.float32)
    torch.testing.assert_close(got.double(), value, rtol=RTOL, atol=ATOL)
    for a, b in zip(got_grads, grads, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=RTOL, atol=ATOL)


def test_kernel_accuracy_at_each_precision_within_the_tables_bounds():
    """The kernel column of docs/large_batches.md's accuracy table, at a size the interpreter
    runs in seconds (benchmarks/bench_accuracy.py measures it)."""
    from tests.plugins.test_accuracy import accuracy_script, check_bounds

    check_bounds(accuracy_script().measure(["kernel"], 64, 32, torch.device("cpu")))


def _term_kernel():
    """A kernel that evaluates the row-statistics kernels' term and slope on a vector (Triton
    resolves a kernel's names in its module, so the kernels' module is read through ``K``)."""
    import triton
    import triton.language as tl

    @triton.jit
    def term(S, L, G, n, t_min, t_max, threshold, width, TERM: tl.constexpr,
             DETACH: tl.constexpr, B: tl.constexpr):
        i = tl.arange(0, B)
        s = tl.load(S + i, mask=i < n, other=0.0)
        x2, slope2 = K._term_log2(s, TERM, DETACH, (t_min, t_max, threshold, width))
        tl.store(L + i, x2, mask=i < n)
        tl.store(G + i, slope2, mask=i < n)

    return term


@pytest.mark.parametrize("shape,threshold,width", [("cosine", 0.4, 0.7),
                                                   ("piecewise", 0.4, 0.7),
                                                   ("piecewise", -0.3, 0.25)])
@pytest.mark.parametrize("detach", [True, False])
def test_the_kernels_temperature_term_equals_dystress_over_every_cosine(shape, threshold, width,
                                                                        detach):
    """The kernel's ``s / tau(s)`` and its slope (a polynomial for ``sin^2``, the piecewise
    phase reduced to one period, ``rsqrt`` for the reciprocal), in base-2 units, against
    DySTreSS's float64 term, for cosines across [-1, 1] (a little beyond, as rounded products
    give) and a ramp spanning several periods."""
    from adaptcl.plugins.dystress import _PairTemperatureTerm

    term = _term_kernel()
    s = torch.linspace(-1.01, 1.01, 1001)
    logits, slope = torch.empty_like(s), torch.empty_like(s)
    kind = {"cosine": 1, "piecewise": 2}[shape]
    term[(1,)](s, logits, slope, s.numel(), 0.1, 0.2, threshold, width, TERM=kind,
               DETACH=detach, B=1024)
    ref = _PairTemperatureTerm(0.1, 0.2, shape, threshold, width, detach)
    s64 = s.double()
    ln2 = math.log(2.0)
    torch.testing.assert_close(logits.double() * ln2, ref.logits(s64), rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(slope.double() * ln2, ref.slope(s64), rtol=2e-6, atol=1e-5)


ONE_PASS = {
    "infonce_nt_xent": lambda **t: InfoNCELoss(0.1, **t),
    "macl_cross_view_bank": lambda **t: MACLLoss(0.2, 0.5, form="cross_view", **t),
    "dystress_attached_labels": lambda **t: DySTreSSLoss(0.1, 0.2, detach_temperature=False,
                                                         **t),
}


@pytest.mark.parametrize("name", list(ONE_PASS))
def test_the_one_pass_backward_equals_the_float64_loss(name, monkeypatch):
    """``tiling(backward="onepass")``: one backward launch (``dA`` by atomics), at a width that
    takes one output block (12 features; the interpreter's blocks are 16 wide); the two split
    launches must not run."""
    for split in ("row_stats_dq", "row_stats_dk"):
        monkeypatch.setattr(K, split, None)  # launching either would fail
    g = torch.Generator().manual_seed(13)
    z = [torch.randn(29, 12, generator=g, dtype=torch.float64) for _ in range(2)]
    bank = [torch.randn(7, 12, generator=g, dtype=torch.float64)] if "bank" in name else []
    pairs = ({"labels": torch.randint(0, 4, (29,), generator=g)} if "labels" in name else {})
    with tiling(backend="auto"):
        value, grads = _run(ONE_PASS[name](tile_size=None).double(), z + bank, torch.float64,
                            **pairs)
    with tiling(backward="onepass"):  # the backward launches inside the block
        got, got_grads = _run(ONE_PASS[name](tile_size="auto"), z + bank, torch.float32,
                              **pairs)
    torch.testing.assert_close(got.double(), value, rtol=RTOL, atol=ATOL)
    for a, b in zip(got_grads, grads, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------------------------
# Which blocks take the per-element masks and label targets
# --------------------------------------------------------------------------------------------


def _slow_blocks_kernel():
    """A kernel that records, per (anchor block, column block), whether the row kernels take
    the tile's slow path: as the forward and ``dq`` decide it (the anchor block's column spans)
    and as ``dk`` does (the column block's anchor spans)."""
    import triton
    import triton.language as tl

    @triton.jit
    def slow(POS, SELF, RLAB, KLAB, BY_ROWS, BY_COLS, M, N, RB, CB, HAS_POS: tl.constexpr,
             HAS_SELF: tl.constexpr, HAS_LAB: tl.constexpr, BM: tl.constexpr,
             BN: tl.constexpr):
        b = tl.program_id(0)
        if b < RB:  # an anchor block against every column block
            rows = b * BM + tl.arange(0, BM)
            spans = K._columns_to_mask(POS, SELF, RLAB, KLAB, rows, M, N, HAS_POS, HAS_SELF,
                                       HAS_LAB)
            for c in range(CB):
                tl.store(BY_ROWS + b * CB + c, K._slow(spans, c * BN, BN, c * BN + BN > N))
        else:  # a column block against every anchor block
            c = b - RB
            cols = c * BN + tl.arange(0, BN)
            spans = K._anchors_to_mask(POS, SELF, RLAB, KLAB, cols, c * BN, M, N, HAS_POS,
                                       HAS_SELF, HAS_LAB, BN)
            for r in range(RB):
                tl.store(BY_COLS + r * CB + c, K._slow(spans, r * BM, BM, c * BN + BN > N))

    return slow


def test_only_the_blocks_that_need_them_take_the_masks_and_label_targets():
    """SupCon's 2N form at 192 anchors of 12 classes, sorted by label as ``_fused`` sorts
    them: every block that holds an excluded column, a same-class key or the last partial
    column block takes the slow path on both sides (a missed one would give wrong values), and
    the spans keep the others off it (at most one more block per row of blocks than needed)."""
    from adaptcl.plugins.tiles._fused import _row_inputs

    g = torch.Generator().manual_seed(21)
    n, block = 96, 16
    labels = torch.randint(0, 12, (n,), generator=g).repeat(2)
    rows = torch.arange(2 * n)
    z = torch.randn(2 * n, 4, generator=g)
    inputs = _row_inputs(z, z, (rows + n) % (2 * n), rows, labels, labels, "ieee")
    pos, own, rl, kl = inputs.positive_index, inputs.self_index, inputs.labels, inputs.key_labels
    m, cols = 2 * n, 2 * n - 5  # the last column block partial
    needs = (rl[:, None] == kl[None, :cols]) | (pos[:, None] == torch.arange(cols)) | (
        own[:, None] == torch.arange(cols))
    blocks = -(-m // block), -(-cols // block)
    padded = torch.zeros(blocks[0] * block, blocks[1] * block, dtype=torch.bool)
    padded[:m, :cols] = needs
    padded[:, cols:] = True  # the partial block
    expected = padded.view(blocks[0], block, blocks[1], block).any(3).any(1)
    by_rows = torch.zeros(blocks, dtype=torch.int32)
    by_cols = torch.zeros(blocks, dtype=torch.int32)
    _slow_blocks_kernel()[(sum(blocks),)](pos, own, rl, kl, by_rows, by_cols, m, cols, *blocks,
                                          HAS_POS=True, HAS_SELF=True, HAS_LAB=True, BM=block,
                                          BN=block)
    for got in (by_rows.bool(), by_cols.bool()):
        assert torch.all(got | ~expected), "a block that needs the masks skipped them"
        assert got.sum() <= expected.sum() + blocks[0], (got.sum(), expected.sum())
    assert expected.float().mean() < 0.5, expected.float().mean()
