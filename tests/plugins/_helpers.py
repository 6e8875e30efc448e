"""Small utilities shared by the core tests."""

from __future__ import annotations

import math

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


# --------------------------------------------------------------------------------------------
# One table of every loss of ``adaptcl.plugins``, in every configuration a test needs. Every
# file that runs "each loss" takes its cases from here (``names(...)`` selects by capability);
# add a loss or a configuration here and every such test covers it.
# --------------------------------------------------------------------------------------------

DIM = 8
"""Default feature dimension of the inputs (AMCL's networks are built for ``dim``)."""

KINDS = {"pair": 2, "queue": 3, "simsiam": 4, "barlow": 2}
SHARED = ("tile_size", "reduction", "check_finite", "gather_distributed", "gather_fn")


def seeded(seed: int, build):
    """``build()`` under a fixed torch seed, without touching the global generator."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return build()


class LossCase:
    """How to build and call one loss of the table.

    ``spec(t, d)`` returns ``(cls, args, kwargs)`` of the module at temperature ``t`` (the case's
    ``temperature`` unless overridden; ignored by losses without one) for ``d``-dimensional
    inputs (AMCL's networks, seeded: every build is the same network).

    ``kind``: ``"pair"`` (``loss(z0, z1)``), ``"queue"`` (``loss(z0, z1, negatives)``),
    ``"simsiam"`` (``loss(p0, p1, z0, z1)``) or ``"barlow"`` (``loss(z0, z1)``, one scalar).
    ``symmetric``: the value does not change when the two views are swapped. ``tileable``: takes
    ``tile_size``. ``per_anchor``: takes ``reduction``. ``shared``: takes every shared keyword
    (``gather_distributed``, ``gather_fn``, ``check_finite``, ``tile_size``, ``reduction``).
    ``top_k``: selects a top-K of candidates (ties may be picked in any order).
    ``exact_grad``: nothing is detached, so finite differences check its gradient.
    """

    def __init__(self, spec, kind: str = "pair", *, temperature: float = 0.2,
                 symmetric: bool = False, tileable: bool = True, per_anchor: bool = True,
                 shared: bool = True, top_k: bool = False, exact_grad: bool = False,
                 functional_spec=None) -> None:
        self.spec, self.kind, self.temperature = spec, kind, temperature
        # ``functional_spec(t, d) -> (function, args, kwargs)`` where the functional form's
        # arguments are not the module's (the learnable temperature takes its parameter)
        self.functional_spec = functional_spec
        self.symmetric, self.tileable, self.per_anchor = symmetric, tileable, per_anchor
        self.shared, self.top_k, self.exact_grad = shared, top_k, exact_grad

    def inputs(self, n: int = 6, *, seed: int = 0, dtype=torch.float32, k: int = 5,
               dim: int = DIM, device="cpu"):
        """Leaf tensors for one call: two views (four for SimSiam, plus a queue of ``k``)."""
        g = torch.Generator().manual_seed(seed)
        rows = [n] * KINDS[self.kind]
        if self.kind == "queue":
            rows[2] = k
        return tuple(torch.randn(r, dim, generator=g, dtype=dtype).to(device).requires_grad_()
                     for r in rows)

    def _keywords(self, kw: dict) -> dict:
        kw = dict(kw)
        if not self.tileable:
            kw.pop("tile_size", None)
        if not self.per_anchor:
            kw.pop("reduction", None)
        if not self.shared:
            kw.pop("gather_distributed", None)
            kw.pop("gather_fn", None)
        return kw

    def build(self, *, temperature: float | None = None, dim: int = DIM, **kw):
        """A fresh module; ``kw`` are shared keywords (those the loss does not take are dropped)."""
        cls, args, kwargs = self.spec(self.temperature if temperature is None else temperature, dim)
        return cls(*args, **kwargs, **self._keywords(kw))

    def functional(self, *inputs, temperature: float | None = None, dim: int = DIM, **kw):
        """The functional form of the same configuration on the same inputs."""
        from adaptcl.plugins import functional as F

        t = self.temperature if temperature is None else temperature
        if self.functional_spec is not None:
            fn, args, kwargs = self.functional_spec(t, dim)
        else:
            cls, args, kwargs = self.spec(t, dim)
            fn = getattr(F, FUNCTIONAL[cls.__name__])
        if self.kind == "queue":
            kw["negatives"] = inputs[2]
            inputs = inputs[:2]
        return fn(*inputs, *args, **kwargs, **self._keywords(kw))


FUNCTIONAL = {"InfoNCELoss": "info_nce", "DCLLoss": "dcl", "FlatNCELoss": "flat_nce",
              "DualTemperatureLoss": "dual_temperature", "MACLLoss": "macl",
              "DySTreSSLoss": "dystress", "ASCLLoss": "ascl",
              "ASCLBYOLLoss": "ascl_byol", "AMCLLoss": "amcl", "AMCLSimSiamLoss": "amcl_simsiam",
              "AMCLBarlowTwinsLoss": "amcl_barlow_twins",
              "TemperatureScheduleLoss": "temperature_schedule",
              "MarginContrastiveLoss": "margin_contrastive", "TripletLoss": "triplet",
              "NCELoss": "nce"}


def _loss_table() -> dict[str, LossCase]:
    import adaptcl.plugins as P

    def case(cls, *args, kind="pair", **flags_and_kwargs):
        flags = {k: flags_and_kwargs.pop(k) for k in list(flags_and_kwargs)
                 if k in ("temperature", "symmetric", "tileable", "per_anchor", "shared", "top_k",
                          "exact_grad")}
        kwargs = flags_and_kwargs

        def spec(t, d):  # "T" in args stands for the temperature, "T/2" for half of it
            values = tuple(t if a == "T" else t / 2 if a == "T/2" else a for a in args)
            return cls, values, kwargs
        return LossCase(spec, kind, **flags)

    def amcl(seed, kind="pair", **options):
        flags = {k: options.pop(k) for k in list(options) if k in ("symmetric", "top_k", "exact_grad")}

        def spec(t, d):
            return P.AMCLLoss, (seeded(seed, lambda: P.PairTemperature(d)),), options
        return LossCase(spec, kind, **flags)

    def amcl_constant(**options):
        flags = {k: options.pop(k) for k in list(options) if k in ("symmetric", "top_k", "exact_grad")}

        def spec(t, d):
            return P.AMCLLoss, (P.ConstantTemperature(t),), options
        return LossCase(spec, **flags)

    def simsiam(t, d):
        return P.AMCLSimSiamLoss, (seeded(11, lambda: P.PairTemperature(d)),), {"beta": 1e-2}

    def barlow(t, d):
        return (P.AMCLBarlowTwinsLoss, (seeded(12, lambda: P.PairTemperature(d)),),
                {"beta": 1e-3, "lambda_param": 0.05})

    def learnable(**options):
        flags = {k: options.pop(k) for k in list(options) if k in ("symmetric", "exact_grad")}

        def spec(t, d):
            return P.LearnableTemperatureLoss, (t,), options

        def functional_spec(t, d):  # the module's initial parameter, passed in
            return P.learnable_temperature, (torch.tensor(math.log(1 / t)),), options
        return LossCase(spec, functional_spec=functional_spec, **flags)

    sym, exact = {"symmetric": True}, {"exact_grad": True}
    return {
        "infonce": case(P.InfoNCELoss, "T", **sym, **exact),
        "infonce_cross_view": case(P.InfoNCELoss, "T", form="cross_view", **exact),
        "infonce_symmetric": case(P.InfoNCELoss, "T", form="cross_view_symmetric", **sym, **exact),
        "infonce_queue": case(P.InfoNCELoss, "T", kind="queue", form="queue", **exact),
        "dcl": case(P.DCLLoss, "T", **sym, **exact),
        "dcl_cross_view": case(P.DCLLoss, "T", form="cross_view", **exact),
        "flatnce": case(P.FlatNCELoss, "T", **sym),
        "dual": case(P.DualTemperatureLoss, "T", 1.0, **sym),
        "macl": case(P.MACLLoss, "T", 0.5, 0.1, **sym),
        "macl_plain": case(P.MACLLoss, "T", 0.0, reweight=False, **exact),
        "macl_fixed": case(P.MACLLoss, "T", adaptive=False),
        "macl_cross_view": case(P.MACLLoss, "T", 0.5, form="cross_view"),
        "macl_wprime": case(P.MACLLoss, "T", 0.5, weight_form="w_prime"),
        "macl_wprime_symmetric": case(P.MACLLoss, "T", 0.5, weight_form="w_prime",
                                      form="cross_view_symmetric", **sym),
        "macl_exp": case(P.MACLLoss, "T", 2.0, temperature_form="exp"),
        "macl_exp_wprime": case(P.MACLLoss, "T", 2.0, temperature_form="exp",
                                weight_form="w_prime"),
        "macl_exp_dcl": case(P.MACLLoss, "T", 2.0, temperature_form="exp", reweight=False,
                             positive_in_denominator=False, **sym),
        # the SimCSE setting; the floor is 0.01 (its default tau0 / 10 = 0.005 puts logits at
        # 200, where float32 rounding alone is ~2e-5, materialised or tiled)
        "macl_simcse": case(P.MACLLoss, "T", 2.0, 0.8, reweight=False, form="cross_view",
                            min_temperature=0.01, temperature=0.05),
        "macl_queue": case(P.MACLLoss, "T", 0.5, 0.2, kind="queue", form="queue"),
        # DySTreSS: tau in [T/2, T]; with the temperature detached (the authors' NT-Xent code)
        # and not (their DCL code, every gradient exact)
        "dystress": case(P.DySTreSSLoss, "T/2", "T", **sym),
        "dystress_exact": case(P.DySTreSSLoss, "T/2", "T", detach_temperature=False, **sym,
                               **exact),
        "dystress_piecewise": case(P.DySTreSSLoss, "T/2", "T", shape="piecewise",
                                   form="cross_view"),
        "dystress_graphcl": case(P.DySTreSSLoss, "T/2", "T", positive_in_denominator=False,
                                 detach_temperature=False, form="cross_view", **exact),
        "dystress_queue": case(P.DySTreSSLoss, "T/2", "T", kind="queue", form="queue"),
        "infonce_hardness": case(P.InfoNCELoss, "T", form="cross_view",
                                 hardness_mode="all_negatives", hardness_strength=2.0),
        "macl_hardness_queue": case(P.MACLLoss, "T", 0.5, kind="queue", form="queue",
                                    hardness_mode="in_batch_negatives", hardness_strength=3.0),
        # Kukleva et al.'s cosine schedule, at a step between its bounds (T/2 and T)
        "schedule": case(P.TemperatureScheduleLoss, "T/2", "T", 10, step=3, **sym, **exact),
        "schedule_graphcl": case(P.TemperatureScheduleLoss, "T/2", "T", 10, step=7,
                                 form="cross_view", positive_in_denominator=False, **exact),
        "schedule_queue": case(P.TemperatureScheduleLoss, "T/2", "T", 10, step=1, kind="queue",
                               form="queue", **exact),
        # CLIP's learned temperature (one parameter), in the table's forms
        "learnable": learnable(**sym, **exact),
        "learnable_clip": learnable(form="cross_view_symmetric", **sym, **exact),
        "learnable_dcl": learnable(form="cross_view", positive_in_denominator=False, **exact),
        "ascl_queue": case(P.ASCLLoss, "T", "T/2", 2, "ascl", kind="queue"),
        "ascl_hardness": case(P.ASCLLoss, "T", "T/2", 1, "ascl", form="cross_view",
                              hardness_mode="all_negatives", hardness_strength=1.0),
        "ahcl_queue": case(P.ASCLLoss, "T", "T/2", 2, "ahcl", kind="queue", top_k=True),
        "hard_queue": case(P.ASCLLoss, "T", "T/2", 2, "hard", kind="queue", top_k=True),
        "ascl_k0": case(P.ASCLLoss, "T", "T/2", 0, kind="queue"),
        "ascl_in_batch": case(P.ASCLLoss, "T", "T/2", 1, form="cross_view"),
        "ahcl_in_batch": case(P.ASCLLoss, "T", "T/2", 1, "ahcl", form="cross_view", top_k=True),
        "ascl_byol": case(P.ASCLBYOLLoss, 0.1, 1),
        "amcl_softmax": amcl(1, beta=1e-2, **sym, **exact),
        "amcl_softmax_infonce": amcl(2, beta=1e-2, objective="infonce", **sym, **exact),
        "amcl_topk": amcl(3, beta=1e-2, negative_term="topk", kappa=2, **sym, top_k=True),
        "amcl_topk_infonce": amcl(5, beta=1e-2, negative_term="topk", kappa=2,
                                  objective="infonce", top_k=True),
        "amcl_queue": amcl(4, "queue", beta=1e-2, form="queue", **exact),
        "amcl_constant": amcl_constant(beta=1e-2, **exact),
        "amcl_constant_topk": amcl_constant(beta=1e-2, negative_term="topk", kappa=2, top_k=True),
        "amcl_simsiam": LossCase(simsiam, "simsiam", symmetric=True, tileable=False, shared=False),
        "amcl_barlow_twins": LossCase(barlow, "barlow", symmetric=True, tileable=False,
                                      per_anchor=False, shared=False),
        "margin": case(P.MarginContrastiveLoss, 1.0, **exact),
        "margin_symmetric": case(P.MarginContrastiveLoss, 1.0, form="cross_view_symmetric", **sym),
        "triplet": case(P.TripletLoss, 0.5, **exact),
        "triplet_hardest": case(P.TripletLoss, 0.5, mining="hardest"),
        "nce": case(P.NCELoss, "T", **exact),
        "nce_nt_xent": case(P.NCELoss, "T", form="nt_xent", **sym),
        "nce_symmetric": case(P.NCELoss, "T", form="cross_view_symmetric", **sym),
    }


LOSSES: dict[str, LossCase] = _loss_table()


def names(**flags) -> list[str]:
    """The table's names whose flags equal ``flags`` (``kind=("pair", "queue")`` for any of
    several values), in table order: the parametrisation of every "each loss" test."""
    def keep(case: LossCase) -> bool:
        for flag, want in flags.items():
            have = getattr(case, flag)
            if isinstance(want, tuple) and have not in want or not isinstance(want, tuple) and have != want:
                return False
        return True
    return [name for name, case in LOSSES.items() if keep(case)]


def call(loss_fn, inputs):
    """``loss_fn`` on a table case's inputs (every kind takes them positionally)."""
    return loss_fn(*inputs)
