"""Adaptive Multi-head Contrastive Learning (AMCL).

Reference:
    Wang, Koniusz et al., "Adaptive Multi-head Contrastive Learning", ECCV 2024
    (arXiv:2310.05615). Table 2 gives the loss forms; Eq. (3)-(4) the temperatures and Omega.

AMCL changes the temperature of InfoNCE into a learned one per pair and per head:

* ``C`` projection heads (:class:`MultiHeadProjection`) each produce ``z^c``;
* a shared pair-temperature network (:class:`PairTemperature`),
  ``tau(a, b) = iota / (1 + exp(<phi(a), phi(b)>)) + eta`` (bounded in ``(eta, eta + iota)``),
  with ``phi`` one linear layer ``R^{d'} -> R^{d'}``; its input to the sigmoid is clamped so
  gradients never vanish into a saturated exp;
* the regulariser ``Omega(tau) = (d'/2) log tau + 1/tau`` (minimum at ``tau = 2/d'``) added for
  positive pairs and subtracted for negative pairs with weight ``beta``; ``d'`` is the feature
  dimension of the head output (not the batch size).

Negative terms: ``"topk"`` averages ``s/tau - beta Omega(tau)`` over the kappa most similar
negatives (kappa = 1 is Table 2's max); ``"softmax"`` is the paper's exact Eq. (7) form,
``logsumexp_n (s_n/tau_n - beta Omega(tau_n))``. With ``objective="infonce"`` (Table 2.4) the
positive joins the candidates of the max / log-sum-exp; ``"nt_xent"`` (Table 2.1) uses
negatives only. Temperatures stay differentiable (the network learns); only SimSiam's targets
are detached, as in SimSiam.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from .base import REDUCTIONS, ContrastiveLoss, Stats, functional_candidates, loss_stats, reduce
from .candidates import Candidates, autocast_off, compute_dtype, normalize
from .distributed import GatherFn
from .kernel import no_negatives_output
from .tiled import streamed_pair_lse, streamed_sum, streamed_top_columns, top_columns
from .validation import (
    check_bool,
    check_choice,
    check_embeddings,
    check_int,
    check_non_negative,
    check_positive,
)

NEGATIVE_TERMS = ("topk", "softmax")
OBJECTIVES = ("nt_xent", "infonce")
#: How close (absolute) a mean learned temperature must be to ``eta`` or ``eta + iota`` to count
#: as sitting at a bound.
BOUND_TOLERANCE = 1e-3
BOUND_WARNING = ("AMCL's learned temperatures have sat at a bound of the temperature network "
                 "(eta or eta + iota) for {steps} consecutive training steps: the temperature "
                 "level is degenerate (see 'Degeneracy' in the AMCLLoss docstring)")

#: The paper's settings for SimCLR / MoCo on the smaller datasets (Wang et al., ECCV 2024):
#: 3 projection heads (Sec. 5, "Impact of the number of projection heads", Fig. 5 left: "we use
#: 3 heads in our paper"); the top-kappa negative term with kappa = 100 (Fig. 5 right: top-kappa
#: beats soft-max at kappa = 100 and 150); the NT-Xent form of Table 2.1; temperature bounds
#: eta = 1e-5, iota = 2 (Sec. 5, experimental setup; iota = 5 on ImageNet / Tiny-ImageNet); and
#: beta = 1, the value of the maximum-likelihood derivation (Appendix A). The paper picks beta
#: in [1e-5, 10] and kappa by Hyperopt per dataset (:data:`AMCL_PAPER_BETA_RANGE`), so these
#: are its stated defaults, not tuned values. kappa = 100 needs at least 100 negatives per
#: anchor (a batch of 51 or more in the NT-Xent form; the paper trains at batch 512). The keys
#: are keywords of ``adapters.lightly.AMCLLoss(dim, **AMCL_PAPER)`` and
#: ``adapters.sentence_transformers.AMCLLoss(model, **AMCL_PAPER)``; in the core,
#: :meth:`AMCLLoss.paper_config` builds the loss and ``num_heads`` goes to
#: :class:`MultiHeadProjection`. Not the default: in the top-kappa form a negative's term
#: ``(s - beta)/tau - beta (d'/2) log tau`` falls without bound as its temperature goes to eta
#: whenever beta exceeds its similarity s (every negative at beta = 1), which is what the
#: CIFAR-subset run of this configuration did (negative temperatures to eta, loss near -5e4,
#: kNN below NT-Xent's; docs' Results page).
AMCL_PAPER: dict = {"num_heads": 3, "beta": 1.0, "negative_term": "topk", "kappa": 100,
                    "objective": "nt_xent", "eta": 1e-5, "iota": 2.0}
#: The range the paper searches beta over (Sec. 5 and Appendix, Fig. 9).
AMCL_PAPER_BETA_RANGE = (1e-5, 10.0)


def omega(tau: Tensor, dim: int) -> Tensor:
    """AMCL's temperature regulariser ``(dim/2) log tau + 1/tau`` in float32 (Eq. 4)."""
    tau = tau.to(torch.float64 if tau.dtype == torch.float64 else torch.float32)
    return 0.5 * dim * torch.log(tau) + 1.0 / tau


