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
