"""Small utilities shared by the core tests."""

from __future__ import annotations

import torch


def pair(n: int = 12, d: int = 16, *, seed: int = 0, dtype=torch.float32, grad: bool = True):
    g = torch.Generator().manual_seed(seed)
    z0 = torch.randn(n, d, generator=g, dtype=dtype).requires_grad_(grad)
    z1 = torch.randn(n, d, generator=g, dtype=dtype).requires_grad_(grad)
    return z0, z1


def grads(loss: torch.Tensor, *tensors: torch.Tensor):
    return torch.autograd.grad(loss, tensors)


def assert_close_with_grads(a_fn, b_fn, *inputs, rtol=1e-5, atol=1e-6):
    la, lb = a_fn(*inputs), b_fn(*inputs)
    torch.testing.assert_close(la, lb, rtol=rtol, atol=atol)
    for ga, gb in zip(grads(la, *inputs), grads(lb, *inputs), strict=True):
        torch.testing.assert_close(ga, gb, rtol=rtol, atol=atol)
