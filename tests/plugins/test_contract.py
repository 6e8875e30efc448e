"""The user-facing contract of every entry point, beyond its formula: the documented defaults
(functional form = module = the values the docstrings state), keywords reaching the
computation (negatives, tile_size, gather_fn, check_finite), errors that start by naming the
bad argument, mixed float32/float64 inputs computed in float64, ``repr`` and small helpers."""

from __future__ import annotations

import inspect
import math
import re

import pytest
import torch

import adaptcl.plugins as P
from adaptcl.plugins import functional as F
from adaptcl.plugins.tiles._loop import materialised_bytes

from ._helpers import DIM, LOSSES, seeded

pytestmark = pytest.mark.usefixtures("one_thread")

D64 = torch.float64


def _net():
    return seeded(3, lambda: P.PairTemperature(DIM)).double()


def _x(n=5, k=4, seed=41):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(r, DIM, generator=g, dtype=D64) for r in (n, n, n, n, k))


# name -> (functional call with defaults, module call with defaults, the documented defaults
# passed explicitly to the functional form); ``x = (a, b, c, d, queue)``.
DEFAULTS = {
    "info_nce": (lambda x, net: F.info_nce(x[0], x[1]), lambda x, net: P.InfoNCELoss()(x[0], x[1]),
                 lambda x, net: F.info_nce(x[0], x[1], 0.1, form="nt_xent",
                                           positive_in_denominator=True, reduction="mean")),
    "dcl": (lambda x, net: F.dcl(x[0], x[1]), lambda x, net: P.DCLLoss()(x[0], x[1]),
            lambda x, net: F.dcl(x[0], x[1], 0.1, form="nt_xent")),
    "flat_nce": (lambda x, net: F.flat_nce(x[0], x[1]), lambda x, net: P.FlatNCELoss()(x[0], x[1]),
                 lambda x, net: F.flat_nce(x[0], x[1], 0.1, form="nt_xent")),
    "dual_temperature": (lambda x, net: F.dual_temperature(x[0], x[1]),
                         lambda x, net: P.DualTemperatureLoss()(x[0], x[1]),
                         lambda x, net: F.dual_temperature(x[0], x[1], 0.1, 1.0, form="nt_xent")),
    "macl": (lambda x, net: F.macl(x[0], x[1]), lambda x, net: P.MACLLoss()(x[0], x[1]),
             lambda x, net: F.macl(x[0], x[1], 0.1, 0.5, 0.0, reweight=True, adaptive=True,
                                   temperature_form="linear", weight_form="inverse",
                                   min_temperature=0.01, form="nt_xent",
                                   positive_in_denominator=True)),
    # the SimCSE setting at A ~ 0: 1 + 2 (A - 0.8) < 0, the default floor tau0 / 10 applies
    "macl_floor": (lambda x, net: F.macl(x[0], x[1], 0.05, 2.0, 0.8, reweight=False),
                   lambda x, net: P.MACLLoss(0.05, 2.0, 0.8, reweight=False)(x[0], x[1]),
                   lambda x, net: F.macl(x[0], x[1], 0.05, 2.0, 0.8, reweight=False,
                                         min_temperature=0.005)),
    "dystress": (lambda x, net: F.dystress(x[0], x[1]),
                 lambda x, net: P.DySTreSSLoss()(x[0], x[1]),
                 lambda x, net: F.dystress(x[0], x[1], 0.1, 0.2, shape="cosine",
                                           detach_temperature=True, form="nt_xent",
                                           positive_in_denominator=True)),
    "temperature_schedule": (lambda x, net: F.temperature_schedule(x[0], x[1]),
                             lambda x, net: P.TemperatureScheduleLoss()(x[0], x[1]),
                             lambda x, net: F.temperature_schedule(x[0], x[1], 0.1, 1.0, 400,
                                                                   step=0, form="nt_xent",
                                                                   positive_in_denominator=True)),
    # the module's parameter starts at log(1 / 0.07) (CLIP's); the functional form takes it
    "learnable_temperature": (
        lambda x, net: F.learnable_temperature(x[0], x[1], torch.tensor(math.log(1 / 0.07))),
        lambda x, net: P.LearnableTemperatureLoss()(x[0], x[1]),
        lambda x, net: F.learnable_temperature(x[0], x[1], torch.tensor(math.log(1 / 0.07)),
                                               min_temperature=0.01, max_temperature=1.0,
                                               form="nt_xent", positive_in_denominator=True)),
    "ascl": (lambda x, net: F.ascl(x[0], x[1], negatives=x[4]),
             lambda x, net: P.ASCLLoss()(x[0], x[1], x[4]),
             lambda x, net: F.ascl(x[0], x[1], 0.1, 0.05, 1, "ascl", negatives=x[4],
                                   form="queue")),
    "ascl_byol": (lambda x, net: F.ascl_byol(x[0], x[1]),
                  lambda x, net: P.ASCLBYOLLoss()(x[0], x[1]),
                  lambda x, net: F.ascl_byol(x[0], x[1], 0.05, 1, "ascl")),
    "amcl": (lambda x, net: F.amcl(x[0], x[1], net), lambda x, net: P.AMCLLoss(net)(x[0], x[1]),
             lambda x, net: F.amcl(x[0], x[1], net, 1e-3, negative_term="softmax",
                                   objective="nt_xent", form="nt_xent")),
    "amcl_topk": (lambda x, net: F.amcl(x[0], x[1], net, negative_term="topk"),
                  lambda x, net: P.AMCLLoss(net, negative_term="topk")(x[0], x[1]),
                  lambda x, net: F.amcl(x[0], x[1], net, 1e-3, negative_term="topk", kappa=1)),
    "amcl_simsiam": (lambda x, net: F.amcl_simsiam(*x[:4], net),
                     lambda x, net: P.AMCLSimSiamLoss(net)(*x[:4]),
                     lambda x, net: F.amcl_simsiam(*x[:4], net, 1e-3, reduction="mean")),
    "amcl_barlow_twins": (lambda x, net: F.amcl_barlow_twins(x[0], x[1], net),
                          lambda x, net: P.AMCLBarlowTwinsLoss(net)(x[0], x[1]),
                          lambda x, net: F.amcl_barlow_twins(x[0], x[1], net, 1e-3, 5e-3)),
    "margin_contrastive": (lambda x, net: F.margin_contrastive(x[0], x[1]),
                           lambda x, net: P.MarginContrastiveLoss()(x[0], x[1]),
                           lambda x, net: F.margin_contrastive(x[0], x[1], 1.0, squared=True,
                                                               form="cross_view")),
    "triplet": (lambda x, net: F.triplet(x[0], x[1]), lambda x, net: P.TripletLoss()(x[0], x[1]),
                lambda x, net: F.triplet(x[0], x[1], 0.5, mining="all", form="cross_view")),
    "nce": (lambda x, net: F.nce(x[0], x[1]), lambda x, net: P.NCELoss()(x[0], x[1]),
            lambda x, net: F.nce(x[0], x[1], 0.1, form="cross_view")),
}


