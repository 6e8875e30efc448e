"""How a recipe sets torch up: the device, precision names, autocast, the gradient scaler."""

from __future__ import annotations

import pytest

from adaptcl.precision import autocast
from adaptcl.recipes.engine.errors import RecipeError
from adaptcl.recipes.engine.torch_env import device_identity, grad_scaler, resolve_device


def test_device_and_precision_are_validated_and_autocast_runs():
    import torch

    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert device_identity("auto") == resolve_device("auto")
    with pytest.raises(RecipeError, match="--device"):
        resolve_device("tpu")
    with pytest.raises(ValueError, match="precision must be one of"):
        autocast("cpu", "fp8")
    with autocast("cpu", "bf16-mixed"):
        y = torch.nn.Linear(4, 4)(torch.randn(2, 4))
    assert y.dtype == torch.bfloat16
    assert not grad_scaler("cpu", "32").is_enabled()


def test_loader_workers_auto_is_zero_on_the_cpu_and_the_cpus_available_on_cuda(monkeypatch):
    from adaptcl.recipes.engine import torch_env
    from adaptcl.recipes.engine.torch_env import MAX_AUTO_WORKERS, loader_options, loader_workers

    def cpus(n):
        monkeypatch.setattr(torch_env.os, "sched_getaffinity", lambda pid: set(range(n)),
                            raising=False)

    cpus(16)
    assert loader_workers("cpu", None) == 0  # as before: numbers unchanged on the CPU
    assert loader_workers("cuda", None) == 15  # one CPU left to the training process
    assert loader_workers("cuda:1", None, devices=4) == 3  # four ranks share the CPUs
    assert loader_workers("cuda", 5) == loader_workers("cpu", 5) == 5  # given: kept
    cpus(2)
    assert loader_workers("cuda", None, devices=4) == 1  # at least one
    cpus(200)
    assert loader_workers("cuda", None) == MAX_AUTO_WORKERS
    assert loader_options("cuda", 3) == {"num_workers": 3, "pin_memory": True,
                                         "persistent_workers": True}
    assert loader_options("cpu", 0) == {"num_workers": 0, "pin_memory": False,
                                        "persistent_workers": False}
