"""The loss core computes in float32 under bf16 and fp16 autocast.

Under ``torch.autocast`` a model hands the loss half-precision embeddings. Every core loss
must then normalise, build its logits, softmax/log-sum-exp, entropy and MACL's ``V`` in
float32 (DESIGN: "Mixed precision"); only the operands of its products are in the half dtype
(the precision policy, :mod:`adaptcl.plugins._products`: tensor cores, float32
accumulation). The check: the loss of half-precision embeddings under autocast equals, to
float32 rounding, the loss of the *same* values upcast to float32 with autocast off and the
products at the half dtype's precision, and the gradient reaching the half-precision embeddings
is that float32 gradient rounded once to the half dtype. A loss that ran any other step in
bf16/fp16 would differ by the dtype's rounding (0.4 % / 0.05 %) instead of float32's (1e-7).

The temperature is 0.05 (SimCSE's): ``exp(1 / 0.05) = 4.9e8`` exceeds float16's largest value
(65,504), so a softmax exponentiated in float16 would overflow.

The framework-level steps (Lightning, sentence-transformers, GraphCL) are in
``tests/adapters/*/test_mixed_precision.py``.
"""

from __future__ import annotations

import copy

import pytest
import torch

from adaptcl.plugins import MACLLoss
from adaptcl.plugins import candidates as candidates_module

from ._helpers import LOSSES, names

N, D, QUEUE, TAU = 12, 16, 20, 0.05
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}
# The backward's products round their gradient tiles to the half dtype (as autocast's own matmuls
# do), so float16 training scales the loss (torch.amp.GradScaler); here by a fixed power of two
# at which no gradient tile of these inputs underflows or overflows float16.
GRAD_SCALE = 2.0**8
# Every loss of the shared table with the shared keywords, at TAU (where a temperature applies).
EVERY_LOSS = names(shared=True)


def _embeddings(dtype: torch.dtype, device: torch.device, seed: int = 0):
    """Half-precision positives that are well aligned (large logits) plus a queue."""
    g = torch.Generator().manual_seed(seed)
    z0 = torch.randn(N, D, generator=g)
    z1 = z0 + 0.1 * torch.randn(N, D, generator=g)
    queue = torch.randn(QUEUE, D, generator=g)
    return [t.to(device=device, dtype=dtype) for t in (z0, z1, queue)]


def _run(loss_fn, z0, z1, queue, name: str):
    return loss_fn(z0, z1, queue) if LOSSES[name].kind == "queue" else loss_fn(z0, z1)


@pytest.mark.parametrize("precision", list(HALF))
@pytest.mark.parametrize("name", EVERY_LOSS)
def test_loss_under_autocast_computes_in_float32(name, precision, device, monkeypatch):
    dtype = HALF[precision]
    half_loss_fn = LOSSES[name].build(temperature=TAU, dim=D).to(device)
    float_loss_fn = copy.deepcopy(half_loss_fn)
    z0, z1, queue = _embeddings(dtype, device)
    z0.requires_grad_(True)
    z1.requires_grad_(True)
    with torch.autocast(device_type=device.type, dtype=dtype):
        loss = _run(half_loss_fn, z0, z1, queue, name)
    f0, f1 = (z.detach().float().requires_grad_(True) for z in (z0, z1))
    with monkeypatch.context() as policy:  # float32 inputs, products at the half precision
        policy.setattr(candidates_module, "product_precision", lambda dtype, device: precision)
        expected = _run(float_loss_fn, f0, f1, queue.float(), name)

    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-7)
    (loss * GRAD_SCALE).backward()
    (expected * GRAD_SCALE).backward()
    for half_z, float_z in ((z0, f0), (z1, f1)):
        if float_z.grad is None:  # a detached input (ASCL-BYOL's targets)
            assert half_z.grad is None
            continue
        assert half_z.grad.dtype == dtype and torch.isfinite(half_z.grad).all()
        torch.testing.assert_close(half_z.grad, float_z.grad.to(dtype), rtol=0, atol=0)
    # Not a vacuous comparison: some gradient reaches the embeddings (ASCL-BYOL's targets are
    # detached, so z1's is 0; FlatNCE's value is 1 by construction but its gradient is not 0).
    # The triplet losses' hinges are all inactive on these well-aligned views (value and
    # gradient exactly 0 in both precisions).
    if not name.startswith("triplet"):
        assert sum(z.grad.abs().sum() for z in (z0, z1) if z.grad is not None) > 0
    for p_half, p_float in zip(half_loss_fn.parameters(), float_loss_fn.parameters(), strict=True):
        assert p_half.grad.dtype == torch.float32  # AMCL's temperature network stays float32
        torch.testing.assert_close(p_half.grad, p_float.grad, rtol=1e-6, atol=1e-7)
    for key, value in half_loss_fn.last_stats.items():
        if value.is_floating_point():
            assert value.dtype in (torch.float32, torch.float64), key


def test_float16_softmax_at_temperature_005_overflows_where_the_loss_does_not(device):
    """Why the float32 rule matters: the same logits exponentiated in float16 reach inf."""
    z0, z1, _ = _embeddings(torch.float16, device)
    cosine = torch.nn.functional.cosine_similarity(z0.float(), z1.float())
    naive = torch.exp((cosine / TAU).to(torch.float16))
    assert torch.isinf(naive).any()
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = MACLLoss(TAU, alpha=2.0, a0=0.8)(z0, z1)
    assert torch.isfinite(loss)
