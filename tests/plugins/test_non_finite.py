"""NaN or inf features with the default ``check_finite=True``, on each device
(:func:`adaptcl.plugins.validation.check_all_finite`).

* CPU: a one-line :class:`~adaptcl.plugins.validation.NonFiniteError` at once
  (``test_validation.py``), a ``RuntimeError`` of the traced assertion under ``torch.compile``
  (``test_compile.py``).
* An accelerator: never a device-side assertion (it ends the process's CUDA context) and never a
  wait. The values go on into the loss, which is NaN, so that under AMP ``GradScaler`` skips the
  step, as with open_clip's ``ClipLoss``, Lightly's losses and sentence-transformers' MNRL; a
  :class:`~adaptcl.plugins.validation.NonFiniteWarning` tells the user once the host can read
  the result without waiting.

This machine has no GPU: the accelerator's path runs on CPU tensors with ``_on_host`` made to
say no (a stand-in: what differs on CUDA is only the copy to pinned memory and the event the
host queries, which the ``gpu`` test below runs where there is one).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from adaptcl.plugins import MACLLoss, validation
from adaptcl.plugins.validation import NonFiniteWarning

from ._helpers import LOSSES, names

EVERY_LOSS = names(shared=True)


@pytest.fixture
def accelerator_path(monkeypatch):
    """CPU tensors take the accelerator's path."""
    monkeypatch.setattr(validation, "_on_host", lambda x: False)
    _forget_unreported()
    yield
    _forget_unreported()


@pytest.fixture
def accelerator(accelerator_path, monkeypatch):
    """The accelerator's path, where any device-side assertion fails the test (not under
    ``torch.compile``: dynamo would keep this stand-in as ``torch._assert_async`` for the
    rest of the process)."""
    def asserted(*args, **kwargs):
        raise AssertionError(f"a device-side assertion: {args}")

    monkeypatch.setattr(torch, "_assert_async", asserted)


def _forget_unreported():
    """What another test left to tell (or this one), told to no one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteWarning)
        validation._NON_FINITE.tell()


def _poisoned(name):
    """The case's inputs, the first view's first row NaN and the second view's first row inf."""
    x = [t.detach().clone() for t in LOSSES[name].inputs(4)]
    x[0][0] = float("nan")
    x[1][0] = float("inf")
    return x


@pytest.mark.parametrize("name", EVERY_LOSS)
def test_on_an_accelerator_a_nan_feature_gives_a_nan_loss_and_a_warning(name, accelerator):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = LOSSES[name].build()(*_poisoned(name))
        validation._NON_FINITE.tell()  # what the next check does
    assert not torch.isfinite(loss).all()
    told = [str(w.message) for w in caught if issubclass(w.category, NonFiniteWarning)]
    first, second = ("p0", "p1") if LOSSES[name].kind == "simsiam" else ("z0", "z1")
    assert told[:2] == [
        f"{first} contained NaN or inf: the loss of that step is NaN (under AMP, GradScaler "
        "skips the step); check_finite=False silences this",
        f"{second} contained NaN or inf: the loss of that step is NaN (under AMP, GradScaler "
        "skips the step); check_finite=False silences this"], told


def test_on_an_accelerator_finite_features_tell_nothing(accelerator):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x = LOSSES["macl"].inputs(4)
        MACLLoss(0.1)(*x)
        validation._NON_FINITE.tell()


@pytest.mark.parametrize("name", EVERY_LOSS)
def test_gradscaler_skips_the_step_of_a_nan_feature(name, accelerator):
    """What AMP's ``GradScaler`` does with that NaN loss: its gradients are not finite, so
    ``step`` leaves the parameters as they were and ``update`` halves the scale (here its CPU
    form; on CUDA the same ``_amp_foreach_non_finite_check_and_unscale_``)."""
    weight = torch.nn.Parameter(torch.ones(()))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x = _poisoned(name)
    x[0] = x[0] * weight  # the features a model made
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteWarning)
        scaler.scale(LOSSES[name].build()(*x)).backward()
    scaler.step(optimizer)
    scaler.update()
    assert weight.item() == 1.0 and scaler.get_scale() == 512.0


def test_under_torch_compile_on_an_accelerator_nothing_is_traced(accelerator_path):
    """Nothing of the check in the graph (one graph; a traced assertion would raise here, on
    CPU tensors): the NaN loss is the only sign."""
    torch._dynamo.reset()
    try:
        compiled = torch.compile(MACLLoss(0.1), backend="eager", fullgraph=True)
        assert not torch.isfinite(compiled(*_poisoned("macl"))).all()
    finally:
        torch._dynamo.reset()


@pytest.mark.gpu
def test_on_cuda_a_nan_feature_neither_asserts_nor_waits_and_the_scaler_skips_it():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _forget_unreported()
    weight = torch.nn.Parameter(torch.ones((), device="cuda"))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)
    z0, z1 = (t.detach().cuda() for t in _poisoned("macl"))
    loss_fn = MACLLoss(0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = loss_fn(z0 * weight, z1)
            scaler.scale(loss).backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        scaler.step(optimizer)
        scaler.update()
        torch.cuda.synchronize()
        loss_fn(z0.nan_to_num(), z1.nan_to_num(posinf=0.0))  # the next step: told now
    assert not torch.isfinite(loss).item()
    assert weight.item() == 1.0 and scaler.get_scale() == 512.0  # skipped
    assert [str(w.message)[:30] for w in caught if w.category is NonFiniteWarning] == [
        "z0 contained NaN or inf: the l", "z1 contained NaN or inf: the l"]
    assert torch.ones(2, device="cuda").sum().item() == 2.0  # the CUDA context lives on