@pytest.mark.parametrize("name", list(DEFAULTS))
def test_documented_defaults_of_functional_forms_and_modules(name):
    functional, module, explicit = DEFAULTS[name]
    x, net = _x(), _net()
    expected = explicit(x, net)
    assert expected.ndim == 0  # reduction="mean" by default
    torch.testing.assert_close(functional(x, net), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(module(x, net), expected, rtol=1e-12, atol=1e-12)


def _fake_gather(x):
    """A two-rank gather in one process: this rank's rows and a fixed other rank's."""
    other = torch.linspace(-1.0, 1.0, x.numel(), dtype=x.dtype).reshape(x.shape).flip(0)
    return [x, other]


# name -> (functional, module factory, needs negatives); every keyword below reaches both
KEYWORDS = {
    "info_nce": (lambda *a, **k: F.info_nce(*a, 0.3, **k), lambda **k: P.InfoNCELoss(0.3, **k)),
    "dcl": (lambda *a, **k: F.dcl(*a, 0.3, **k), lambda **k: P.DCLLoss(0.3, **k)),
    "flat_nce": (lambda *a, **k: F.flat_nce(*a, 0.3, **k), lambda **k: P.FlatNCELoss(0.3, **k)),
    "dual_temperature": (lambda *a, **k: F.dual_temperature(*a, 0.3, 0.8, **k),
                         lambda **k: P.DualTemperatureLoss(0.3, 0.8, **k)),
    "macl": (lambda *a, **k: F.macl(*a, 0.3, 0.5, **k), lambda **k: P.MACLLoss(0.3, 0.5, **k)),
    "temperature_schedule": (lambda *a, **k: F.temperature_schedule(*a, 0.2, 0.6, 10, step=3, **k),
                             lambda **k: P.TemperatureScheduleLoss(0.2, 0.6, 10, step=3, **k)),
    "learnable_temperature": (
        # the module's float32 parameter, in float64 as .double() makes it
        lambda *a, **k: F.learnable_temperature(*a, torch.tensor(math.log(1 / 0.3)).to(D64), **k),
        lambda **k: P.LearnableTemperatureLoss(0.3, **k).double()),
    "ascl": (lambda *a, **k: F.ascl(*a, 0.3, 0.1, 2, **k),
             lambda **k: P.ASCLLoss(0.3, 0.1, 2, **k)),
    "amcl": (lambda *a, **k: F.amcl(*a, _net(), 0.01, **k),
             lambda **k: P.AMCLLoss(_net(), 0.01, **k)),
    "margin_contrastive": (lambda *a, **k: F.margin_contrastive(*a, 0.9, **k),
                           lambda **k: P.MarginContrastiveLoss(0.9, **k)),
    "triplet": (lambda *a, **k: F.triplet(*a, 0.4, **k), lambda **k: P.TripletLoss(0.4, **k)),
    "nce": (lambda *a, **k: F.nce(*a, 0.3, **k), lambda **k: P.NCELoss(0.3, **k)),
}


@pytest.mark.parametrize("name", list(KEYWORDS))
def test_keywords_reach_the_computation(name):
    """``negatives``, ``tile_size``, ``gather_fn`` and ``reduction`` change the result, and the
    functional form and the module agree on each (queue form for ASCL, cross-view otherwise)."""
    functional, module = KEYWORDS[name]
    a, b, _, _, queue = _x()
    form = "queue" if name == "ascl" else "cross_view"
    base = functional(a, b, negatives=queue, form=form, reduction="none")
    variants = [dict(tile_size=2), dict(reduction="sum")]
    if name != "ascl":
        variants += [dict(negatives=None), dict(gather_fn=_fake_gather)]
    for kw in variants:
        call = {"negatives": queue, "form": form, "reduction": "none", **kw}
        got = functional(a, b, **call)
        negatives = call.pop("negatives")
        want = module(**call)(a, b, negatives)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=f"{name} {kw}")
        if "tile_size" in kw:
            torch.testing.assert_close(got, base, rtol=1e-10, atol=1e-12)
        elif "reduction" in kw:
            torch.testing.assert_close(got, base.sum(), rtol=1e-10, atol=1e-12)
        else:  # the candidates changed (FlatNCE's value is 1 whatever they are: its InfoNCE)
            fn = module(**call)
            fn(a, b, negatives)
            ref = module(form=form, reduction="none")
            ref(a, b, queue)
            key = "plain_loss" if name == "flat_nce" else "loss"
            assert not torch.allclose(fn.last_stats[key], ref.last_stats[key]), \
                f"{name}: {kw} had no effect"