def pair_term(s: Tensor, tau: Tensor, beta: float, dim: int) -> Tensor:
    """A negative pair's term ``s / tau - beta Omega(tau)`` (Eq. 7); the one formula of the
    top-kappa and softmax terms, materialised and tiled."""
    return s / tau - beta * omega(tau, dim)


class _PairTerm:
    """:func:`pair_term` with ``tau = net.squash(r)``, on tiles of the streaming engine
    (:class:`~adaptcl.plugins.tiled.PairTerm`); its derivative is written out for the
    recomputing backward."""

    def __init__(self, net: nn.Module, beta: float, dim: int) -> None:
        self.net, self.beta, self.dim = net, beta, dim

    def term(self, s: Tensor, r: Tensor) -> Tensor:
        return pair_term(s, self.net.squash(r), self.beta, self.dim)

    def grads(self, s: Tensor, r: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        inv = 1.0 / self.net.squash(r)
        # d term / d tau = -s / tau^2 - beta (dim / (2 tau) - 1 / tau^2)
        d_tau = -s * inv * inv - self.beta * (0.5 * self.dim * inv - inv * inv)
        return w * inv, w * d_tau * self.net.squash_grad(r)

    def statistic(self, r: Tensor) -> Tensor:
        return self.net.squash(r)


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
    """A fixed temperature with the interface of :class:`PairTemperature` (ablations)."""

    def __init__(self, temperature: float = 0.1) -> None:
        super().__init__()
        self.temperature = check_positive("temperature", temperature)

    def squash(self, r: Tensor) -> Tensor:
        return torch.full_like(r, self.temperature)

    def squash_grad(self, r: Tensor) -> Tensor:
        return torch.zeros_like(r)

    def features(self, x: Tensor) -> Tensor:
        """No features: every pair has the same temperature."""
        return x.new_zeros(x.shape[0], 1, dtype=compute_dtype(x))

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return torch.full((a.shape[0], b.shape[0]), self.temperature, dtype=compute_dtype(a),
                          device=a.device)

    def pairwise(self, a: Tensor, b: Tensor) -> Tensor:
        return torch.full((a.shape[0],), self.temperature, dtype=compute_dtype(a), device=a.device)


class MultiHeadProjection(nn.Module):
    """C independent projection heads (same architecture, separate weights), stacked.

    Each head is SimCLR's: ``num_layers - 1`` hidden blocks ``Linear -> BatchNorm1d -> ReLU``
    (the BatchNorm only with ``batch_norm=True``) and a final ``Linear``; ``num_layers=2`` is
    ``Linear -> BatchNorm1d -> ReLU -> Linear``. Output shape ``[C, B, output_dim]``.

    Examples:
        >>> heads = MultiHeadProjection(512, 512, 128, num_heads=3)
        >>> z = heads(torch.randn(8, 512))  # [3, 8, 128]
    """

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_heads: int = 2,
                 num_layers: int = 2, batch_norm: bool = True) -> None:
        super().__init__()
        check_int("input_dim", input_dim, 1)
        check_int("hidden_dim", hidden_dim, 1)
        check_int("output_dim", output_dim, 1)
        self.num_heads = check_int("num_heads", num_heads, 1)
        check_int("num_layers", num_layers, 1)

        def head() -> nn.Sequential:
            layers: list[nn.Module] = []
            d = input_dim
            for _ in range(num_layers - 1):
                layers.append(nn.Linear(d, hidden_dim, bias=not batch_norm))
                if batch_norm:
                    layers.append(nn.BatchNorm1d(hidden_dim))
                layers.append(nn.ReLU(inplace=True))
                d = hidden_dim
            layers.append(nn.Linear(d, output_dim))
            return nn.Sequential(*layers)

        self.heads = nn.ModuleList(head() for _ in range(num_heads))

    def forward(self, x: Tensor) -> Tensor:
        return torch.stack([h(x) for h in self.heads])


