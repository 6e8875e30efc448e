"""The settings of a self-supervised module as one typed object
(:class:`~adaptcl.adapters.lightning.settings.SSLModuleSettings`): checked when made, naming the
bad field; ``build_ssl_module`` takes it, or its fields as keywords, and builds the same module."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

pytest.importorskip("lightly")
pytest.importorskip("pytorch_lightning")

from adaptcl.adapters.lightning import SSLModuleSettings  # noqa: E402
from adaptcl.adapters.lightning.base import SSLModule  # noqa: E402
from adaptcl.adapters.lightning.factory import build_ssl_module  # noqa: E402

SMALL = dict(width=0.0625, hidden_dim=32, output_dim=16, queue_size=32, num_classes=4)


#: a bad value of every field, and the error it raises
BAD = [
    ("backbone", "resnet-7", ValueError), ("width", 0.0, ValueError),
    ("hidden_dim", 0, ValueError), ("output_dim", 2.0, TypeError),
    ("temperature", -0.1, ValueError), ("macl_temperature", 0.0, ValueError),
    ("alpha", float("nan"), ValueError), ("a0", float("inf"), ValueError),
    ("num_heads", 0, ValueError), ("beta", -1e-3, ValueError), ("kappa", 0, ValueError),
    ("negative_term", "hardest", ValueError), ("amcl_objective", "nce", ValueError),
    ("queue_size", 0, ValueError), ("num_neighbors", -1, ValueError),
    ("sharpen_temperature", 0, ValueError), ("dystress_max_temperature", -1.0, ValueError),
    ("max_temperature", 0.0, ValueError), ("period", 0, ValueError),
    ("gather_distributed", 1, TypeError), ("tile_size", "big", ValueError),
    ("optimizer", "lamb", ValueError),
    ("lr", 0.0, ValueError), ("weight_decay", -1.0, ValueError),
    ("mini_batch_size", 0, ValueError), ("num_classes", 1, ValueError), ("knn_k", 0, ValueError), ("knn_t", 0.0, ValueError)]


@pytest.mark.parametrize("field,value,error", BAD)
def test_a_bad_setting_is_refused_naming_its_field(field, value, error):
    with pytest.raises(error, match=f"^{field} must"):
        SSLModuleSettings(**{field: value})


def test_the_settings_are_frozen_keyword_only_and_every_field_is_checked():
    settings = SSLModuleSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.alpha = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        SSLModuleSettings("resnet-18")  # type: ignore[misc]
    # a replaced field is checked as a new object's
    with pytest.raises(ValueError, match="^kappa must"):
        dataclasses.replace(settings, kappa=0)
    assert [field for field, _, _ in BAD] == list(SSLModuleSettings.field_names())


def test_the_monitor_defaults_are_the_modules_own():
    """num_classes, knn_k and knn_t default to SSLModule's, so a settings object left at its
    defaults builds the module a bare call builds."""
    defaults = inspect.signature(SSLModule.__init__).parameters
    settings = SSLModuleSettings()
    for name in ("mini_batch_size", "num_classes", "knn_k", "knn_t"):
        assert getattr(settings, name) == defaults[name].default, name
    assert SSLModuleSettings(lr=0.1).training_options() == {
        "lr": 0.1, "mini_batch_size": None, "num_classes": 10, "knn_k": 200, "knn_t": 0.1}


def _state(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("method,loss", [("simclr", "macl"), ("moco", "dystress"),
                                         ("simsiam", "amcl"), ("ascl-moco", "ascl")])
def test_a_settings_object_and_its_fields_as_keywords_build_the_same_module(method, loss):
    settings = SSLModuleSettings(**SMALL, temperature=0.2, alpha=1.0, num_heads=3)
    torch.manual_seed(0)
    by_object = build_ssl_module(method, loss, settings)
    torch.manual_seed(0)
    by_keywords = build_ssl_module(method, loss, **SMALL, temperature=0.2, alpha=1.0,
                                   num_heads=3)
    torch.manual_seed(0)
    # keywords replace the fields of a settings object
    mixed = build_ssl_module(method, loss, SSLModuleSettings(**SMALL), temperature=0.2,
                             alpha=1.0, num_heads=3)
    assert repr(by_object) == repr(by_keywords) == repr(mixed)
    reference = _state(by_object)
    for other in (by_keywords, mixed):
        state = _state(other)
        assert state.keys() == reference.keys()
        assert all(torch.equal(state[k], reference[k]) for k in reference)
    assert vars(by_object.criterion).keys() == vars(by_keywords.criterion).keys()


def test_the_settings_reach_the_loss_and_the_module():
    module = build_ssl_module("moco", "macl", SSLModuleSettings(
        **SMALL, temperature=0.2, macl_temperature=0.15, alpha=0.7, a0=0.2, lr=0.5,
        weight_decay=0.0, knn_k=7))
    assert module.criterion.temperature == pytest.approx(0.15)
    assert (module.criterion.alpha, module.criterion.A_0) == pytest.approx((0.7, 0.2))
    assert (module.lr, module.weight_decay, module.knn_k, module.num_classes) == (0.5, 0.0, 7, 4)
    # the optimiser left None keeps the method's own (MoCo: SGD)
    assert module.optimizer_name == "sgd"
    # a keyword that is no setting goes to the method's module
    constant = build_ssl_module("simclr", "infonce", SSLModuleSettings(**SMALL),
                                lr_schedule="constant")
    assert constant.lr_schedule == "constant" and constant.optimizer_name == "adam"


def test_a_settings_argument_of_another_type_is_refused_by_name():
    with pytest.raises(TypeError, match="settings must be an SSLModuleSettings, got dict"):
        build_ssl_module("simclr", "macl", {"alpha": 0.5})
