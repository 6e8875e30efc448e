"""AMCL without negatives: the SimSiam form (Table 2.2) and the Barlow Twins form (Table 2.3).

Reference:
    Wang, Koniusz et al., "Adaptive Multi-head Contrastive Learning", ECCV 2024
    (arXiv:2310.05615), Table 2.

Both take ``[C, N, D]`` (or ``[N, D]`` for one head) and sum the per-head losses, with the
pair temperatures of a :class:`~adaptcl.plugins.PairTemperature` and the regulariser
:func:`~adaptcl.plugins.omega` as in :class:`~adaptcl.plugins.AMCLLoss`. The modules keep
``last_stats`` (``loss``, ``temperature``: the mean positive pair temperature) like every loss.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .amcl_temperature import omega
from .base import REDUCTIONS, Loss, Reduction, Stats, loss_stats, reduce
from .candidates import autocast_off, compute_dtype, normalize
from .heads import as_heads
from .validation import check_bool, check_choice, check_embedding_tensor, check_non_negative


def _amcl_simsiam(p0: Tensor, p1: Tensor, z0: Tensor, z1: Tensor, net: nn.Module, beta: float,
                  check_finite: bool) -> tuple[Tensor, Stats]:
    p0, p1, z0, z1 = (as_heads(n, t) for n, t in zip(("p0", "p1", "z0", "z1"), (p0, p1, z0, z1), strict=True))
    if not p0.shape == p1.shape == z0.shape == z1.shape:
        raise ValueError("p0, p1, z0 and z1 must have the same shape")
    dim = p0.shape[-1]
    total, taus = 0.0, []
    for h in range(p0.shape[0]):
        for name, t in (("p0", p0[h]), ("p1", p1[h]), ("z0", z0[h]), ("z1", z1[h])):
            check_embedding_tensor(name, t, check_finite=check_finite)
        dtype = compute_dtype(p0[h], p1[h], z0[h], z1[h])
        a0, a1 = normalize(p0[h], dtype), normalize(p1[h], dtype)
        t0, t1 = normalize(z0[h], dtype).detach(), normalize(z1[h], dtype).detach()
        tau_a = net.pairwise(a0, t1)
        tau_b = net.pairwise(a1, t0)
        cos_a, cos_b = (a0 * t1).sum(1), (a1 * t0).sum(1)
        total = total + (-cos_a / (2 * tau_a) - cos_b / (2 * tau_b)
                         + beta * (omega(tau_a, dim) + omega(tau_b, dim)))
        taus.append(torch.cat([tau_a, tau_b]).detach().mean())
    return total, loss_stats(total, temperature=torch.stack(taus))


def amcl_simsiam(p0: Tensor, p1: Tensor, z0: Tensor, z1: Tensor, temperature_net: nn.Module,
                 beta: float = 1e-3, *, check_finite: bool = True,
                 reduction: Reduction = "mean") -> Tensor:
    """Functional AMCL SimSiam form; arguments as :class:`AMCLSimSiamLoss`."""
    check_bool("check_finite", check_finite)
    check_choice("reduction", reduction, REDUCTIONS)
    beta = check_non_negative("beta", beta)
    return reduce(_amcl_simsiam(p0, p1, z0, z1, temperature_net, beta, check_finite)[0],
                  reduction)


class AMCLSimSiamLoss(Loss):
    """AMCL's SimSiam form (Table 2.2): symmetric negative cosine with pair temperatures.

    ``sum_c -cos(p0, sg z1) / (2 tau) - cos(p1, sg z0) / (2 tau~) + beta (Omega(tau) + Omega(tau~))``
    with ``tau = tau(p0, sg z1)`` from the pair-temperature network. Inputs ``[C, N, D]`` or
    ``[N, D]``: predictor outputs ``p0, p1`` and projections ``z0, z1``.

    Examples:
        >>> from adaptcl.plugins import PairTemperature
        >>> loss_fn = AMCLSimSiamLoss(PairTemperature(dim=32), beta=1e-3)
        >>> p0, p1, z0, z1 = (torch.randn(2, 8, 32) for _ in range(4))
        >>> loss = loss_fn(p0, p1, z0, z1)

    The functional form is :func:`amcl_simsiam`; ``reduction="none"`` gives the per-sample
    losses summed over heads.
    """

    def __init__(self, temperature_net: nn.Module, beta: float = 1e-3,
                 check_finite: bool = True, *, reduction: Reduction = "mean") -> None:
        super().__init__(reduction=reduction)
        self.temperature_net = temperature_net
        self.beta = check_non_negative("beta", beta)
        self.check_finite = check_bool("check_finite", check_finite)

    def forward(self, p0: Tensor, p1: Tensor, z0: Tensor, z1: Tensor) -> Tensor:
        """Loss of the predictions ``p0, p1`` against the (detached) projections ``z1, z0``."""
        return super().forward(p0, p1, z0, z1)

    def compute(self, p0: Tensor, p1: Tensor, z0: Tensor, z1: Tensor) -> tuple[Tensor, Stats]:
        return _amcl_simsiam(p0, p1, z0, z1, self.temperature_net, self.beta, self.check_finite)


def _amcl_barlow_twins(z0: Tensor, z1: Tensor, net: nn.Module, beta: float, lambda_param: float,
                       check_finite: bool) -> tuple[Tensor, Stats]:
    z0, z1 = as_heads("z0", z0), as_heads("z1", z1)
    if z0.shape != z1.shape:
        raise ValueError(f"z0 and z1 must have the same shape, got {tuple(z0.shape)} and {tuple(z1.shape)}")
    n, dim = z0.shape[1], z0.shape[2]
    if n < 2:
        raise ValueError("Barlow Twins needs a batch of at least 2 to standardise features")
    total, taus = 0.0, []
    eye = torch.eye(dim, dtype=torch.bool, device=z0.device)
    for h in range(z0.shape[0]):
        check_embedding_tensor("z0", z0[h], check_finite=check_finite)
        check_embedding_tensor("z1", z1[h], check_finite=check_finite)
        with autocast_off(z0):
            dtype = compute_dtype(z0, z1)
            a, b = z0[h].to(dtype), z1[h].to(dtype)
            # Batch standardisation exactly as Barlow Twins (biased variance, eps 1e-5).
            a = torch.nn.functional.batch_norm(a, None, None, training=True)
            b = torch.nn.functional.batch_norm(b, None, None, training=True)
            corr = a.T @ b / n
            tau = net(corr, corr.T)
            scaled = corr / tau
            on = (1 - scaled.diagonal()).pow(2).sum()
            off = (corr.pow(2) / tau).masked_fill(eye, 0.0).sum()
            reg = omega(tau, dim)
            reg_term = reg.diagonal().sum() - reg.masked_fill(eye, 0.0).sum()
            total = total + on + lambda_param * off + beta * reg_term
        taus.append(tau.diagonal().detach().mean())
    return total, loss_stats(total, temperature=torch.stack(taus))


def amcl_barlow_twins(z0: Tensor, z1: Tensor, temperature_net: nn.Module, beta: float = 1e-3,
                      lambda_param: float = 5e-3, *, check_finite: bool = True) -> Tensor:
    """Functional AMCL Barlow Twins form; arguments as :class:`AMCLBarlowTwinsLoss`."""
    check_bool("check_finite", check_finite)
    return _amcl_barlow_twins(z0, z1, temperature_net, check_non_negative("beta", beta),
                              check_non_negative("lambda_param", lambda_param), check_finite)[0]


class AMCLBarlowTwinsLoss(Loss):
    """AMCL's Barlow Twins form (Table 2.3).

    ``sum_c sum_l (1 - C_ll / tau_ll)^2 + lambda sum_{l != m} C_lm^2 / tau_lm
    + beta sum_l Omega(tau_ll) - beta sum_{l != m} Omega(tau_lm)``, ``C`` the cross-correlation
    of the batch-standardised views. The paper does not say what the temperature network sees
    for a pair of feature dimensions; here dimension ``l`` of view 0 is represented by its row
    ``C_l:`` and dimension ``m`` of view 1 by its column ``C_:m`` (both d'-dimensional), so
    ``tau = tau_net(C, C^T)``. A constant temperature of 1 with ``beta=0`` is Barlow Twins.

    Examples:
        >>> from adaptcl.plugins import PairTemperature
        >>> loss_fn = AMCLBarlowTwinsLoss(PairTemperature(dim=32), beta=1e-3)
        >>> loss = loss_fn(torch.randn(2, 16, 32), torch.randn(2, 16, 32))

    The functional form is :func:`amcl_barlow_twins`. The loss is a sum over feature pairs and
    heads, not over samples, so there is no ``reduction`` keyword (``self.reduction`` is
    ``"sum"``: :meth:`compute` returns that one sum).
    """

    def __init__(self, temperature_net: nn.Module, beta: float = 1e-3,
                 lambda_param: float = 5e-3, check_finite: bool = True) -> None:
        super().__init__(reduction="sum", reductions=("sum",))
        self.temperature_net = temperature_net
        self.beta = check_non_negative("beta", beta)
        self.lambda_param = check_non_negative("lambda_param", lambda_param)
        self.check_finite = check_bool("check_finite", check_finite)

    def forward(self, z0: Tensor, z1: Tensor) -> Tensor:
        """Loss of the ``[C, N, D]`` (or ``[N, D]``) projections of two views."""
        return super().forward(z0, z1)

    def compute(self, z0: Tensor, z1: Tensor) -> tuple[Tensor, Stats]:
        return _amcl_barlow_twins(z0, z1, self.temperature_net, self.beta, self.lambda_param,
                                  self.check_finite)


__all__ = ["AMCLSimSiamLoss", "AMCLBarlowTwinsLoss", "amcl_simsiam", "amcl_barlow_twins"]