def _as_heads(name: str, z: Tensor) -> Tensor:
    if isinstance(z, Tensor) and z.ndim == 2:
        return z.unsqueeze(0)
    if not isinstance(z, Tensor) or z.ndim != 3:
        raise ValueError(f"{name} must have shape [batch, dim] or [heads, batch, dim], got "
                         f"{tuple(z.shape) if isinstance(z, Tensor) else type(z).__name__}")
    return z


class AMCLLoss(ContrastiveLoss):
    """AMCL in the NT-Xent / InfoNCE forms of Table 2 (2.1 and 2.4).

    Args:
        temperature_net: a :class:`PairTemperature` (learned; put it in the optimiser) or a
            :class:`ConstantTemperature`.
        beta: weight of the regulariser Omega (>= 0).
        negative_term: ``"softmax"`` (the default: Eq. 7's log-sum-exp over all negatives) or
            ``"topk"`` (mean over the kappa hardest negatives; kappa = 1 is Table 2's max).
        kappa: number of negatives of the top-kappa term.
        objective: ``"nt_xent"`` (negatives only, Table 2.1) or ``"infonce"`` (positive
            included, Table 2.4).
        form: candidate set (see :mod:`adaptcl.plugins.candidates`).
        gather_distributed / gather_fn / check_finite / reduction: as in
            :class:`~adaptcl.plugins.InfoNCELoss` (the same validation; each head's candidates
            are gathered across ranks with ``gather_fn``).
        tile_size: stream the pair similarities and temperatures in tiles (Inf-CL, Cheng et
            al. 2024; :mod:`adaptcl.plugins.tiled`), exactly: ``"softmax"`` recomputes each tile's
            pair temperatures in backward so the temperature network still learns; ``"topk"``
            merges the top-kappa across tiles and differentiates the gathered pairs. Needs a
            temperature network exposing ``features``, ``squash`` and ``squash_grad`` (as
            :class:`PairTemperature` and :class:`ConstantTemperature` do): a pair's
            temperature is ``squash(<features(a), features(b)>)``, recomputed inside a tile.
            A ``ValueError`` otherwise.
        bound_warning_steps: warn once per loss instance (``RuntimeWarning``,
            :data:`BOUND_WARNING`) when the mean positive or the mean pair temperature of a
            :class:`PairTemperature` has stayed within :data:`BOUND_TOLERANCE` of ``eta`` or
            ``eta + iota`` for this many consecutive training steps (forward in ``train()``
            mode with gradients on); ``None`` disables it. The run of steps at a bound is
            counted in a tensor on the loss's device, so a step adds no host-device
            synchronisation; the host reads that counter once every ``bound_warning_steps``
            steps (one read per window; a run that persists is reported within
            ``2 * bound_warning_steps`` steps of its start).
            Not tracked while ``torch.compile`` traces the loss.

    Among candidates tied exactly, the top-kappa takes the lowest columns (the positive, for
    ``objective="infonce"``, counts as the last column) in both paths, so the tiled and the
    materialised gradients agree even on ties. ``reduction="none"`` gives per-anchor losses
    summed over heads. The functional form is :func:`amcl`.

    ``forward(z0, z1, negatives=None)`` takes ``[C, N, D]`` (or ``[N, D]`` for one head); the
    per-head losses are summed (the paper's l = sum_c l_c) and averaged over anchors.
    With one head, a constant temperature, ``beta=0``, ``negative_term="softmax"`` and
    ``objective="infonce"`` it equals InfoNCE exactly.

    Degeneracy (issue 16; ``tests/plugins/test_amcl_degeneracy.py``): in the max-negative
    form (Table 2.1, kappa = 1) the per-anchor loss is
    ``-s+/tau+ + s-/tau- + beta Omega(tau+) - beta Omega(tau-)``. When the positive and the
    hardest negative get the same temperature ``tau`` (one shared pair network that no longer
    tells the pairs apart), the regulariser terms cancel exactly and the loss is
    ``(s- - s+) / tau``: nothing pins the temperature level. If the hardest negative is closer
    than the positive (``s- > s+``) the loss falls as tau grows, and the temperature runs to the
    largest value the network reaches (the sigmoid's midpoint ``eta + iota / 2``, about 1, when
    ``phi`` gives every sample the same output, since then ``<phi(a), phi(b)> >= 0``); otherwise
    it runs to the floor ``eta``. beta drops out, so no beta (1e-5 to 1 checked) cures it.
    With a shared temperature the soft-max form (Eq. 7) is no cure by itself either: Omega
    factors out of its log-sum-exp and cancels in the same way, and on the test's fixed
    embeddings it reaches the same bounds.

    Default: ``negative_term="softmax"`` (Eq. 7), ``objective="nt_xent"``, ``beta=1e-3``,
    chosen by measurement on the CIFAR-10 subset (SimCLR, the images recipe's CPU preset): there
    the soft-max form trained, with the positive and negative temperatures apart and away from
    the bounds, where the top-1 form parked tau+ at the midpoint and :data:`AMCL_PAPER` drove
    the negative temperatures to eta (docs' Results page, "AMCL"). What keeps the soft-max form
    off the bounds is the network giving pairs different temperatures; with one temperature for
    all pairs it degenerates as above. ``negative_term="topk"`` with ``kappa`` is the paper's
    max / top-kappa form.

    Examples:
        >>> net = PairTemperature(dim=32)
        >>> loss_fn = AMCLLoss(net, beta=1e-3, negative_term="topk", kappa=4)
        >>> z0, z1 = torch.randn(2, 16, 32), torch.randn(2, 16, 32)
        >>> loss = loss_fn(z0, z1)
    """

    def __init__(self, temperature_net: nn.Module, beta: float = 1e-3, *,
                 negative_term: str = "softmax", kappa: int = 1, objective: str = "nt_xent",
                 form: str = "nt_xent", gather_distributed: bool = False,
                 gather_fn: GatherFn | None = None, check_finite: bool = True,
                 tile_size: int | None = None, reduction: str = "mean",
                 bound_warning_steps: int | None = 100) -> None:
        super().__init__(form=form, gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size, reduction=reduction)
        options = _amcl_options(temperature_net, beta, negative_term, kappa, objective,
                                self.tile_size)
        self.temperature_net = options.pop("temperature_net")
        for name, value in options.items():
            setattr(self, name, value)
        self.bound_warning_steps = (None if bound_warning_steps is None else
                                    check_int("bound_warning_steps", bound_warning_steps, 1))
        self._bound_run: Tensor | None = None  # consecutive steps at a bound, on the device
        self._tracked_steps = 0
        self._bound_warned = False

    @classmethod
    def paper_config(cls, dim: int, **overrides) -> AMCLLoss:
        """AMCL with the paper's settings (:data:`AMCL_PAPER`) and a fresh
        :class:`PairTemperature` of feature dimension ``dim``; ``overrides`` replace any of them.

        ``num_heads`` is not a setting of the loss (it takes ``[C, N, D]``): build the heads with
        ``MultiHeadProjection(..., num_heads=AMCL_PAPER["num_heads"])``.

        Examples:
            >>> loss_fn = AMCLLoss.paper_config(dim=32)
            >>> heads = MultiHeadProjection(64, 64, 32, num_heads=AMCL_PAPER["num_heads"])
            >>> x0, x1 = torch.randn(128, 64), torch.randn(128, 64)
            >>> loss = loss_fn(heads(x0), heads(x1))
        """
        config = {**AMCL_PAPER, **overrides}
        config.pop("num_heads")
        net = PairTemperature(dim, eta=config.pop("eta"), iota=config.pop("iota"))
        return cls(net, **config)

    def forward(self, z0: Tensor, z1: Tensor, negatives: Tensor | None = None) -> Tensor:
        """AMCL loss of ``[C, N, D]`` (or ``[N, D]``) projections of two views; ``negatives``
        ``[C, K, D]`` (or ``[K, D]``), one set per head."""
        loss = super().forward(z0, z1, negatives)
        if (self.bound_warning_steps is not None and not self._bound_warned and self.training
                and torch.is_grad_enabled() and not torch.compiler.is_compiling()):
            self._track_bounds()
        return loss

    def _track_bounds(self) -> None:
        """Count the consecutive steps the mean temperatures sit at a bound (device-side) and
        read the count on the host once every ``bound_warning_steps`` steps."""
        net = self.temperature_net
        if not isinstance(net, PairTemperature):
            return
        means = torch.stack([self.last_stats["temperature"].float(),
                             self.last_stats["negative_temperature"].float()])
        at_bound = (((means - net.eta).abs() <= BOUND_TOLERANCE)
                    | ((means - (net.eta + net.iota)).abs() <= BOUND_TOLERANCE)).any()
        run = self._bound_run
        if run is None or run.device != at_bound.device:
            run = torch.zeros((), dtype=torch.long, device=at_bound.device)
        self._bound_run = torch.where(at_bound, run + 1, 0)
        self._tracked_steps += 1
        steps = self.bound_warning_steps
        if self._tracked_steps % steps == 0 and at_bound.device.type != "meta":
            if bool(self._bound_run >= steps):  # the one host read of the window
                self._bound_warned = True
                warnings.warn(BOUND_WARNING.format(steps=steps), RuntimeWarning, stacklevel=2)

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None) -> tuple[Tensor, Stats]:
        return _amcl(z0, z1, negatives, self.candidates, self.temperature_net, beta=self.beta,
                     negative_term=self.negative_term, kappa=self.kappa,
                     objective=self.objective, tile_size=self.tile_size)

    def extra_repr(self) -> str:
        return (f"beta={self.beta}, negative_term={self.negative_term!r}, kappa={self.kappa}, "
                f"objective={self.objective!r}, bound_warning_steps={self.bound_warning_steps}, "
                f"{super().extra_repr()}")