@pytest.mark.parametrize("name", list(DEFAULTS))
def test_check_finite_is_on_by_default_and_can_be_turned_off(name):
    functional = DEFAULTS[name][0]
    x = list(_x())
    x[1] = x[1].clone()
    x[1][0, 0] = math.nan
    with pytest.raises(ValueError, match="contains NaN or inf"):
        functional(tuple(x), _net())
    kw = _functional_of(name)
    out = kw(tuple(x), _net())
    assert out.ndim == 0  # computed (NaN or not), no error


def _functional_of(name):
    """The functional form of ``name`` with ``check_finite=False``."""
    calls = {
        "info_nce": lambda x, n: F.info_nce(x[0], x[1], check_finite=False),
        "dcl": lambda x, n: F.dcl(x[0], x[1], check_finite=False),
        "flat_nce": lambda x, n: F.flat_nce(x[0], x[1], check_finite=False),
        "dual_temperature": lambda x, n: F.dual_temperature(x[0], x[1], check_finite=False),
        "macl": lambda x, n: F.macl(x[0], x[1], check_finite=False),
        "macl_floor": lambda x, n: F.macl(x[0], x[1], 0.05, 2.0, 0.8, reweight=False,
                                          check_finite=False),
        "dystress": lambda x, n: F.dystress(x[0], x[1], check_finite=False),
        "temperature_schedule": lambda x, n: F.temperature_schedule(x[0], x[1],
                                                                    check_finite=False),
        "learnable_temperature": lambda x, n: F.learnable_temperature(
            x[0], x[1], torch.tensor(math.log(1 / 0.07)), check_finite=False),
        "ascl": lambda x, n: F.ascl(x[0], x[1], negatives=x[4], check_finite=False),
        "ascl_byol": lambda x, n: F.ascl_byol(x[0], x[1], check_finite=False),
        "amcl": lambda x, n: F.amcl(x[0], x[1], n, check_finite=False),
        "amcl_topk": lambda x, n: F.amcl(x[0], x[1], n, negative_term="topk",
                                         check_finite=False),
        "amcl_simsiam": lambda x, n: F.amcl_simsiam(*x[:4], n, check_finite=False),
        "amcl_barlow_twins": lambda x, n: F.amcl_barlow_twins(x[0], x[1], n, check_finite=False),
        "margin_contrastive": lambda x, n: F.margin_contrastive(x[0], x[1], check_finite=False),
        "triplet": lambda x, n: F.triplet(x[0], x[1], check_finite=False),
        "nce": lambda x, n: F.nce(x[0], x[1], check_finite=False),
    }
    return calls[name]


