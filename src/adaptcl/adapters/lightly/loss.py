"""Drop-in replacements for ``lightly.loss`` losses, computed by :mod:`adaptcl.plugins`.

Each loss has the constructor order and call signature of its Lightly counterpart
(``NTXentLoss(temperature, memory_bank_size, gather_distributed)``, ``DCLLoss(temperature,
weight_fn, gather_distributed)``, ``MACLLoss(temperature, alpha, A_0)``, ``forward(out0,
out1)``), keeps its hyper-parameters readable and settable as attributes
(``loss.temperature = 0.2``), and adds the keyword-only options of the core (``form``,
``check_finite``, ``tile_size``, ``persistent_memory_bank``). The memory
bank and the distributed gather are Lightly's, wired once in :class:`~.memory_bank.MemoryBankLoss`.

Defaults that differ from Lightly's, so an aliased import never changes a value silently:
``MACLLoss`` and ``DCLLoss`` default to the temperature 0.1 of their papers (as Lightly's
``MACLLoss`` and ``DCLLoss``); ``NTXentLoss`` keeps Lightly's 0.5. Temperatures must be > 0
(Lightly accepts negative ones), MACL's ``alpha`` may exceed 1 (the paper's SimCSE setting is
2) and its adaptive temperature is clamped to a positive floor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from lightly.loss.dcl_loss import negative_mises_fisher_weights
from lightly.utils import dist as lightly_dist
from torch import Tensor, nn

from adaptcl import plugins
from adaptcl.plugins import amcl as _amcl
from adaptcl.plugins.amcl import NegativeTerm, Objective
from adaptcl.plugins.ascl import ASCLMode
from adaptcl.plugins.macl import TemperatureForm, WeightForm
from adaptcl.plugins.validation import (
    TileSize,
    check_finite_number,
    check_int,
    check_non_negative,
    check_positive,
)

from .memory_bank import InBatchForm, MemoryBankLoss, MultiHeadBankLoss, core_attribute, same_dtype

__all__ = ["NTXentLoss", "DCLLoss", "DCLWLoss", "FlatNCELoss", "DualTemperatureLoss",
           "MACLLoss", "ASCLLoss", "AMCLLoss"]

BankSize = int | Sequence[int]


class NTXentLoss(MemoryBankLoss):
    """Contrastive cross-entropy (NT-Xent / InfoNCE), a drop-in for ``lightly.loss.NTXentLoss``.

    Same arguments, defaults and value as Lightly's loss (SimCLR [0] without a memory bank, MoCo
    [1] with one), computed by :class:`adaptcl.plugins.InfoNCELoss` in float32 with masked
    logits; ``last_stats`` exposes alignment, ``W = 1 - P_pos`` and the plain loss.

    - [0] SimCLR, 2020, https://arxiv.org/abs/2002.05709
    - [1] MoCo, 2020, https://arxiv.org/abs/1911.05722

    Args:
        temperature: scale logits by the inverse of the temperature (> 0).
        memory_bank_size: ``(num_features, dim)`` of the memory bank, 0 disables it.
        gather_distributed: gather negatives from every GPU before the loss.
        form: in-batch candidate set without a memory bank: ``"nt_xent"`` (Lightly's, 2N-2
            negatives), ``"cross_view"`` (N-1 cross-view negatives, one direction) or
            ``"cross_view_symmetric"``.
        persistent_memory_bank: save the memory bank in ``state_dict`` (Lightly does not).
        memory_bank_labels: keep the class of every bank entry, for ``labels`` with a bank.
        check_finite: NaN/inf embeddings are a ``ValueError`` on the CPU; on a GPU a NaN
            loss (which a ``GradScaler`` skips) and a ``NonFiniteWarning``, never a wait
            (:func:`~adaptcl.plugins.validation.check_all_finite`).
        tile_size: ``"auto"`` (default: the fastest exact path that fits; on the CPU without
            a budget, the materialised logits), ``None`` (materialise) or an int (stream the
            similarity matrix in tiles, memory linear in the batch); see
            :class:`adaptcl.plugins.InfoNCELoss` and :class:`adaptcl.plugins.tiling`.

    ``loss_fn(out0, out1, labels)`` with the class of each pair (``[N]`` integers or one-hot
    rows) is supervised contrastive learning (SupCon's ``L_out``, Khosla et al. 2020): every
    candidate of the anchor's class is a positive, see :mod:`adaptcl.plugins.targets`.

    Examples:
        >>> # from lightly.loss import NTXentLoss
        >>> from adaptcl.adapters.lightly import NTXentLoss
        >>> loss_fn = NTXentLoss(temperature=0.5)
        >>> out0, out1 = torch.randn(8, 16), torch.randn(8, 16)
        >>> loss = loss_fn(out0, out1)
        >>> supcon = loss_fn(out0, out1, torch.tensor([0, 1, 1, 0, 2, 2, 0, 1]))
    """

    def __init__(self, temperature: float = 0.5, memory_bank_size: BankSize = 0,
                 gather_distributed: bool = False, *, form: InBatchForm = "nt_xent",
                 persistent_memory_bank: bool = False, memory_bank_labels: bool = False,
                 check_finite: bool = True, tile_size: TileSize = "auto") -> None:
        super().__init__(functools.partial(plugins.InfoNCELoss, temperature), memory_bank_size,
                         gather_distributed, form=form,
                         persistent_memory_bank=persistent_memory_bank,
                         check_finite=check_finite, tile_size=tile_size,
                         memory_bank_labels=memory_bank_labels)

    temperature = core_attribute("temperature", check_positive)


class DCLLoss(MemoryBankLoss):
    """Decoupled contrastive loss [0], a drop-in for ``lightly.loss.DCLLoss``.

    The positive pair leaves the denominator. ``weight_fn(out0, out1)`` (e.g. Lightly's
    ``negative_mises_fisher_weights``) scales each anchor's positive term and is called, as in
    Lightly, on the normalised local views once per direction. Beyond Lightly's loss it takes a
    memory bank (keyword-only) and the other in-batch forms.

    - [0] Yeh et al., Decoupled Contrastive Learning, ECCV 2022, https://arxiv.org/abs/2110.06848

    Args:
        temperature: similarities are scaled by its inverse (> 0).
        weight_fn: ``None`` or a function of the two normalised views returning ``[N]`` weights.
        gather_distributed: gather negatives from every GPU before the loss.
        memory_bank_size, form, persistent_memory_bank, check_finite, tile_size: as in
            :class:`NTXentLoss`.

    Examples:
        >>> from lightly.loss.dcl_loss import negative_mises_fisher_weights
        >>> loss_fn = DCLLoss(0.1, negative_mises_fisher_weights)
        >>> loss = loss_fn(torch.randn(8, 16), torch.randn(8, 16))
    """

    def __init__(self, temperature: float = 0.1,
                 weight_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
                 gather_distributed: bool = False, *, memory_bank_size: BankSize = 0,
                 form: InBatchForm = "nt_xent", persistent_memory_bank: bool = False,
                 check_finite: bool = True, tile_size: TileSize = "auto") -> None:
        if weight_fn is not None and not callable(weight_fn):
            raise TypeError(
                f"weight_fn must be callable or None, got {type(weight_fn).__name__} (Lightly's "
                "order is DCLLoss(temperature, weight_fn, gather_distributed); pass a memory bank "
                "as memory_bank_size=...)")
        super().__init__(functools.partial(plugins.DCLLoss, temperature), memory_bank_size,
                         gather_distributed, form=form,
                         persistent_memory_bank=persistent_memory_bank,
                         check_finite=check_finite, tile_size=tile_size)
        self.weight_fn = weight_fn

    temperature = core_attribute("temperature", check_positive)

    def forward(self, out0: Tensor, out1: Tensor) -> Tensor:
        """DCL loss of the positive pairs ``(out0[i], out1[i])``, as ``lightly.loss.DCLLoss``."""
        out0, out1 = same_dtype(out0, out1)
        loss = super().forward(out0, out1)
        world = lightly_dist.world_size() if self.gather_distributed else 1
        if self.weight_fn is None or (not self.uses_memory_bank and out0.shape[0] * world == 1):
            return loss  # a single pair has no negatives: the core's 0 stands, weighted or not
        # The core's positive term is -s_ii / tau per anchor; Lightly's is -w_i s_ii / tau.
        # Adding (1 - w_i) s_ii / tau, averaged over the anchors the core averages, gives
        # Lightly's value and gradient (also through a differentiable weight_fn).
        a0, a1 = F.normalize(out0, dim=1), F.normalize(out1, dim=1)
        positive = (a0 * a1).sum(dim=1) / self.temperature
        one_direction = self.form in ("cross_view", "queue")
        directions = [(a0, a1)] if one_direction else [(a0, a1), (a1, a0)]
        terms = [((1 - self.weight_fn(x, y)) * positive).mean() for x, y in directions]
        loss = loss + torch.stack(terms).mean()
        self.criterion.last_stats["loss"] = loss.detach()
        return loss

    def extra_repr(self) -> str:
        return f"weight_fn={self.weight_fn!r}, {super().extra_repr()}"


class DCLWLoss(DCLLoss):
    """Weighted DCL [0], a drop-in for ``lightly.loss.DCLWLoss``: ``DCLLoss`` with Lightly's
    negative von Mises-Fisher weights of scale ``sigma``.

    - [0] Yeh et al., Decoupled Contrastive Learning, ECCV 2022, https://arxiv.org/abs/2110.06848

    Examples:
        >>> loss_fn = DCLWLoss(temperature=0.1, sigma=0.5)
        >>> loss = loss_fn(torch.randn(8, 16), torch.randn(8, 16))
    """

    def __init__(self, temperature: float = 0.1, sigma: float = 0.5,
                 gather_distributed: bool = False, **kwargs: Any) -> None:
        sigma = check_positive("sigma", sigma)
        super().__init__(temperature, functools.partial(negative_mises_fisher_weights,
                                                        sigma=sigma),
                         gather_distributed, **kwargs)
        self.sigma = sigma

    def extra_repr(self) -> str:
        return f"sigma={self.sigma}, {MemoryBankLoss.extra_repr(self)}"


class FlatNCELoss(MemoryBankLoss):
    """FlatNCE [0] (value 1, DCL's gradient) with ``NTXentLoss``'s signature.

    - [0] Chen et al., Simpler, Faster, Stronger: Breaking the log-K Curse on Contrastive
      Learners with FlatNCE, 2021, https://arxiv.org/abs/2107.01152

    Examples:
        >>> loss_fn = FlatNCELoss(temperature=0.1)
        >>> loss = loss_fn(torch.randn(8, 16), torch.randn(8, 16))
    """

    def __init__(self, temperature: float = 0.1, memory_bank_size: BankSize = 0,
                 gather_distributed: bool = False, *, form: InBatchForm = "nt_xent",
                 persistent_memory_bank: bool = False, check_finite: bool = True,
                 tile_size: TileSize = "auto") -> None:
        super().__init__(functools.partial(plugins.FlatNCELoss, temperature), memory_bank_size,
                         gather_distributed, form=form,
                         persistent_memory_bank=persistent_memory_bank,
                         check_finite=check_finite, tile_size=tile_size)

    temperature = core_attribute("temperature", check_positive)


class DualTemperatureLoss(MemoryBankLoss):
    """Dual-temperature InfoNCE [0] with ``NTXentLoss``'s signature.

    - [0] Zhang et al., Dual Temperature Helps Contrastive Learning Without Many Negative
      Samples, CVPR 2022, https://arxiv.org/abs/2203.17248

    Examples:
        >>> loss_fn = DualTemperatureLoss(temperature=0.1, temperature_beta=1.0)
        >>> loss = loss_fn(torch.randn(8, 16), torch.randn(8, 16))
    """

    def __init__(self, temperature: float = 0.1, temperature_beta: float = 1.0,
                 memory_bank_size: BankSize = 0, gather_distributed: bool = False,
                 *, form: InBatchForm = "nt_xent", persistent_memory_bank: bool = False,
                 check_finite: bool = True, tile_size: TileSize = "auto") -> None:
        super().__init__(functools.partial(plugins.DualTemperatureLoss, temperature,
                                           temperature_beta), memory_bank_size,
                         gather_distributed, form=form,
                         persistent_memory_bank=persistent_memory_bank,
                         check_finite=check_finite, tile_size=tile_size)

    temperature = core_attribute("temperature", check_positive)
    temperature_beta = core_attribute("temperature_beta", check_positive)


class MACLLoss(MemoryBankLoss):
    """Model-Aware Contrastive Loss [0], a drop-in for ``lightly.loss.MACLLoss``.

    The temperature adapts to the alignment of the batch's positive pairs,
    ``tau_a = tau0 * (1 + alpha * (A - A0))`` (clamped to a positive floor), and each anchor's
    loss is reweighted by ``sg(1 / W)``, ``W = 1 - P_pos``, computed in log space. With
    ``alpha=0, reweight=False`` it equals ``lightly.loss.NTXentLoss(temperature)``, with and
    without a memory bank. The paper's settings: SimCLR ``(0.1, 0.5, 0)``, MoCo v2
    ``(0.15, 0.5, 0.2)``.

    Lightly's positional order ``MACLLoss(temperature, alpha, A_0)`` and attributes
    (``temperature``, ``alpha``, ``A_0``, ``eps``) work unchanged. Unlike Lightly's loss it
    supports a memory bank and ``gather_distributed`` (the alignment is all-reduced so every
    rank uses the same temperature), accepts alpha > 1, and stays finite when ``P_pos`` rounds
    to 1 (Lightly's ``1 / (1 - P + eps)`` reaches about 1e8).

    - [0] Huang et al., Model-Aware Contrastive Learning: Towards Escaping the Dilemmas,
      ICML 2023, https://arxiv.org/abs/2207.07874

    Args:
        temperature: tau0, the base temperature.
        alpha: how much the temperature follows the alignment (>= 0).
        a0: initial alignment threshold A0 (``A_0`` is Lightly's name for it).
        memory_bank_size: ``(num_features, dim)`` of a MoCo-style memory bank, 0 disables it.
        gather_distributed: gather negatives from every GPU and all-reduce the alignment.
        reweight, adaptive, temperature_form, weight_form, min_temperature: ablation switches
            of :class:`adaptcl.plugins.MACLLoss`; ``min_temperature`` defaults to a tenth of
            ``temperature`` and follows it when ``temperature`` is set later.
        form, persistent_memory_bank, memory_bank_labels, check_finite, tile_size: as in
            :class:`NTXentLoss` (``labels`` need ``reweight=False``).

    Examples:
        >>> # from lightly.loss import MACLLoss
        >>> from adaptcl.adapters.lightly import MACLLoss
        >>> loss_fn = MACLLoss(0.1, 0.5, 0.0)
        >>> loss = loss_fn(torch.randn(8, 16), torch.randn(8, 16))
        >>> tau, mean_w = loss_fn.last_stats["temperature"], loss_fn.last_stats["mean_w"]
    """

    def __init__(self, temperature: float = 0.1, alpha: float = 0.5, a0: float = 0.0,
                 memory_bank_size: BankSize = 0, gather_distributed: bool = False,
                 *, reweight: bool = True, adaptive: bool = True,
                 temperature_form: TemperatureForm = "linear", weight_form: WeightForm = "inverse",
                 min_temperature: float | None = None, form: InBatchForm = "nt_xent",
                 persistent_memory_bank: bool = False, memory_bank_labels: bool = False,
                 A_0: float | None = None, check_finite: bool = True,
                 tile_size: TileSize = "auto") -> None:
        core = functools.partial(
            plugins.MACLLoss, temperature, alpha, a0 if A_0 is None else A_0,
            reweight=reweight, adaptive=adaptive, temperature_form=temperature_form,
            weight_form=weight_form, min_temperature=min_temperature)
        super().__init__(core, memory_bank_size, gather_distributed, form=form,
                         persistent_memory_bank=persistent_memory_bank,
                         check_finite=check_finite, tile_size=tile_size,
                         memory_bank_labels=memory_bank_labels)
        self._floor_follows_temperature = min_temperature is None

    @property
    def temperature(self) -> float:
        """tau0, the base temperature; the adaptive one is ``last_stats["temperature"]``."""
        return self.criterion.temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        floor = self.criterion.min_temperature / self.criterion.temperature
        self.criterion.temperature = check_positive("temperature", value)
        if self._floor_follows_temperature:  # keep the default floor at its share of tau0
            self.criterion.min_temperature = floor * self.criterion.temperature

    alpha = core_attribute("alpha", check_non_negative)
    a0 = core_attribute("a0", check_finite_number)
    A_0 = core_attribute("a0", check_finite_number, public_name="A_0")

    @property
    def eps(self) -> float:
        """0: ``V = 1 / (1 - P_pos)`` is computed exactly in log space (Lightly adds 1e-8)."""
        return 0.0


class ASCLLoss(MemoryBankLoss):
    """Adaptive Soft Contrastive Loss [0] with ``NTXentLoss``'s signature.

    ``forward(out0, out1)`` takes the query (strong view, ``out0``) and the key (weak view from
    a momentum encoder, ``out1``). The soft targets come from the sharpened similarity of the
    key to the memory-bank entries (Eq. 5-11): ``mode="hard"``, ``"ahcl"`` or ``"ascl"``. ASCL
    is a MoCo-style loss: give it a memory bank (``memory_bank_size=(4096, dim)`` in the paper
    for CIFAR); with ``num_neighbors=0`` it is MoCo's InfoNCE. Without a memory bank the other
    keys of the batch are the negatives (the core's ``form="cross_view"``).

    - [0] Feng & Patras, Adaptive Soft Contrastive Learning, ICPR 2022,
      https://arxiv.org/abs/2207.11163

    Examples:
        >>> loss_fn = ASCLLoss(temperature=0.1, sharpen_temperature=0.05, num_neighbors=1,
        ...                    memory_bank_size=(64, 16))
        >>> query, key = torch.randn(8, 16), torch.randn(8, 16)  # key: momentum encoder
        >>> loss = loss_fn(query, key)
        >>> confidence = loss_fn.last_stats["confidence"]
    """

    def __init__(self, temperature: float = 0.1, sharpen_temperature: float = 0.05,
                 num_neighbors: int = 1, mode: ASCLMode = "ascl",
                 memory_bank_size: BankSize = 0, gather_distributed: bool = False,
                 *, persistent_memory_bank: bool = False, check_finite: bool = True,
                 tile_size: TileSize = "auto") -> None:
        core = functools.partial(plugins.ASCLLoss, temperature, sharpen_temperature,
                                 num_neighbors, mode)
        super().__init__(core, memory_bank_size, gather_distributed, form="cross_view",
                         persistent_memory_bank=persistent_memory_bank,
                         check_finite=check_finite, tile_size=tile_size, forms=("cross_view",))

    temperature = core_attribute("temperature", check_positive)
    sharpen_temperature = core_attribute("sharpen_temperature", check_positive)


class AMCLLoss(MultiHeadBankLoss):
    """AMCL loss (NT-Xent / InfoNCE forms, Table 2) with ``NTXentLoss``'s call signature.

    Owns the learned :class:`~adaptcl.plugins.PairTemperature` network (its parameters
    train with the model: keep the loss inside the LightningModule / optimiser).
    ``forward(out0, out1)`` takes ``[C, N, D]`` from an
    :class:`~adaptcl.adapters.lightly.AMCLProjectionHead` (or ``[N, D]`` for one head). With a
    memory bank (MoCo) every head has its own ``(K, D)`` queue; the C queues share one Lightly
    bank whose rows hold the C keys of a sample side by side (``memory_bank.size`` is
    ``(K, C * D)``).

    - [0] Wang et al., Adaptive Multi-head Contrastive Learning, ECCV 2024,
      https://arxiv.org/abs/2310.05615

    Args:
        dim: head output dimension d' (input of the temperature network and of Omega).
        beta: weight of the temperature regulariser Omega (paper: 1e-5 ... 10).
        negative_term: ``"softmax"`` (default; Eq. 7) or ``"topk"`` (mean of the kappa hardest
            negatives); the top-1 form degenerates, see :class:`adaptcl.plugins.AMCLLoss`.
        kappa: negatives in the top-kappa term.
        objective: ``"nt_xent"`` (Table 2.1) or ``"infonce"`` (Table 2.4).
        eta, iota: temperature bounds ``(eta, eta + iota)`` (paper: 1e-5 and 2 on CIFAR).
        memory_bank_size: ``(num_features, dim)`` per head, 0 disables the bank.
        gather_distributed: gather in-batch candidates (or, with a bank, keys) from every rank.
        num_heads: number of heads C (the bank keeps one queue per head).
        form: in-batch candidate set without a memory bank.
        temperature_net: a custom temperature module (e.g. ``plugins.ConstantTemperature``).
        persistent_memory_bank, check_finite, tile_size: as in :class:`NTXentLoss`.
        bound_warning_steps: warn once when the learned temperatures sit at a bound this many
            training steps in a row (``None`` disables); see :class:`adaptcl.plugins.AMCLLoss`.

    Examples:
        >>> loss_fn = AMCLLoss(dim=16, num_heads=2)   # soft-max negatives, beta 1e-3
        >>> z0, z1 = torch.randn(2, 8, 16), torch.randn(2, 8, 16)   # [heads, batch, dim]
        >>> loss = loss_fn(z0, z1)
        >>> tau = loss_fn.last_stats["temperature"]
    """

    def __init__(self, dim: int, beta: float = 1e-3, negative_term: NegativeTerm = "softmax",
                 kappa: int = 1, objective: Objective = "nt_xent", eta: float = 1e-5,
                 iota: float = 2.0, memory_bank_size: BankSize = 0,
                 gather_distributed: bool = False, *, num_heads: int = 1,
                 form: InBatchForm = "nt_xent", temperature_net: nn.Module | None = None,
                 persistent_memory_bank: bool = False, check_finite: bool = True,
                 tile_size: TileSize = "auto",
                 bound_warning_steps: int | None = 100) -> None:
        check_int("dim", dim, 1)
        net = (_amcl.PairTemperature(dim, eta=eta, iota=iota) if temperature_net is None
               else temperature_net)

        core = functools.partial(_amcl.AMCLLoss, net, beta, negative_term=negative_term,
                                 kappa=kappa, objective=objective,
                                 bound_warning_steps=bound_warning_steps)
        super().__init__(core, memory_bank_size, gather_distributed, num_heads=num_heads,
                         form=form, persistent_memory_bank=persistent_memory_bank,
                         check_finite=check_finite, tile_size=tile_size)

    @property
    def temperature_net(self) -> nn.Module:
        """The pair-temperature network (learned with the model)."""
        return self.criterion.temperature_net