def _tileable(net: nn.Module) -> bool:
    return all(hasattr(net, name) for name in ("features", "squash", "squash_grad"))


def _amcl_options(temperature_net: nn.Module, beta: float, negative_term: str, kappa: int,
                  objective: str, tile_size: int | None) -> dict:
    """AMCL's hyper-parameters checked once for the module and the functional form."""
    if not hasattr(temperature_net, "pairwise"):
        raise TypeError("temperature_net must be a PairTemperature or ConstantTemperature")
    if tile_size is not None and not _tileable(temperature_net):
        raise ValueError(
            f"tile_size needs a temperature network with features/squash/squash_grad (like "
            f"PairTemperature or ConstantTemperature) to recompute pair temperatures inside a "
            f"tile; {type(temperature_net).__name__} cannot be tiled: pass tile_size=None")
    return {"temperature_net": temperature_net, "beta": check_non_negative("beta", beta),
            "negative_term": check_choice("negative_term", negative_term, NEGATIVE_TERMS),
            "kappa": check_int("kappa", kappa, minimum=1),
            "objective": check_choice("objective", objective, OBJECTIVES)}


def _top_pairs(c: Candidates, net: nn.Module, tau_pos: Tensor, kappa: int, infonce: bool,
               tile_size: int | None) -> tuple[Tensor, Tensor, Tensor]:
    """Similarities and temperatures ``[A, kappa]`` of each anchor's kappa most similar
    candidates (the positive among them for InfoNCE, as column ``C``), and the mean pair
    temperature over all ``A x C`` pairs. Ties go to the lowest column in both paths."""
    available = c.num_negatives + infonce
    if kappa > available:
        raise ValueError(f"kappa={kappa} is larger than the {available} "
                         "candidates available to each anchor")
    num_keys = c.keys.shape[0]
    if tile_size is None:
        sims, taus = c.mask_(c.similarity()), net(c.anchors, c.keys)
        tau_mean = taus.detach().mean()
        if infonce:
            sims = torch.cat([sims, c.positive_sim[:, None]], dim=1)
            taus = torch.cat([taus, tau_pos[:, None].to(taus.dtype)], dim=1)
        columns = torch.arange(sims.shape[1], device=sims.device).expand_as(sims)
        top = top_columns(sims.detach(), columns, kappa)[1]
        return sims.gather(1, top), taus.gather(1, top), tau_mean
    extra = c.positive_sim.detach() if infonce else None
    top = streamed_top_columns(c.anchors.detach(), c.keys.detach(), tile_size, c.excluded,
                               kappa, extra)
    is_pos = top == num_keys
    cols = top.clamp(max=num_keys - 1)
    s_k = torch.einsum("ad,akd->ak", c.anchors, c.keys[cols])
    s_k = torch.where(is_pos, c.positive_sim[:, None], s_k)
    pa, pk = net.features(c.anchors), net.features(c.keys)
    t_k = net.squash(torch.einsum("ad,akd->ak", pa, pk[cols]))
    t_k = torch.where(is_pos, tau_pos[:, None].to(t_k.dtype), t_k)
    tau_mean = streamed_sum(net.squash, pa.detach(), pk.detach(), tile_size) / (
        c.num_anchors * num_keys)
    return s_k, t_k, tau_mean