# --------------------------------------------------------------------------------------------
# Errors name the bad argument first
# --------------------------------------------------------------------------------------------

BAD = {float: math.nan, bool: "yes", int: 1.5, str: "no-such-choice",
       torch.Tensor: torch.tensor([0.5, 1.5])}
# keywords that take any value on purpose (bool() of it) or are not checked arguments
UNCHECKED = {"positive_in_denominator", "squared", "reweight", "adaptive", "negatives",
             "temperature_net", "gather_fn", "dim", "clamp"}
INT_NONE = {"tile_size", "bound_warning_steps"}  # ints with a None (or "auto") default
FLOAT_NONE = {"min_temperature"}
STR_NONE = {"hardness_mode"}
TENSOR_NONE = {"labels", "negative_labels", "negative_owners"}  # integer tensors


def _checked_keywords(cls):
    for p in inspect.signature(cls).parameters.values():
        if p.name in UNCHECKED or p.kind is p.VAR_KEYWORD:
            continue
        kind = (int if p.name in INT_NONE else float if p.name in FLOAT_NONE
                else str if p.name in STR_NONE else torch.Tensor if p.name in TENSOR_NONE
                else type(p.default) if p.default is not inspect.Parameter.empty else float)
        yield p.name, BAD[kind]
        if kind is float:
            yield p.name, "0.1"  # not a number: TypeError, still naming the argument


def _module_cases():
    for cls in (P.InfoNCELoss, P.DCLLoss, P.FlatNCELoss, P.DualTemperatureLoss, P.MACLLoss,
                P.DySTreSSLoss, P.TemperatureScheduleLoss, P.LearnableTemperatureLoss, P.ASCLLoss, P.ASCLBYOLLoss, P.AMCLLoss, P.AMCLSimSiamLoss,
                P.AMCLBarlowTwinsLoss, P.MarginContrastiveLoss, P.TripletLoss, P.NCELoss):
        for name, bad in _checked_keywords(cls):
            yield pytest.param(cls, name, bad, id=f"{cls.__name__}-{name}-{bad}")


@pytest.mark.parametrize("cls, name, bad", list(_module_cases()))
def test_module_errors_start_with_the_bad_argument(cls, name, bad):
    needs_net = "temperature_net" in inspect.signature(cls).parameters
    args = (_net(),) if needs_net else ()
    with pytest.raises((ValueError, TypeError), match=rf"^{re.escape(name)} must "):
        cls(*args, **{name: bad})


def _functional_cases():
    x = _x()
    for fn, call in (
        (F.info_nce, lambda **k: F.info_nce(x[0], x[1], **k)),
        (F.dcl, lambda **k: F.dcl(x[0], x[1], **k)),
        (F.flat_nce, lambda **k: F.flat_nce(x[0], x[1], **k)),
        (F.dual_temperature, lambda **k: F.dual_temperature(x[0], x[1], **k)),
        (F.macl, lambda **k: F.macl(x[0], x[1], **k)),
        (F.dystress, lambda **k: F.dystress(x[0], x[1], **k)),
        (F.temperature_schedule, lambda **k: F.temperature_schedule(x[0], x[1], **k)),
        (F.learnable_temperature,
         lambda **k: F.learnable_temperature(x[0], x[1], **{"logit_scale": torch.tensor(2.0), **k})),
        (F.ascl, lambda **k: F.ascl(x[0], x[1], negatives=x[4], **k)),
        (F.ascl_byol, lambda **k: F.ascl_byol(x[0], x[1], **k)),
        (F.amcl, lambda **k: F.amcl(x[0], x[1], _net(), **k)),
        (F.amcl_simsiam, lambda **k: F.amcl_simsiam(*x[:4], _net(), **k)),
        (F.amcl_barlow_twins, lambda **k: F.amcl_barlow_twins(x[0], x[1], _net(), **k)),
        (F.margin_contrastive, lambda **k: F.margin_contrastive(x[0], x[1], **k)),
        (F.triplet, lambda **k: F.triplet(x[0], x[1], **k)),
        (F.nce, lambda **k: F.nce(x[0], x[1], **k)),
    ):
        for name, bad in _checked_keywords(fn):
            if name in ("z0", "z1", "p0", "p1", "predictions", "targets"):
                continue
            yield pytest.param(call, name, bad, id=f"{fn.__name__}-{name}-{bad}")


