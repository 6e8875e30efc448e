"""AMCL's temperatures: the pair-temperature network, its constant ablation, the regulariser
Omega and the monitor that warns when the learned temperatures sit at a bound.

Reference:
    Wang, Koniusz et al., "Adaptive Multi-head Contrastive Learning", ECCV 2024
    (arXiv:2310.05615), Eq. (3)-(4).

* :class:`PairTemperature`: ``tau(a, b) = iota / (1 + exp(<phi(a), phi(b)>)) + eta``, bounded in
  ``(eta, eta + iota)``, with ``phi`` one linear layer ``R^{d'} -> R^{d'}``; its input to the
  sigmoid is clamped so gradients never vanish into a saturated exp.
* :func:`omega`: ``Omega(tau) = (d'/2) log tau + 1/tau`` (minimum at ``tau = 2/d'``), added for
  positive pairs and subtracted for negative pairs with weight ``beta``; ``d'`` is the feature
  dimension of the head output (not the batch size).

Why the temperatures can sit at a bound, and what the monitor reports, is on the docs' AMCL page.

Examples:
    >>> net = PairTemperature(dim=32)
    >>> tau = net(torch.randn(4, 32), torch.randn(6, 32))  # [4, 6], in (eta, eta + iota)
    >>> reg = omega(tau, dim=32)
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from .candidates import autocast_off, compute_dtype
from .tiles._terms import FixedPairTemperature, SigmoidPairTemperature
from .validation import check_int, check_positive

#: How close (absolute) a mean learned temperature must be to ``eta`` or ``eta + iota`` to count
#: as sitting at a bound.
BOUND_TOLERANCE = 1e-3
BOUND_WARNING = ("AMCL's learned temperatures have sat at a bound of the temperature network "
                 "(eta or eta + iota) for {steps} consecutive training steps: the temperature "
                 "level is degenerate (see 'Degeneracy' on the AMCL page of the docs)")


def omega(tau: Tensor, dim: int) -> Tensor:
    """AMCL's temperature regulariser ``(dim/2) log tau + 1/tau`` in float32 (Eq. 4)."""
    tau = tau.to(torch.float64 if tau.dtype == torch.float64 else torch.float32)
    return 0.5 * dim * torch.log(tau) + 1.0 / tau


class PairTemperature(nn.Module):
    """Shared pair-adaptive temperature network of AMCL.

    ``tau(a, b) = iota * sigmoid(-clamp(<phi(a), phi(b)>)) + eta``.

    Args:
        dim: feature dimension d' of the head outputs.
        eta: lower bound of the temperature (paper: 1e-5).
        iota: width of the range; the upper bound is ``eta + iota`` (paper: 2, or 5 on
            ImageNet / Tiny-ImageNet).
        clamp: bound of the pre-sigmoid value.

    Examples:
        >>> net = PairTemperature(dim=128)
        >>> tau = net(torch.randn(4, 128), torch.randn(6, 128))  # [4, 6]
    """

    def __init__(self, dim: int, eta: float = 1e-5, iota: float = 2.0, clamp: float = 20.0) -> None:
        super().__init__()
        self.dim = check_int("dim", dim, minimum=1)
        self.eta = check_positive("eta", eta)
        self.iota = check_positive("iota", iota)
        self.clamp = check_positive("clamp", clamp)
        self.phi = nn.Linear(dim, dim)

    def squash(self, r: Tensor) -> Tensor:
        """The temperature of a pair from ``r = <phi(a), phi(b)>``."""
        return self.iota * torch.sigmoid(-r.clamp(-self.clamp, self.clamp)) + self.eta

    def squash_grad(self, r: Tensor) -> Tensor:
        """``d squash / d r``: ``-iota sig (1 - sig)``, zero where the clamp is active."""
        sig = torch.sigmoid(-r.clamp(-self.clamp, self.clamp))
        return sig * (1 - sig) * (-self.iota) * ((r >= -self.clamp) & (r <= self.clamp))

    def describe(self) -> SigmoidPairTemperature:
        """:meth:`squash` as the tiles' typed description (the fused kernel computes it)."""
        return SigmoidPairTemperature(scale=self.iota, floor=self.eta, bound=self.clamp)

    def features(self, x: Tensor) -> Tensor:
        """``phi(x)`` in the network's dtype, outside autocast: a pair's temperature is
        ``squash(<features(a), features(b)>)``, which is what lets the tiled path recompute it
        inside a tile."""
        with autocast_off(x):
            return self.phi(x.to(self.phi.weight.dtype))

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        """Temperatures of every pair: ``[A, D] x [B, D] -> [A, B]``."""
        with autocast_off(a):
            return self.squash(self.features(a) @ self.features(b).T)

    def pairwise(self, a: Tensor, b: Tensor) -> Tensor:
        """Temperatures of matching rows: ``[N, D] x [N, D] -> [N]``."""
        with autocast_off(a):
            return self.squash((self.features(a) * self.features(b)).sum(dim=1))