def _softmax_term(c: Candidates, net: nn.Module, beta: float, dim: int,
                  tile_size: int | None) -> tuple[Tensor, Tensor]:
    """``logsumexp_n pair_term(s_n, tau_n)`` over each anchor's negatives, and the mean pair
    temperature over all ``A x C`` pairs."""
    if tile_size is None:
        tau = net(c.anchors, c.keys)
        terms = c.mask_(pair_term(c.similarity(), tau, beta, dim))
        return torch.logsumexp(terms, dim=1), tau.detach().mean()
    pa, pk = net.features(c.anchors), net.features(c.keys)
    dtype = c.anchors.dtype
    neg, tau_sum = streamed_pair_lse(c.anchors, c.keys, pa.to(dtype), pk.to(dtype), tile_size,
                                     c.excluded, _PairTerm(net, beta, dim))
    return neg, tau_sum / (c.num_anchors * c.keys.shape[0])


def _head_loss(c: Candidates, net: nn.Module, dim: int, *, beta: float, negative_term: str,
               kappa: int, objective: str, tile_size: int | None) -> tuple[Tensor, Tensor, Tensor]:
    """Per-anchor loss ``-s_pos / tau_pos + beta Omega(tau_pos) + negative term`` of one head
    and direction, with the mean positive and pair temperatures (detached)."""
    tau_pos = net.pairwise(c.anchors, c.positive_keys)
    if c.num_negatives == 0:
        zero = no_negatives_output(c.positive_sim / tau_pos).loss
        return zero, tau_pos.detach().mean(), tau_pos.detach().mean()
    infonce = objective == "infonce"
    with autocast_off(c.anchors):
        pos = c.positive_sim / tau_pos
        reg_pos = beta * omega(tau_pos, dim)
        if negative_term == "softmax":
            neg, tau_mean = _softmax_term(c, net, beta, dim, tile_size)
            if infonce:
                neg = torch.logaddexp(neg, pos - reg_pos)
        else:
            s_k, t_k, tau_mean = _top_pairs(c, net, tau_pos, kappa, infonce, tile_size)
            neg = pair_term(s_k, t_k, beta, dim).mean(dim=1)
        loss = -pos + reg_pos + neg
    return loss, tau_pos.detach().mean(), tau_mean.detach()


