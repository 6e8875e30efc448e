"""Functional forms (like ``torch.nn.functional``) equal their modules, for every reduction."""

from __future__ import annotations

import pytest
import torch

from adaptcl.plugins import (
    AMCLBarlowTwinsLoss,
    AMCLSimSiamLoss,
    MACLLoss,
    PairTemperature,
)
from adaptcl.plugins.functional import (
    amcl_barlow_twins,
    amcl_simsiam,
    info_nce,
    macl,
)

from ._helpers import LOSSES, names, pair


def _net():
    torch.manual_seed(0)
    return PairTemperature(8)


# Every loss of the shared table that takes ``reduction`` (AMCL's Barlow Twins form, a single
# sum, is compared below), module against functional form in the same configuration.
PER_ANCHOR = names(per_anchor=True)


@pytest.mark.parametrize("tile", [None, 3])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name", PER_ANCHOR)
def test_functional_equals_module(name, reduction, tile):
    case = LOSSES[name]
    x = case.inputs(6, seed=11)
    module_loss = case.build(reduction=reduction, tile_size=tile)(*x)
    functional_loss = case.functional(*x, reduction=reduction, tile_size=tile)
    torch.testing.assert_close(functional_loss, module_loss)
    weights = torch.rand(module_loss.shape, generator=torch.Generator().manual_seed(0))

    def input_grads(loss):  # detached inputs (ASCL-BYOL's targets, SimSiam's z): zero gradient
        return torch.autograd.grad((loss * weights).sum(), x, allow_unused=True,
                                   materialize_grads=True)

    for g_mod, g_fun in zip(input_grads(module_loss), input_grads(functional_loss), strict=True):
        torch.testing.assert_close(g_fun, g_mod)


@pytest.mark.parametrize("name", PER_ANCHOR)
def test_reduction_none_gives_per_anchor_losses_whose_mean_and_sum_are_the_others(name):
    case = LOSSES[name]
    x = case.inputs(6, seed=12)
    per_anchor = case.build(reduction="none")(*x)
    assert per_anchor.ndim == 1
    torch.testing.assert_close(per_anchor.mean(), case.build()(*x))
    torch.testing.assert_close(per_anchor.sum(), case.build(reduction="sum")(*x))


@pytest.mark.parametrize("form,anchors", [("nt_xent", 12), ("cross_view", 6),
                                          ("cross_view_symmetric", 12)])
def test_reduction_none_has_one_loss_per_anchor_of_the_form(form, anchors):
    z0, z1 = pair(6, 8)
    assert info_nce(z0, z1, form=form, reduction="none").shape == (anchors,)
    assert macl(z0, z1, form=form, reduction="none").shape == (anchors,)


def test_per_anchor_infonce_is_cross_entropy_of_each_row():
    z0, z1 = pair(5, 8, dtype=torch.float64)
    a, b = torch.nn.functional.normalize(z0, dim=1), torch.nn.functional.normalize(z1, dim=1)
    expected = torch.nn.functional.cross_entropy(a @ b.T / 0.2, torch.arange(5), reduction="none")
    torch.testing.assert_close(info_nce(z0, z1, 0.2, form="cross_view", reduction="none"), expected)


def test_amcl_simsiam_and_barlow_twins_functional_equal_modules():
    p0, p1, z0, z1 = (pair(6, 8, seed=s)[0] for s in range(4))
    for reduction in ("mean", "sum", "none"):
        torch.testing.assert_close(
            amcl_simsiam(p0, p1, z0, z1, _net(), 1e-2, reduction=reduction),
            AMCLSimSiamLoss(_net(), 1e-2, reduction=reduction)(p0, p1, z0, z1))
    torch.testing.assert_close(amcl_barlow_twins(z0, z1, _net(), 1e-2),
                               AMCLBarlowTwinsLoss(_net(), 1e-2)(z0, z1))


@pytest.mark.parametrize("bad", ["avg", None, "batchmean"])
def test_unknown_reduction_rejected_by_module_and_functional(bad):
    with pytest.raises(ValueError, match="reduction"):
        MACLLoss(reduction=bad)
    with pytest.raises(ValueError, match="reduction"):
        macl(*pair(4, 8), reduction=bad)


def test_functional_macl_validates_like_the_module():
    with pytest.raises(ValueError, match="reweight"):
        macl(*pair(4, 8), positive_in_denominator=False)
    with pytest.raises(TypeError, match="gather_distributed"):
        info_nce(*pair(4, 8), gather_distributed="yes")


def test_package_attributes_amcl_and_ascl_stay_the_submodules():
    """``plugins.amcl`` and ``plugins.ascl`` are the modules (the functional forms of those
    names live in ``plugins.functional``)."""
    import adaptcl.plugins as plugins

    assert plugins.amcl.AMCLLoss is plugins.AMCLLoss
    assert plugins.ascl.ASCLLoss is plugins.ASCLLoss