@pytest.mark.parametrize("call, name, bad", list(_functional_cases()))
def test_functional_errors_start_with_the_bad_argument(call, name, bad):
    with pytest.raises((ValueError, TypeError), match=rf"^{re.escape(name)} must "):
        call(**{name: bad})


def _simsiam_and_barlow_inputs():
    x = _x()
    yield "AMCLSimSiamLoss", ("p0", "p1", "z0", "z1"), lambda *t: P.AMCLSimSiamLoss(_net())(*t), x[:4]
    yield "AMCLBarlowTwinsLoss", ("z0", "z1"), lambda *t: P.AMCLBarlowTwinsLoss(_net())(*t), x[:2]


@pytest.mark.parametrize("case", list(_simsiam_and_barlow_inputs()), ids=lambda c: c[0])
def test_simsiam_and_barlow_twins_name_the_bad_input(case):
    _, names, call, x = case
    for i, name in enumerate(names):
        bad = list(x)
        bad[i] = bad[i].clone()
        bad[i][1, 2] = math.inf
        with pytest.raises(ValueError, match=rf"^{name} contains NaN or inf"):
            call(*bad)
        bad[i] = x[i][0]  # one dimension
        with pytest.raises(ValueError, match=rf"^{name} must have shape "):
            call(*bad)
    with pytest.raises(ValueError, match=rf"^{', '.join(names[:-1])} and {names[-1]} must have "
                                         r"the same shape"):
        call(*x[:-1], x[-1][:-1])


# --------------------------------------------------------------------------------------------
# Mixed dtypes, repr, helpers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(LOSSES))
def test_mixed_float32_and_float64_inputs_are_computed_in_float64(name):
    case = LOSSES[name]
    loss_fn = case.build(tile_size=None, reduction="mean")
    if any(True for _ in loss_fn.parameters()):
        loss_fn.double()
    inputs = [t.detach() for t in case.inputs(seed=43, dtype=D64)]
    for i in range(len(inputs)):  # each input in float32 in turn
        x = list(inputs)
        x[i] = x[i].float()
        got = loss_fn(*x)
        assert got.dtype == D64, (name, i)
        want = loss_fn(*[t.double() for t in x])
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=f"{name}: input {i}")


def test_repr_shows_a_non_default_reduction_only():
    assert "reduction" not in repr(P.InfoNCELoss())
    assert "reduction='sum'" in repr(P.InfoNCELoss(reduction="sum"))
    assert "tile_size" not in repr(P.MACLLoss())
    assert "tile_size=64" in repr(P.MACLLoss(tile_size=64))


def test_materialised_bytes_of_one_similarity_matrix():
    assert materialised_bytes(3, 5) == 60
    assert materialised_bytes(3, 5, torch.float64) == 120
    assert materialised_bytes(65_536 * 2, 65_536 * 2) == 64 * 2**30


def test_w_statistics_values():
    w = torch.tensor([0.1, 0.4, 0.5, 0.9])
    stats = P.w_statistics(w)
    assert stats["mean"] == pytest.approx(0.475)
    assert stats["std"] == pytest.approx(torch.tensor([0.1, 0.4, 0.5, 0.9]).std().item())
    assert stats["min"] == pytest.approx(0.1) and stats["max"] == pytest.approx(0.9)
    assert stats["frac_below_half"] == 0.5  # 0.5 itself is not below half
    assert P.w_statistics(torch.tensor([0.3]))["std"] == 0.0


def test_more_constructors_name_the_bad_argument():
    cases = [
        (lambda: P.PairTemperature(8, eta=0.0), "eta"),
        (lambda: P.PairTemperature(8, iota=-1.0), "iota"),
        (lambda: P.PairTemperature(8, clamp=math.nan), "clamp"),
        (lambda: P.PairTemperature(0), "dim"),
        (lambda: P.ConstantTemperature(0.0), "temperature"),
        (lambda: P.MultiHeadProjection(0, 4, 4), "input_dim"),
        (lambda: P.MultiHeadProjection(4, 0, 4), "hidden_dim"),
        (lambda: P.MultiHeadProjection(4, 4, 0), "output_dim"),
        (lambda: P.MultiHeadProjection(4, 4, 4, num_heads=0), "num_heads"),
        (lambda: P.MultiHeadProjection(4, 4, 4, num_layers=0), "num_layers"),
        (lambda: P.MACLLoss(temperature_form="exp", alpha=0.0), "alpha"),
        (lambda: F.macl(*_x()[:2], temperature_form="exp", alpha=0.0), "alpha"),
    ]
    for make, name in cases:
        with pytest.raises((ValueError, TypeError), match=rf"^{name} must "):
            make()
    with pytest.raises(ValueError, match=r"^reweight=True needs positive_in_denominator=True: "
                                         r".* pass reweight=False$"):
        P.MACLLoss(positive_in_denominator=False)