def _amcl(z0: Tensor, z1: Tensor, negatives: Tensor | None, build, net: nn.Module, *,
          beta: float, negative_term: str, kappa: int, objective: str,
          tile_size: int | None) -> tuple[Tensor, Stats]:
    """AMCL's per-anchor losses (summed over heads) and statistics; ``build(z0, z1, neg)``
    makes one head's candidates."""
    z0, z1 = _as_heads("z0", z0), _as_heads("z1", z1)
    if z0.shape != z1.shape:
        raise ValueError(f"z0 and z1 must have the same shape, got {tuple(z0.shape)} and {tuple(z1.shape)}")
    if negatives is not None:
        negatives = _as_heads("negatives", negatives)
        if negatives.shape[0] != z0.shape[0]:
            raise ValueError("negatives must have one [K, D] set per head")
    dim = z0.shape[-1]
    total, taus_pos, taus_neg, align = 0.0, [], [], []
    for h in range(z0.shape[0]):
        cands = build(z0[h], z1[h], None if negatives is None else negatives[h])
        losses = []
        for c in cands:
            loss, tau_pos, tau = _head_loss(c, net, dim, beta=beta, negative_term=negative_term,
                                            kappa=kappa, objective=objective, tile_size=tile_size)
            losses.append(loss)
            taus_pos.append(tau_pos)
            taus_neg.append(tau)
        total = total + torch.cat(losses)
        align.append(cands[0].positive_sim.detach().mean())
    return total, loss_stats(total, temperature=torch.stack(taus_pos),
                             negative_temperature=torch.stack(taus_neg),
                             alignment=torch.stack(align))


