"""``torch.compile`` of the loss modules (materialised path) on CPU with inductor.

Each compiled loss must give the eager value and the eager gradients on the same batch. The
shapes are tiny and each test compiles one module once (``dynamic=False``): inductor on two
shared cores spends seconds per graph, and the numbers checked here do not depend on size.

Compiled and eager results differ only by the order of float32 reductions in the generated
C++ kernels, so they are compared at ``rtol=1e-4, atol=1e-6`` (a few ulps of the loss; a real
mistake such as a dropped mask or a wrong temperature moves them by far more).

Every loss compiles as one graph (``fullgraph=True``), with the default ``check_finite=True``.
Two things once broke the graph, and each test below fails if one comes back (found with
``torch._dynamo.explain``): the CPU finiteness check read ``bool(isfinite(x).all())`` on the
host (under compilation it is now the traced ``torch._assert_async``, still raising on NaN),
and the kernel's one-buffer log-sum-exp used ``ctx.mark_dirty`` on its in-place path (compiled
code takes the out-of-place path; inductor plans the buffers itself).

The file takes about 100 s on two shared cores (inductor's first compilation in a process
alone is most of a minute): each test that compiles with inductor is marked ``slow`` (each pays
that first compilation when run alone); the dynamo traces are not. All still run in
``make test``.
"""

from __future__ import annotations

import pytest
import torch

from adaptcl.plugins import ASCLLoss, DCLLoss, InfoNCELoss, MACLLoss

torch_dynamo = pytest.importorskip("torch._dynamo")


N, D, QUEUE = 8, 16, 24
RTOL, ATOL = 1e-4, 1e-6

# name -> (loss factory, whether it takes a queue of negatives)
LOSSES = {
    "macl": (lambda: MACLLoss(temperature=0.1, alpha=0.5), False),
    "infonce": (lambda: InfoNCELoss(temperature=0.1), False),
    "dcl": (lambda: DCLLoss(temperature=0.1), False),
    "ascl": (lambda: ASCLLoss(temperature=0.1, sharpen_temperature=0.05, num_neighbors=1), True),
}

def _inputs(with_queue: bool, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    z0 = torch.randn(N, D, generator=g).requires_grad_(True)
    z1 = torch.randn(N, D, generator=g).requires_grad_(True)
    if not with_queue:
        return z0, z1
    return z0, z1, torch.randn(QUEUE, D, generator=g)


def _value_and_grads(loss_fn, inputs) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    loss = loss_fn(*inputs)
    return loss.detach(), torch.autograd.grad(loss, inputs[:2])


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch_dynamo.reset()
    yield
    torch_dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LOSSES))
def test_compiled_loss_matches_eager_value_and_gradient(name):
    factory, with_queue = LOSSES[name]
    eager, compiled = factory(), torch.compile(factory(), backend="inductor", dynamic=False)
    for seed in (0, 1):  # the second batch reuses the compiled graphs
        inputs = _inputs(with_queue, seed)
        value, grads = _value_and_grads(eager, inputs)
        compiled_value, compiled_grads = _value_and_grads(compiled, inputs)
        assert torch.isfinite(compiled_value)
        torch.testing.assert_close(compiled_value, value, rtol=RTOL, atol=ATOL)
        for got, expected in zip(compiled_grads, grads, strict=True):
            assert got.abs().sum() > 0
            torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)
    # what trainers log is computed inside the compiled forward too
    for key in ("temperature", "alignment"):
        torch.testing.assert_close(compiled.last_stats[key].float(),
                                   eager.last_stats[key].float(), rtol=RTOL, atol=ATOL)


@pytest.mark.slow
def test_compiled_macl_temperature_follows_the_batch_alignment():
    """The adaptive temperature is traced as data, not baked in as a constant of batch one."""
    compiled = torch.compile(MACLLoss(temperature=0.1, alpha=0.5), dynamic=False)
    z0, z1 = _inputs(False, 0)
    compiled(z0, z1)
    unaligned = compiled.last_stats["temperature"].item()
    compiled(z0, z0 + 0.01 * z1)  # nearly aligned pairs: A close to 1, tau close to 0.15
    aligned = compiled.last_stats["temperature"].item()
    assert unaligned < 0.11 < 0.14 < aligned


def _break_reasons(explanation) -> list[str]:
    return [reason.reason.splitlines()[0] for reason in explanation.break_reasons]


@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_traces_without_graph_breaks(name):
    factory, with_queue = LOSSES[name]
    explanation = torch_dynamo.explain(factory())(*_inputs(with_queue))
    assert _break_reasons(explanation) == []
    assert explanation.graph_count == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_compiles_as_one_graph(name):
    factory, with_queue = LOSSES[name]
    compiled = torch.compile(factory(), fullgraph=True, dynamic=False)
    inputs = _inputs(with_queue)
    value, grads = _value_and_grads(factory(), inputs)
    compiled_value, compiled_grads = _value_and_grads(compiled, inputs)
    torch.testing.assert_close(compiled_value, value, rtol=RTOL, atol=ATOL)
    for got, expected in zip(compiled_grads, grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.slow
def test_compiled_finiteness_check_still_rejects_nan():
    compiled = torch.compile(MACLLoss(temperature=0.1), fullgraph=True, dynamic=False)
    z0, z1 = _inputs(False)
    compiled(z0, z1)
    poisoned = z0.detach().clone()
    poisoned[0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="contains NaN or inf"):
        compiled(poisoned, z1)