def test_smallest_valid_sizes_are_accepted():
    heads = P.MultiHeadProjection(1, 1, 1, num_heads=1, num_layers=1)
    assert heads(torch.randn(2, 1)).shape == (1, 2, 1)
    assert P.MultiHeadProjection(3, 1, 2, num_layers=2)(torch.randn(4, 3)).shape == (2, 4, 2)
    assert P.PairTemperature(1).dim == 1


@pytest.mark.parametrize("form, count", [("cross_view_symmetric", 2), ("nt_xent", 2),
                                         ("cross_view", 1)])
def test_one_pair_gives_one_zero_per_direction(form, count):
    """No negatives in any direction: every direction still contributes its anchors (0 each)."""
    z0, z1 = (torch.randn(1, DIM, dtype=D64, requires_grad=True) for _ in range(2))
    for loss_fn in (P.InfoNCELoss(form=form, reduction="none"),
                    P.MACLLoss(form=form, reduction="none"),
                    P.FlatNCELoss(form=form, reduction="none")):
        out = loss_fn(z0, z1)
        assert out.shape == (count,) and (out == 0).all()


def test_in_process_single_rank_group_gathers_nothing_new(tmp_path, monkeypatch):
    """A one-process gloo group: ``is_distributed`` is False (world size 1), the helpers return
    their inputs, and ``gather_distributed=True`` equals the local loss; without a group the
    world size is 1 and the rank 0."""
    import torch.distributed as dist

    from adaptcl.plugins import distributed as D

    assert (D.world_size(), D.rank(), D.is_distributed()) == (1, 0, False)
    x = torch.randn(3, 4)
    assert D.gather_with_grad(x)[0] is x and D.all_reduce_mean(x) is x
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/init", rank=0, world_size=1)
    try:
        out = D._GatherWithGrad.apply(x.requires_grad_())
        assert len(out) == 1
        torch.testing.assert_close(out[0], x)
        (g,) = torch.autograd.grad(out[0].sum() * 2, x)
        torch.testing.assert_close(g, torch.full_like(x, 2.0))
        z0, z1 = (torch.randn(4, DIM) for _ in range(2))
        torch.testing.assert_close(P.MACLLoss(gather_distributed=True)(z0, z1),
                                   P.MACLLoss()(z0, z1))
        monkeypatch.setattr(D, "is_distributed", lambda: True)  # take the all_gather path
        gathered = D.gather_with_grad(x)
        assert isinstance(gathered, list) and len(gathered) == 1
        torch.testing.assert_close(gathered[0], x)
        torch.testing.assert_close(D.all_reduce_mean(x), x)
        assert (D.world_size(), D.rank()) == (1, 0)
    finally:
        dist.destroy_process_group()


def test_bound_tracking_reads_the_counter_once_per_window():
    """``bound_warning_steps=2``, temperatures inside the bounds: one host read every second
    step, none in between (a read per step would synchronise every step)."""
    from .test_devices import HostSyncDetector

    net = seeded(8, lambda: P.PairTemperature(DIM))
    loss_fn = P.AMCLLoss(net, 1e-3, bound_warning_steps=2, check_finite=False)
    z0, z1 = (torch.randn(6, DIM) for _ in range(2))
    reads = []
    for _ in range(6):
        with HostSyncDetector() as detector:
            loss_fn(z0, z1)
        reads.append(len(detector.calls))
    assert reads == [0, 1, 0, 1, 0, 1]


def test_top_k_threshold_path_stays_on_the_device_of_its_inputs():
    """k beyond the argmax rounds (AMCL's kappa = 100 of the paper): on ``meta`` a tensor made on
    the CPU inside the selection fails loudly."""
    from adaptcl.plugins.tiles._loop import top_columns

    values = torch.randn(3, 12, device="meta")
    cols = torch.arange(12, device="meta").expand(3, -1)
    v, c = top_columns(values, cols, 9)
    assert v.device.type == c.device.type == "meta" and c.shape == (3, 9)


@pytest.mark.parametrize("name", list(LOSSES))
def test_a_fresh_module_has_empty_last_stats(name):
    assert LOSSES[name].build(tile_size=None, reduction="mean").last_stats == {}


def test_build_candidates_defaults_and_errors():
    a, b = _x()[:2]
    (default,) = P.build_candidates(a, b)
    (explicit,) = P.build_candidates(a, b, "nt_xent")
    assert default.anchors.shape[0] == 2 * a.shape[0]
    torch.testing.assert_close(default.keys, explicit.keys)
    with pytest.raises(ValueError, match=r"^form must be one of"):
        P.build_candidates(a, b, "no-such-form")
    with pytest.raises(ValueError, match=r"^z0 and z1 are empty: the batch needs at least one pair$"):
        P.build_candidates(a[:0], b[:0])