def amcl(z0: Tensor, z1: Tensor, temperature_net: nn.Module, beta: float = 1e-3, *,
         negatives: Tensor | None = None, negative_term: str = "softmax", kappa: int = 1,
         objective: str = "nt_xent", form: str = "nt_xent", gather_distributed: bool = False,
         gather_fn: GatherFn | None = None, check_finite: bool = True,
         tile_size: int | None = None, reduction: str = "mean") -> Tensor:
    """Functional AMCL; arguments as :class:`AMCLLoss`.

    Examples:
        >>> net = PairTemperature(dim=32)
        >>> loss = amcl(torch.randn(2, 16, 32), torch.randn(2, 16, 32), net, kappa=2)
    """
    options = _amcl_options(temperature_net, beta, negative_term, kappa, objective, tile_size)
    net = options.pop("temperature_net")

    def build(a: Tensor, b: Tensor, neg: Tensor | None) -> list[Candidates]:
        return functional_candidates(a, b, neg, form=form, gather_distributed=gather_distributed,
                                     gather_fn=gather_fn, check_finite=check_finite,
                                     tile_size=tile_size, reduction=reduction)

    return reduce(_amcl(z0, z1, negatives, build, net, **options, tile_size=tile_size)[0],
                  reduction)


def _amcl_simsiam(p0: Tensor, p1: Tensor, z0: Tensor, z1: Tensor, net: nn.Module, beta: float,
                  check_finite: bool) -> tuple[Tensor, Stats]:
    p0, p1, z0, z1 = (_as_heads(n, t) for n, t in zip(("p0", "p1", "z0", "z1"), (p0, p1, z0, z1), strict=True))
    if not p0.shape == p1.shape == z0.shape == z1.shape:
        raise ValueError("p0, p1, z0 and z1 must have the same shape")
    dim = p0.shape[-1]
    total, taus = 0.0, []
    for h in range(p0.shape[0]):
        for name, t in (("p0", p0[h]), ("p1", p1[h]), ("z0", z0[h]), ("z1", z1[h])):
            check_embeddings(name, t, check_finite=check_finite)
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
                 reduction: str = "mean") -> Tensor:
    """Functional AMCL SimSiam form; arguments as :class:`AMCLSimSiamLoss`."""
    check_bool("check_finite", check_finite)
    check_choice("reduction", reduction, REDUCTIONS)
    beta = check_non_negative("beta", beta)
    return reduce(_amcl_simsiam(p0, p1, z0, z1, temperature_net, beta, check_finite)[0],
                  reduction)