class ConstantTemperature(nn.Module):
    """A fixed temperature with the interface of :class:`PairTemperature` (ablations).

    Examples:
        >>> net = ConstantTemperature(0.1)
        >>> tau = net(torch.randn(4, 32), torch.randn(6, 32))  # [4, 6], all 0.1
    """

    def __init__(self, temperature: float = 0.1) -> None:
        super().__init__()
        self.temperature = check_positive("temperature", temperature)

    def squash(self, r: Tensor) -> Tensor:
        return torch.full_like(r, self.temperature)

    def squash_grad(self, r: Tensor) -> Tensor:
        return torch.zeros_like(r)

    def describe(self) -> FixedPairTemperature:
        """:meth:`squash` as the tiles' typed description."""
        return FixedPairTemperature(self.temperature)

    def features(self, x: Tensor) -> Tensor:
        """No features: every pair has the same temperature."""
        return x.new_zeros(x.shape[0], 1, dtype=compute_dtype(x))

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return torch.full((a.shape[0], b.shape[0]), self.temperature, dtype=compute_dtype(a),
                          device=a.device)

    def pairwise(self, a: Tensor, b: Tensor) -> Tensor:
        return torch.full((a.shape[0],), self.temperature, dtype=compute_dtype(a), device=a.device)


class BoundMonitor:
    """Warns once (``RuntimeWarning``, :data:`BOUND_WARNING`) when the mean temperatures of a
    :class:`PairTemperature` have stayed within :data:`BOUND_TOLERANCE` of ``eta`` or
    ``eta + iota`` for ``steps`` consecutive training steps.

    The run of steps at a bound is counted in a 0-d tensor on the temperatures' device, so a step
    adds no host-device synchronisation; the host reads that counter once every ``steps`` steps
    (one read per window: a run that persists is reported within ``2 * steps`` steps of its
    start). Nothing is read on the ``meta`` device. :class:`~adaptcl.plugins.AMCLLoss` keeps one
    (``bound_warning_steps``).
    """

    def __init__(self) -> None:
        self.run: Tensor | None = None  # consecutive steps at a bound, on the device
        self.tracked = 0
        self.warned = False

    def update(self, net: nn.Module, means: Tensor, steps: int) -> None:
        """Count one step whose mean temperatures are ``means`` (any shape); a network other
        than :class:`PairTemperature` has no bounds and is not tracked."""
        if not isinstance(net, PairTemperature):
            return
        at_bound = (((means - net.eta).abs() <= BOUND_TOLERANCE)
                    | ((means - (net.eta + net.iota)).abs() <= BOUND_TOLERANCE)).any()
        run = self.run
        if run is None or run.device != at_bound.device:
            run = torch.zeros((), dtype=torch.long, device=at_bound.device)
        self.run = torch.where(at_bound, run + 1, 0)
        self.tracked += 1
        if self.tracked % steps == 0 and at_bound.device.type != "meta":
            if bool(self.run >= steps):  # the one host read of the window
                self.warned = True
                warnings.warn(BOUND_WARNING.format(steps=steps), RuntimeWarning, stacklevel=2)


__all__ = ["PairTemperature", "ConstantTemperature", "omega", "BoundMonitor", "BOUND_TOLERANCE",
           "BOUND_WARNING"]