def test_simsiam_and_barlow_twins_on_the_meta_device():
    x = [t.detach().to("meta").requires_grad_() for t in _x()[:4]]
    for loss_fn, args in ((P.AMCLSimSiamLoss(seeded(3, lambda: P.PairTemperature(DIM))), x),
                          (P.AMCLBarlowTwinsLoss(seeded(3, lambda: P.PairTemperature(DIM))),
                           x[:2])):
        loss = loss_fn.to("meta")(*args)
        loss.backward()
        assert loss.device.type == "meta" and args[0].grad.device.type == "meta"


@pytest.mark.parametrize("form", ["nt_xent", "cross_view", "cross_view_symmetric"])
def test_second_rank_of_a_two_rank_gather_sees_the_global_batch(form, monkeypatch):
    """Rank 1 of two, in one process: a gather that returns the other rank's rows first. Each
    local anchor's loss must be the loss of the same anchor in the global batch (its positive
    and itself at the offset of rank 1), with ``gather_fn=`` and with ``gather_distributed=True``
    (the library's own gather, here patched)."""
    from adaptcl.plugins import distributed as D

    def other(x):  # the other rank's rows: unit vectors too
        return x.roll(1, dims=1).flip(0)

    def gather(x):
        return [other(x), x]

    monkeypatch.setattr(D, "rank", lambda: 1)
    g = torch.Generator().manual_seed(44)
    z0, z1 = (torch.randn(3, DIM, generator=g, dtype=D64) for _ in range(2))
    a0, a1 = (x / x.norm(dim=1, keepdim=True) for x in (z0, z1))
    global_loss = P.InfoNCELoss(0.3, form=form, reduction="none")(
        torch.cat([other(a0), a0]), torch.cat([other(a1), a1]))
    n = 3
    if form == "nt_xent":  # anchors [z0 global; z1 global]: rank 1 holds rows n..2n of each
        want = torch.cat([global_loss[n:2 * n], global_loss[3 * n:]])
    elif form == "cross_view":
        want = global_loss[n:]
    else:
        want = torch.cat([global_loss[n:2 * n], global_loss[3 * n:]])
    got = P.InfoNCELoss(0.3, form=form, reduction="none", gather_fn=gather)(z0, z1)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(D, "is_distributed", lambda: True)
    monkeypatch.setattr(D, "gather_with_grad", gather)
    got = F.info_nce(z0, z1, 0.3, form=form, reduction="none", gather_distributed=True)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("make", [lambda t: P.TripletLoss(tile_size=t),
                                  lambda t: P.MarginContrastiveLoss(tile_size=t),
                                  lambda t: P.NCELoss(tile_size=t)],
                         ids=["triplet", "margin", "nce"])
def test_survey_losses_hold_one_row_block_at_a_time(make):
    """With ``tile_size`` the survey losses run ``tile_size`` anchors at a time: no tensor
    beyond a ``[tile, N]`` block (the materialised path holds ``[N, N]``)."""
    from .test_tiled import _LargestTensor

    n, tile = 64, 4
    z0, z1 = (torch.randn(n, 4, requires_grad=True) for _ in range(2))
    with _LargestTensor() as probe:
        make(tile)(z0, z1).backward()
    assert probe.largest <= tile * n, probe.largest
    with _LargestTensor() as full:
        make(None)(z0, z1).backward()
    assert full.largest >= n * n


def test_row_logsumexp_leaves_its_input_alone_by_default():
    from adaptcl.plugins.kernel import row_logsumexp

    x = torch.randn(4, 6)
    before = x.clone()
    torch.testing.assert_close(row_logsumexp(x), torch.logsumexp(before, dim=1))
    torch.testing.assert_close(x, before, rtol=0, atol=0)
    row_logsumexp(x, inplace=True)
    assert not torch.equal(x, before)  # documented: the input becomes the backward buffer


def test_constant_temperature_keeps_the_inputs_dtype():
    """AMCL with a fixed temperature in float64: the temperature, the loss and its statistic
    exactly as InfoNCE's -s_pos / tau + logsumexp_n s_n / tau (beta = 0)."""
    z0, z1 = _x()[:2]
    loss_fn = P.AMCLLoss(P.ConstantTemperature(0.3), 0.0, form="cross_view")
    loss = loss_fn(z0, z1)
    assert loss_fn.last_stats["temperature"].dtype == D64
    assert loss_fn.last_stats["temperature"].item() == 0.3
    a, b = (x / x.norm(dim=1, keepdim=True) for x in (z0, z1))
    logits = a @ b.T / 0.3
    eye = torch.eye(5, dtype=torch.bool)
    expected = (-logits.diagonal() + torch.logsumexp(logits.masked_fill(eye, -math.inf), 1)).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-14, atol=0)


