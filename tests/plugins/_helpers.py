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


# --------------------------------------------------------------------------------------------
# One table of every loss of ``adaptcl.plugins`` (the property tests and the ``last_stats``
# checks iterate over it; add a loss here and it is covered by both).
# --------------------------------------------------------------------------------------------

DIM = 8
"""Feature dimension of the inputs the table's losses are built for (AMCL's networks)."""


def seeded(seed: int, build):
    """``build()`` under a fixed torch seed, without touching the global generator."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return build()


class LossCase:
    """How to build and call one loss of the table.

    ``kind``: ``"pair"`` (``loss(z0, z1)``), ``"queue"`` (``loss(z0, z1, negatives)``),
    ``"simsiam"`` (``loss(p0, p1, z0, z1)``) or ``"barlow"`` (``loss(z0, z1)``, one scalar).
    ``make(tile_size=..., reduction=...)`` builds a fresh module (AMCL's networks from a fixed
    seed). ``symmetric``: the value does not change when the two views are swapped.
    ``tileable``: takes ``tile_size``. ``per_anchor``: takes ``reduction``.
    """

    def __init__(self, make, kind: str = "pair", *, symmetric: bool = False,
                 tileable: bool = True, per_anchor: bool = True) -> None:
        self.make, self.kind, self.symmetric = make, kind, symmetric
        self.tileable, self.per_anchor = tileable, per_anchor

    def inputs(self, n: int = 6, *, seed: int = 0, dtype=torch.float32, k: int = 5):
        """Leaf tensors for one call: two views (four for SimSiam, plus a queue of ``k``)."""
        g = torch.Generator().manual_seed(seed)
        count = {"pair": 2, "queue": 3, "simsiam": 4, "barlow": 2}[self.kind]
        rows = [n] * count
        if self.kind == "queue":
            rows[2] = k
        return tuple(torch.randn(r, DIM, generator=g, dtype=dtype).requires_grad_() for r in rows)

    def build(self, **kw):
        if not self.tileable:
            kw.pop("tile_size", None)
        if not self.per_anchor:
            kw.pop("reduction", None)
        return self.make(**kw)


def _amcl(seed: int, **options):
    def make(**kw):
        from adaptcl.plugins import AMCLLoss, PairTemperature
        return AMCLLoss(seeded(seed, lambda: PairTemperature(DIM)), **options, **kw)
    return make


def _loss_table() -> dict[str, LossCase]:
    from adaptcl.plugins import (
        AMCLBarlowTwinsLoss,
        AMCLSimSiamLoss,
        ASCLBYOLLoss,
        ASCLLoss,
        DCLLoss,
        DualTemperatureLoss,
        FlatNCELoss,
        InfoNCELoss,
        MACLLoss,
        MarginContrastiveLoss,
        NCELoss,
        PairTemperature,
        TripletLoss,
    )

    def simsiam(**kw):
        return AMCLSimSiamLoss(seeded(11, lambda: PairTemperature(DIM)), beta=1e-2, **kw)

    def barlow(**kw):
        return AMCLBarlowTwinsLoss(seeded(12, lambda: PairTemperature(DIM)), beta=1e-3,
                                   lambda_param=0.05)

    return {
        "infonce": LossCase(lambda **kw: InfoNCELoss(0.2, **kw), symmetric=True),
        "infonce_cross_view": LossCase(lambda **kw: InfoNCELoss(0.2, form="cross_view", **kw)),
        "infonce_symmetric": LossCase(
            lambda **kw: InfoNCELoss(0.2, form="cross_view_symmetric", **kw), symmetric=True),
        "infonce_queue": LossCase(lambda **kw: InfoNCELoss(0.2, form="queue", **kw), "queue"),
        "dcl": LossCase(lambda **kw: DCLLoss(0.2, **kw), symmetric=True),
        "flatnce": LossCase(lambda **kw: FlatNCELoss(0.2, **kw), symmetric=True),
        "dual": LossCase(lambda **kw: DualTemperatureLoss(0.2, 1.0, **kw), symmetric=True),
        "macl": LossCase(lambda **kw: MACLLoss(0.2, 0.5, 0.1, **kw), symmetric=True),
        "macl_wprime_symmetric": LossCase(
            lambda **kw: MACLLoss(0.2, 0.5, weight_form="w_prime", form="cross_view_symmetric",
                                  **kw), symmetric=True),
        "macl_exp_dcl": LossCase(lambda **kw: MACLLoss(0.2, 2.0, temperature_form="exp",
                                                       reweight=False,
                                                       positive_in_denominator=False, **kw),
                                 symmetric=True),
        "macl_queue": LossCase(lambda **kw: MACLLoss(0.2, 0.5, 0.2, form="queue", **kw), "queue"),
        "ascl_queue": LossCase(lambda **kw: ASCLLoss(0.2, 0.1, 2, "ascl", **kw), "queue"),
        "ahcl_queue": LossCase(lambda **kw: ASCLLoss(0.2, 0.1, 2, "ahcl", **kw), "queue"),
        "hard_queue": LossCase(lambda **kw: ASCLLoss(0.2, 0.1, 2, "hard", **kw), "queue"),
        "ascl_in_batch": LossCase(lambda **kw: ASCLLoss(0.2, 0.1, 1, form="cross_view", **kw)),
        "ascl_byol": LossCase(lambda **kw: ASCLBYOLLoss(0.1, 1, **kw)),
        "amcl_softmax": LossCase(_amcl(1, beta=1e-2), symmetric=True),
        "amcl_softmax_infonce": LossCase(_amcl(2, beta=1e-2, objective="infonce"),
                                         symmetric=True),
        "amcl_topk": LossCase(_amcl(3, beta=1e-2, negative_term="topk", kappa=2),
                              symmetric=True),
        "amcl_queue": LossCase(_amcl(4, beta=1e-2, form="queue"), "queue"),
        "amcl_simsiam": LossCase(simsiam, "simsiam", symmetric=True, tileable=False),
        "amcl_barlow_twins": LossCase(barlow, "barlow", symmetric=True, tileable=False,
                                      per_anchor=False),
        "margin": LossCase(lambda **kw: MarginContrastiveLoss(1.0, **kw)),
        "margin_symmetric": LossCase(
            lambda **kw: MarginContrastiveLoss(1.0, form="cross_view_symmetric", **kw),
            symmetric=True),
        "triplet": LossCase(lambda **kw: TripletLoss(0.5, **kw)),
        "triplet_hardest": LossCase(lambda **kw: TripletLoss(0.5, mining="hardest", **kw)),
        "nce": LossCase(lambda **kw: NCELoss(0.2, **kw)),
        "nce_nt_xent": LossCase(lambda **kw: NCELoss(0.2, form="nt_xent", **kw), symmetric=True),
    }


LOSSES: dict[str, LossCase] = _loss_table()