class AMCLSimSiamLoss(nn.Module):
    """AMCL's SimSiam form (Table 2.2): symmetric negative cosine with pair temperatures.

    ``sum_c -cos(p0, sg z1) / (2 tau) - cos(p1, sg z0) / (2 tau~) + beta (Omega(tau) + Omega(tau~))``
    with ``tau = tau(p0, sg z1)`` from the pair-temperature network. Inputs ``[C, N, D]`` or
    ``[N, D]``: predictor outputs ``p0, p1`` and projections ``z0, z1``.

    Examples:
        >>> loss_fn = AMCLSimSiamLoss(PairTemperature(dim=32), beta=1e-3)
        >>> p0, p1, z0, z1 = (torch.randn(2, 8, 32) for _ in range(4))
        >>> loss = loss_fn(p0, p1, z0, z1)

    The functional form is :func:`amcl_simsiam`; ``reduction="none"`` gives the per-sample
    losses summed over heads.
    """

    def __init__(self, temperature_net: nn.Module, beta: float = 1e-3,
                 check_finite: bool = True, *, reduction: str = "mean") -> None:
        super().__init__()
        self.temperature_net = temperature_net
        self.beta = check_non_negative("beta", beta)
        self.check_finite = check_bool("check_finite", check_finite)
        self.reduction = check_choice("reduction", reduction, REDUCTIONS)
        self.last_stats: Stats = {}

    def forward(self, p0: Tensor, p1: Tensor, z0: Tensor, z1: Tensor) -> Tensor:
        per_sample, self.last_stats = _amcl_simsiam(p0, p1, z0, z1, self.temperature_net,
                                                    self.beta, self.check_finite)
        return reduce(per_sample, self.reduction)


def _amcl_barlow_twins(z0: Tensor, z1: Tensor, net: nn.Module, beta: float, lambda_param: float,
                       check_finite: bool) -> tuple[Tensor, Stats]:
    z0, z1 = _as_heads("z0", z0), _as_heads("z1", z1)
    if z0.shape != z1.shape:
        raise ValueError(f"z0 and z1 must have the same shape, got {tuple(z0.shape)} and {tuple(z1.shape)}")
    n, dim = z0.shape[1], z0.shape[2]
    if n < 2:
        raise ValueError("Barlow Twins needs a batch of at least 2 to standardise features")
    total, taus = 0.0, []
    eye = torch.eye(dim, dtype=torch.bool, device=z0.device)
    for h in range(z0.shape[0]):
        check_embeddings("z0", z0[h], check_finite=check_finite)
        check_embeddings("z1", z1[h], check_finite=check_finite)
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


class AMCLBarlowTwinsLoss(nn.Module):
    """AMCL's Barlow Twins form (Table 2.3).

    ``sum_c sum_l (1 - C_ll / tau_ll)^2 + lambda sum_{l != m} C_lm^2 / tau_lm
    + beta sum_l Omega(tau_ll) - beta sum_{l != m} Omega(tau_lm)``, ``C`` the cross-correlation
    of the batch-standardised views. The paper does not say what the temperature network sees
    for a pair of feature dimensions; here dimension ``l`` of view 0 is represented by its row
    ``C_l:`` and dimension ``m`` of view 1 by its column ``C_:m`` (both d'-dimensional), so
    ``tau = tau_net(C, C^T)``. A constant temperature of 1 with ``beta=0`` is Barlow Twins.

    Examples:
        >>> loss_fn = AMCLBarlowTwinsLoss(PairTemperature(dim=32), beta=1e-3)
        >>> loss = loss_fn(torch.randn(2, 16, 32), torch.randn(2, 16, 32))

    The functional form is :func:`amcl_barlow_twins`. The loss is a sum over feature pairs, not
    over samples, so there is no ``reduction``.
    """

    def __init__(self, temperature_net: nn.Module, beta: float = 1e-3,
                 lambda_param: float = 5e-3, check_finite: bool = True) -> None:
        super().__init__()
        self.temperature_net = temperature_net
        self.beta = check_non_negative("beta", beta)
        self.lambda_param = check_non_negative("lambda_param", lambda_param)
        self.check_finite = check_bool("check_finite", check_finite)
        self.last_stats: Stats = {}

    def forward(self, z0: Tensor, z1: Tensor) -> Tensor:
        loss, self.last_stats = _amcl_barlow_twins(z0, z1, self.temperature_net, self.beta,
                                                   self.lambda_param, self.check_finite)
        return loss


__all__ = ["AMCLLoss", "AMCL_PAPER", "AMCL_PAPER_BETA_RANGE", "BOUND_WARNING", "amcl", "amcl_simsiam", "amcl_barlow_twins", "pair_term", "AMCLSimSiamLoss", "AMCLBarlowTwinsLoss", "PairTemperature",
           "ConstantTemperature", "MultiHeadProjection", "omega"]