def test_bound_tracking_on_the_meta_device_reads_nothing():
    x = [t.to("meta").requires_grad_() for t in _x()[:2]]
    loss_fn = P.AMCLLoss(seeded(3, lambda: P.PairTemperature(DIM)), bound_warning_steps=1).to("meta")
    loss_fn.train()
    for _ in range(2):
        loss_fn(*x).backward()  # a host read of a meta tensor would raise


def test_more_inputs_named_in_errors():
    x = _x()
    with pytest.raises(ValueError, match=r"^z0 must have shape \[batch, dim\] or \[heads, batch, dim\]"):
        P.AMCLLoss(_net())(x[0][0], x[1])
    with pytest.raises(ValueError, match=r"^Barlow Twins needs a batch of at least 2 to standardise "
                                         r"features$"):
        P.AMCLBarlowTwinsLoss(_net())(x[0][:1], x[1][:1])
    with pytest.raises(ValueError, match=r"^ASCLBYOLLoss takes no negatives"):
        P.ASCLBYOLLoss()(x[0], x[1], x[4])
    from adaptcl.plugins.candidates import scaled_anchors

    (c,) = P.build_candidates(x[0], x[1], "cross_view")
    with pytest.raises(ValueError, match=r"^temperature must be a scalar or have shape \[anchors\], "
                                         r"got \(5, 1\)$"):
        scaled_anchors(c, torch.ones(5, 1))


def test_a_subclass_gets_the_documented_shared_defaults():
    class Plain(P.ContrastiveLoss):
        def __init__(self):
            super().__init__(form="cross_view")

        def compute(self, z0, z1, negatives):
            (c,) = self.candidates(z0, z1, negatives)
            return 1 - c.positive_sim, {}

    loss_fn = Plain()
    assert (loss_fn.reduction, loss_fn.tile_size, loss_fn.gather_distributed,
            loss_fn.check_finite) == ("mean", "auto", False, True)
    z0, z1 = _x()[:2]
    torch.testing.assert_close(loss_fn(z0, z1), (1 - (F_normalize(z0) * F_normalize(z1)).sum(1)).mean())


def F_normalize(x):
    return x / x.norm(dim=1, keepdim=True)


def _patch_two_ranks(monkeypatch):
    """A two-rank run seen from rank 1 in one process (the other rank's rows made up)."""
    from adaptcl.plugins import distributed as D

    def gather(x):
        return [x.roll(1, dims=1).flip(0), x]

    monkeypatch.setattr(D, "is_distributed", lambda: True)
    monkeypatch.setattr(D, "rank", lambda: 1)
    monkeypatch.setattr(D, "gather_with_grad", gather)
    monkeypatch.setattr(D, "all_reduce_mean", lambda x: x)
    return gather


@pytest.mark.parametrize("name", list(LOSSES))
def test_no_loss_gathers_unless_asked(name, monkeypatch):
    """In a distributed run every loss keeps to its local batch by default: the defaults of the
    modules and of the shared keywords never gather."""
    case = LOSSES[name]
    x = case.inputs(seed=45, dtype=D64)
    local = _build_table_loss(case)(*x)
    _patch_two_ranks(monkeypatch)
    torch.testing.assert_close(_build_table_loss(case)(*x), local, rtol=0, atol=0)
    for functional, args in ((F.nce, x[:2]), (F.triplet, x[:2]), (F.margin_contrastive, x[:2]),
                             (F.info_nce, x[:2]), (F.macl, x[:2])):
        monkeypatch.undo()
        before = functional(*args)
        _patch_two_ranks(monkeypatch)
        torch.testing.assert_close(functional(*args), before, rtol=0, atol=0)


def _build_table_loss(case):
    loss_fn = case.build(tile_size=None, reduction="mean")
    return loss_fn.double() if any(True for _ in loss_fn.parameters()) else loss_fn


def test_modules_gather_when_asked(monkeypatch):
    z0, z1 = _x()[:2]
    local = P.InfoNCELoss(0.3, reduction="none")(z0, z1)
    _patch_two_ranks(monkeypatch)
    gathered = P.InfoNCELoss(0.3, reduction="none", gather_distributed=True)(z0, z1)
    assert gathered.shape == local.shape and not torch.allclose(gathered, local)
    torch.testing.assert_close(
        gathered, F.info_nce(z0, z1, 0.3, reduction="none", gather_distributed=True),
        rtol=1e-12, atol=1e-12)
