"""Adaptive Multi-head Contrastive Learning (AMCL): the loss in its NT-Xent / InfoNCE forms.

Reference:
    Wang, Koniusz et al., "Adaptive Multi-head Contrastive Learning", ECCV 2024
    (arXiv:2310.05615). Table 2 gives the loss forms; Eq. (3)-(4) the temperatures and Omega.

AMCL changes the temperature of InfoNCE into a learned one per pair and per head: ``C``
projection heads (:class:`~adaptcl.plugins.MultiHeadProjection`) each produce ``z^c``; a shared
pair-temperature network (:class:`~adaptcl.plugins.PairTemperature`) gives every pair its
temperature, and the regulariser :func:`~adaptcl.plugins.omega` is added for positive pairs and
subtracted for negative pairs with weight ``beta`` (both in
:mod:`~adaptcl.plugins.amcl_temperature`). The SimSiam and Barlow Twins forms are in
:mod:`~adaptcl.plugins.amcl_noncontrastive`.

Negative terms: ``"topk"`` averages ``s/tau - beta Omega(tau)`` over the kappa most similar
negatives (kappa = 1 is Table 2's max); ``"softmax"`` is the paper's exact Eq. (7) form,
``logsumexp_n (s_n/tau_n - beta Omega(tau_n))``. With ``objective="infonce"`` (Table 2.4) the
positive joins the candidates of the max / log-sum-exp; ``"nt_xent"`` (Table 2.1) uses
negatives only. Temperatures stay differentiable (the network learns).

How the defaults were chosen, the paper's configuration :data:`AMCL_PAPER`, and why the
temperatures can degenerate to a bound: the docs' AMCL page.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor, nn

from ._products import gathered_product, logits_product
from .amcl_temperature import BoundMonitor, PairTemperature, omega
from .base import (
    ContrastiveLoss,
    Reduction,
    Stats,
    functional_candidates,
    loss_stats,
    reduce,
)
from .candidates import Candidates, Form, autocast_off
from .distributed import GatherFn
from .execution import TilePlan
from .heads import as_heads
from .kernel import no_negatives_output
from .tiles import _dispatch as dispatch
from .tiles._terms import RegularisedPairTerm, description
from .validation import TileSize, check_choice, check_int, check_non_negative, check_tile_size

#: the negative term of Table 2: the kappa hardest negatives, or the soft-max over all
NegativeTerm = Literal["topk", "softmax"]
NEGATIVE_TERMS: tuple[NegativeTerm, ...] = get_args(NegativeTerm)
#: the objective of Table 2: NT-Xent (2.1) or InfoNCE (2.4)
Objective = Literal["nt_xent", "infonce"]
OBJECTIVES: tuple[Objective, ...] = get_args(Objective)
#: ``[A, C]`` matrices of one head's materialised path at its peak, by negative term
#: (measured, :mod:`~adaptcl.plugins.tiles._budget`): cosines, pair temperatures, the pair term and
#: their gradients
AMCL_COPIES = {"softmax": 12, "topk": 6}
#: the top-kappa term as the dispatcher's problem names it (no kernel has it)
_TOP_KAPPA = "AMCL top-kappa term (negative_term='topk'; 'softmax' it has)"

#: The paper's stated settings for SimCLR / MoCo on the smaller datasets (Sec. 5, Fig. 5,
#: Appendix A): 3 heads, the top-kappa term with kappa = 100 in the NT-Xent form (Table 2.1),
#: bounds eta = 1e-5 and iota = 2, beta = 1. Keywords of :meth:`AMCLLoss.paper_config` and of
#: the Lightly and sentence-transformers ``AMCLLoss`` (``num_heads`` goes to the heads). Not
#: the default: at beta = 1 the top-kappa form is unbounded below (docs' AMCL page).
AMCL_PAPER: dict = {"num_heads": 3, "beta": 1.0, "negative_term": "topk", "kappa": 100,
                    "objective": "nt_xent", "eta": 1e-5, "iota": 2.0}
#: The range the paper searches beta over (Sec. 5 and Appendix, Fig. 9).
AMCL_PAPER_BETA_RANGE = (1e-5, 10.0)


def pair_term(s: Tensor, tau: Tensor, beta: float, dim: int) -> Tensor:
    """A negative pair's term ``s / tau - beta Omega(tau)`` (Eq. 7); the one formula of the
    top-kappa and softmax terms, materialised and tiled."""
    return s / tau - beta * omega(tau, dim)


class _PairTerm:
    """:func:`pair_term` with ``tau = net.squash(r)``, on tiles of the streaming engine
    (:class:`~adaptcl.plugins.tiles._loop.PairTerm`); its derivative is written out for the
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

    @property
    def name(self) -> str:
        """What a kernel says it lacks when the network describes nothing it knows."""
        return f"pair temperature of {type(self.net).__name__}"

    def describe(self) -> RegularisedPairTerm | None:
        """This term as the tiles' typed description, or ``None`` for a temperature network
        that describes nothing (the fused kernel then leaves it to the PyTorch loop)."""
        temperature = description(self.net)
        if temperature is None:
            return None
        return RegularisedPairTerm(temperature, self.beta, self.dim)



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
            al. 2024; :mod:`adaptcl.plugins.tiles._loop`), exactly: ``"softmax"`` recomputes each tile's
            pair temperatures in backward so the temperature network still learns; ``"topk"``
            merges the top-kappa across tiles and differentiates the gathered pairs. Needs a
            temperature network exposing ``features``, ``squash`` and ``squash_grad`` (as
            :class:`PairTemperature` and :class:`ConstantTemperature` do): a pair's
            temperature is ``squash(<features(a), features(b)>)``, recomputed inside a tile.
            A ``ValueError`` otherwise. ``"auto"`` (default) as in
            :class:`~adaptcl.plugins.InfoNCELoss`, the budget counting every head's pair
            matrices; a temperature network that cannot be tiled stays materialised. The fused
            kernel covers ``negative_term="softmax"`` with a :class:`PairTemperature` or
            :class:`ConstantTemperature` (``"topk"`` keeps the PyTorch path).
        bound_warning_steps: warn once per loss instance (``RuntimeWarning``,
            :data:`~adaptcl.plugins.amcl_temperature.BOUND_WARNING`) when the mean positive or
            the mean pair temperature of a :class:`PairTemperature` has stayed at ``eta`` or
            ``eta + iota`` for this many consecutive training steps (forward in ``train()``
            mode with gradients on), with no host-device synchronisation but one read per
            window (:class:`~adaptcl.plugins.amcl_temperature.BoundMonitor`); ``None`` disables
            it. Not tracked while ``torch.compile`` traces the loss.

    Among candidates tied exactly, the top-kappa takes the lowest columns (the positive, for
    ``objective="infonce"``, counts as the last column) in both paths, so the tiled and the
    materialised gradients agree even on ties. ``reduction="none"`` gives per-anchor losses
    summed over heads. The functional form is :func:`amcl`.

    ``forward(z0, z1, negatives=None)`` takes ``[C, N, D]`` (or ``[N, D]`` for one head); the
    per-head losses are summed (the paper's l = sum_c l_c) and averaged over anchors.
    With one head, a constant temperature, ``beta=0``, ``negative_term="softmax"`` and
    ``objective="infonce"`` it equals InfoNCE exactly.

    The default, ``negative_term="softmax"`` (Eq. 7) with ``beta=1e-3``, is the form that
    trained on the CIFAR-10 subset; ``negative_term="topk"`` with ``kappa`` is the paper's max /
    top-kappa form, and :meth:`paper_config` its full setting. Why the max form degenerates
    with a shared temperature, and what the runs showed: :doc:`the AMCL page </amcl>`.

    Examples:
        >>> net = PairTemperature(dim=32)
        >>> loss_fn = AMCLLoss(net, beta=1e-3, negative_term="topk", kappa=4)
        >>> z0, z1 = torch.randn(2, 16, 32), torch.randn(2, 16, 32)
        >>> loss = loss_fn(z0, z1)
    """

    def __init__(self, temperature_net: nn.Module, beta: float = 1e-3, *,
                 negative_term: NegativeTerm = "softmax", kappa: int = 1,
                 objective: Objective = "nt_xent",
                 form: Form = "nt_xent", gather_distributed: bool = False,
                 gather_fn: GatherFn | None = None, check_finite: bool = True,
                 tile_size: TileSize = "auto",
                 reduction: Reduction = "mean", bound_warning_steps: int | None = 100) -> None:
        super().__init__(form=form, gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size, reduction=reduction)
        options = _amcl_options(temperature_net, beta, negative_term, kappa, objective,
                                self.tile_size)
        self.temperature_net = options.pop("temperature_net")
        for name, value in options.items():
            setattr(self, name, value)
        self.bound_warning_steps = (None if bound_warning_steps is None else
                                    check_int("bound_warning_steps", bound_warning_steps, 1))
        self._bounds = BoundMonitor()

    @classmethod
    def paper_config(cls, dim: int, **overrides) -> AMCLLoss:
        """AMCL with the paper's settings (:data:`AMCL_PAPER`) and a fresh
        :class:`PairTemperature` of feature dimension ``dim``; ``overrides`` replace any of them.

        ``num_heads`` is not a setting of the loss (it takes ``[C, N, D]``): build the heads with
        ``MultiHeadProjection(..., num_heads=AMCL_PAPER["num_heads"])``.

        Examples:
            >>> from adaptcl.plugins import MultiHeadProjection
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
        if (self.bound_warning_steps is not None and not self._bounds.warned and self.training
                and torch.is_grad_enabled() and not torch.compiler.is_compiling()):
            means = torch.stack([self.last_stats["temperature"].float(),
                                 self.last_stats["negative_temperature"].float()])
            self._bounds.update(self.temperature_net, means, self.bound_warning_steps)
        return loss

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


def _amcl_options(temperature_net: nn.Module, beta: float, negative_term: NegativeTerm, kappa: int,
                  objective: Objective, tile_size: TileSize) -> dict:
    """AMCL's hyper-parameters checked once for the module and the functional form."""
    if not hasattr(temperature_net, "pairwise"):
        raise TypeError("temperature_net must be a PairTemperature or ConstantTemperature")
    if isinstance(check_tile_size(tile_size), int) and not _tileable(temperature_net):
        raise ValueError(
            f"tile_size needs a temperature network with features/squash/squash_grad (like "
            f"PairTemperature or ConstantTemperature) to recompute pair temperatures inside a "
            f"tile; {type(temperature_net).__name__} cannot be tiled: pass tile_size=None or "
            f"'auto'")
    return {"temperature_net": temperature_net, "beta": check_non_negative("beta", beta),
            "negative_term": check_choice("negative_term", negative_term, NEGATIVE_TERMS),
            "kappa": check_int("kappa", kappa, minimum=1),
            "objective": check_choice("objective", objective, OBJECTIVES)}


def _top_pairs(c: Candidates, net: nn.Module, tau_pos: Tensor, kappa: int, infonce: bool,
               plan: TilePlan) -> tuple[Tensor, Tensor, Tensor]:
    """Similarities and temperatures ``[A, kappa]`` of each anchor's kappa most similar
    candidates (the positive among them for InfoNCE, as column ``C``), and the mean pair
    temperature over all ``A x C`` pairs. Ties go to the lowest column in both paths."""
    available = c.num_negatives + infonce
    if kappa > available:
        raise ValueError(f"kappa={kappa} is larger than the {available} "
                         "candidates available to each anchor")
    num_keys, precision = c.keys.shape[0], c.product_precision
    if not plan.tiled:
        sims, taus = c.mask_(c.similarity()), _pair_temperatures(c, net)
        tau_mean = taus.detach().mean()
        if infonce:
            sims = torch.cat([sims, c.positive_sim[:, None]], dim=1)
            taus = torch.cat([taus, tau_pos[:, None].to(taus.dtype)], dim=1)
        columns = torch.arange(sims.shape[1], device=sims.device).expand_as(sims)
        top = dispatch.top_columns(sims.detach(), columns, kappa)[1]
        return sims.gather(1, top), taus.gather(1, top), tau_mean
    extra = c.positive_sim.detach() if infonce else None
    top = dispatch.streamed_top_columns(plan, c.anchors.detach(), c.keys.detach(), c.excluded,
                                        kappa, extra)
    is_pos = top == num_keys
    cols = top.clamp(max=num_keys - 1)
    s_k = gathered_product(c.anchors, c.keys[cols], precision)
    s_k = torch.where(is_pos, c.positive_sim[:, None], s_k)
    pa, pk = net.features(c.anchors), net.features(c.keys)
    t_k = net.squash(gathered_product(pa, pk[cols], precision))
    t_k = torch.where(is_pos, tau_pos[:, None].to(t_k.dtype), t_k)
    tau_mean = dispatch.pair_sum(plan, net.squash, pa.detach(), pk.detach()) / (
        c.num_anchors * num_keys)
    return s_k, t_k, tau_mean


def _pair_temperatures(c: Candidates, net: nn.Module) -> Tensor:
    """``[A, C]`` temperatures of every anchor-key pair: ``net.squash(phi(a) @ phi(k).T)``
    with the product at the candidates' precision where the network exposes that form (as
    :class:`PairTemperature` and :class:`ConstantTemperature` do), else ``net(a, k)``."""
    if not _tileable(net):
        return net(c.anchors, c.keys)
    with autocast_off(c.anchors):
        r = logits_product(net.features(c.anchors), net.features(c.keys), c.product_precision)
        return net.squash(r)


def _softmax_term(c: Candidates, net: nn.Module, beta: float, dim: int,
                  plan: TilePlan) -> tuple[Tensor, Tensor]:
    """``logsumexp_n pair_term(s_n, tau_n)`` over each anchor's negatives, and the mean pair
    temperature over all ``A x C`` pairs."""
    if not plan.tiled:
        tau = _pair_temperatures(c, net)
        terms = c.mask_(pair_term(c.similarity(), tau, beta, dim))
        return torch.logsumexp(terms, dim=1), tau.detach().mean()
    pa, pk = net.features(c.anchors), net.features(c.keys)
    dtype = c.anchors.dtype
    neg, tau_sum = dispatch.pair_lse(plan, c.anchors, c.keys, pa.to(dtype), pk.to(dtype),
                                     c.excluded, _PairTerm(net, beta, dim))
    return neg, tau_sum / (c.num_anchors * c.keys.shape[0])


def _head_loss(c: Candidates, net: nn.Module, dim: int, *, beta: float,
               negative_term: NegativeTerm, kappa: int, objective: Objective,
               plan: TilePlan) -> tuple[Tensor, Tensor, Tensor]:
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
            neg, tau_mean = _softmax_term(c, net, beta, dim, plan)
            if infonce:
                neg = torch.logaddexp(neg, pos - reg_pos)
        else:
            s_k, t_k, tau_mean = _top_pairs(c, net, tau_pos, kappa, infonce, plan)
            neg = pair_term(s_k, t_k, beta, dim).mean(dim=1)
        loss = -pos + reg_pos + neg
    return loss, tau_pos.detach().mean(), tau_mean.detach()


def _amcl(z0: Tensor, z1: Tensor, negatives: Tensor | None, build, net: nn.Module, *,
          beta: float, negative_term: NegativeTerm, kappa: int, objective: Objective,
          tile_size: TileSize) -> tuple[Tensor, Stats]:
    """AMCL's per-anchor losses (summed over heads) and statistics; ``build(z0, z1, neg)``
    makes one head's candidates."""
    z0, z1 = as_heads("z0", z0), as_heads("z1", z1)
    if z0.shape != z1.shape:
        raise ValueError(f"z0 and z1 must have the same shape, got {tuple(z0.shape)} and {tuple(z1.shape)}")
    if negatives is not None:
        negatives = as_heads("negatives", negatives)
        if negatives.shape[0] != z0.shape[0]:
            raise ValueError("negatives must have one [K, D] set per head")
    dim = z0.shape[-1]
    total, taus_pos, taus_neg, align, plan = 0.0, [], [], [], None
    for h in range(z0.shape[0]):
        cands = build(z0[h], z1[h], None if negatives is None else negatives[h])
        if h == 0:  # every head's pair matrices live until the backward
            plan = dispatch.plan(_problem(cands, net, beta, dim, negative_term, z0.shape[0]),
                                 tile_size)
        losses = []
        for c in cands:
            loss, tau_pos, tau = _head_loss(c, net, dim, beta=beta, negative_term=negative_term,
                                            kappa=kappa, objective=objective, plan=plan)
            losses.append(loss)
            taus_pos.append(tau_pos)
            taus_neg.append(tau)
        total = total + torch.cat(losses)
        align.append(cands[0].positive_sim.detach().mean())
    return total, loss_stats(total, temperature=torch.stack(taus_pos),
                             negative_temperature=torch.stack(taus_neg),
                             alignment=torch.stack(align), plan=plan)


def _problem(cands: list[Candidates], net: nn.Module, beta: float, dim: int,
             negative_term: NegativeTerm, heads: int):
    """One head's call as the dispatcher's problem: the softmax term streams its pair
    log-sum-exp (its pair term describes the temperature network, or names it), the top-kappa
    term a selection over every column; ``heads`` such calls live until the backward."""
    if negative_term == "softmax":
        op, pair = "pair_lse", _PairTerm(net, beta, dim)
    else:
        op, pair = "top_columns", _TOP_KAPPA
    return dispatch.describe("AMCL", cands, op=op, pair=pair, heads=heads,
                             copies=AMCL_COPIES[negative_term], tileable=_tileable(net))


def amcl(z0: Tensor, z1: Tensor, temperature_net: nn.Module, beta: float = 1e-3, *,
         negatives: Tensor | None = None, negative_term: NegativeTerm = "softmax", kappa: int = 1,
         objective: Objective = "nt_xent", form: Form = "nt_xent", gather_distributed: bool = False,
         gather_fn: GatherFn | None = None, check_finite: bool = True,
         tile_size: TileSize = "auto",
         reduction: Reduction = "mean") -> Tensor:
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
                                     tile_size=tile_size,
                                     reduction=reduction)

    return reduce(_amcl(z0, z1, negatives, build, net, **options, tile_size=tile_size)[0], reduction)


__all__ = ["NegativeTerm", "NEGATIVE_TERMS", "Objective", "OBJECTIVES", "AMCLLoss", "AMCL_PAPER",
           "AMCL_PAPER_BETA_RANGE", "amcl", "pair_term"]
