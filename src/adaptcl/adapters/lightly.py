"""Lightly adapter: drop-in losses, AMCL heads and an ASCL MoCo module.

The losses here have the call signature of ``lightly.loss.NTXentLoss``::

    loss_fn = MACLLoss(temperature=0.1, memory_bank_size=0, gather_distributed=False)
    loss = loss_fn(out0, out1)

so a working Lightly pipeline switches to MACL (or DCL, ASCL, ...) by changing one import.
The maths lives in :mod:`adaptcl.plugins`; this module only wires Lightly's own pieces to it:

- ``memory_bank_size`` uses Lightly's :class:`~lightly.models.modules.memory_bank.MemoryBankModule`
  (Lightly 1.6 wants a ``(num_features, dim)`` tuple; ``0`` disables it; a bare positive int is
  rejected by Lightly with its own error). As in ``NTXentLoss``, the bank stores the normalised
  ``out1`` and is updated only when ``out0`` requires a gradient; with a bank the loss is the
  MoCo form (positive ``out1[i]`` plus the bank's negatives).
- ``gather_distributed`` uses ``lightly.utils.dist.gather`` (gradient-carrying); the positive
  index is offset by the rank and MACL's alignment is all-reduced, so every rank uses one
  temperature. With a memory bank, batches are gathered before they enter the bank (Lightly's
  behaviour).

Lightly's bank buffer is ``persistent=False``: it is not saved in checkpoints. Pass
``persistent_memory_bank=True`` (the default of :class:`ASCLMoCo`) to save and restore it.

References:
    - MACL: Huang et al., "Model-Aware Contrastive Learning: Towards Escaping the Dilemmas",
      ICML 2023.
    - ASCL: Feng & Patras, "Adaptive Soft Contrastive Learning", ICPR 2022.
    - AMCL: Wang et al., "Adaptive Multi-head Contrastive Learning", ECCV 2024.
    - DCL: Yeh et al., "Decoupled Contrastive Learning", ECCV 2022.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from adaptcl import plugins
from adaptcl.adapters import require
from adaptcl.plugins import amcl as _amcl

require("lightly", "vision")

from lightly.models import utils as lightly_utils  # noqa: E402
from lightly.models.modules.heads import MoCoProjectionHead  # noqa: E402
from lightly.models.modules.memory_bank import MemoryBankModule  # noqa: E402
from lightly.utils import dist as lightly_dist  # noqa: E402

__all__ = [
    "NTXentLoss", "DCLLoss", "FlatNCELoss", "DualTemperatureLoss", "MACLLoss", "ASCLLoss",
    "AMCLLoss", "AMCLProjectionHead", "PairTemperature",
    "PersistentMemoryBankModule", "lightly_gather",
    "ASCLMoCo", "ASCLTransform", "WeakViewTransform", "CIFAR10_NORMALIZE",
]

#: CIFAR-10 channel statistics, for Lightly transforms' ``normalize=`` argument.
CIFAR10_NORMALIZE = {"mean": [0.4914, 0.4822, 0.4465], "std": [0.2470, 0.2435, 0.2616]}


def lightly_gather(x: Tensor) -> tuple[Tensor, ...]:
    """``lightly.utils.dist.gather`` (gradient-carrying), or ``(x,)`` outside a process group."""
    if lightly_dist.world_size() > 1:
        return tuple(lightly_dist.gather(x))
    return (x,)


class PersistentMemoryBankModule(MemoryBankModule):
    """Lightly's ``MemoryBankModule`` whose bank and pointer are saved in ``state_dict``.

    Lightly registers ``bank`` and ``bank_ptr`` with ``persistent=False``, so a MoCo queue is
    lost when a run resumes from a checkpoint. This subclass re-registers both buffers as
    persistent; the queueing logic is Lightly's, unchanged.

    Examples:
        >>> bank = PersistentMemoryBankModule(size=(4096, 128))
        >>> "bank" in bank.state_dict()
        True
    """

    def __init__(self, size: int | Sequence[int], gather_distributed: bool = False,
                 feature_dim_first: bool = True) -> None:
        super().__init__(size=size, gather_distributed=gather_distributed,
                         feature_dim_first=feature_dim_first)
        for name in ("bank", "bank_ptr"):
            value = getattr(self, name)
            delattr(self, name)  # also drops the name from the non-persistent set
            self.register_buffer(name, value, persistent=True)


def _make_memory_bank(size: int | Sequence[int], gather_distributed: bool,
                      persistent: bool) -> MemoryBankModule:
    cls = PersistentMemoryBankModule if persistent else MemoryBankModule
    # (num_features, dim) rows: the core takes negatives as [K, D].
    return cls(size=size, gather_distributed=gather_distributed, feature_dim_first=False)


class _LightlyContrastiveLoss(nn.Module):
    """Shared wiring of the drop-in losses: Lightly's memory bank and distributed gather.

    Subclasses build the core loss in :meth:`_make_core` for the form chosen here: the
    in-batch ``form`` without a memory bank, ``"queue"`` with one.
    """

    def __init__(self, memory_bank_size: int | Sequence[int] = 0,
                 gather_distributed: bool = False, form: str = "nt_xent",
                 persistent_memory_bank: bool = False, tile_size: int | None = None) -> None:
        super().__init__()
        if not isinstance(gather_distributed, bool):
            raise TypeError("gather_distributed must be a bool, got "
                            f"{type(gather_distributed).__name__}")
        if gather_distributed and not torch.distributed.is_available():
            raise ValueError(
                "gather_distributed is True but torch.distributed is not available. Please set "
                "gather_distributed=False or install a torch version with distributed support."
            )
        self.memory_bank = _make_memory_bank(memory_bank_size, gather_distributed,
                                             persistent_memory_bank)
        self.gather_distributed = gather_distributed
        self.uses_memory_bank = self.memory_bank.size[0] > 0
        if form not in plugins.FORMS or form == "queue":
            allowed = tuple(f for f in plugins.FORMS if f != "queue")
            raise ValueError(
                f"form must be one of {allowed} (the queue form is chosen by memory_bank_size), "
                f"got {form!r}"
            )
        self.form = "queue" if self.uses_memory_bank else form
        self.criterion: plugins.base.ContrastiveLoss = self._make_core(
            form=self.form, gather_distributed=gather_distributed,
            gather_fn=lightly_gather if gather_distributed else None, tile_size=tile_size,
        )

    def _make_core(self, **kwargs: Any) -> nn.Module:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def temperature(self) -> float:
        """The (base) temperature; MACL's adaptive one is ``last_stats["temperature"]``."""
        return self.criterion.temperature

    @property
    def last_stats(self) -> dict[str, Tensor]:
        """What the core loss computed in the last call (detached 0-d tensors)."""
        return self.criterion.last_stats

    def forward(self, out0: Tensor, out1: Tensor) -> Tensor:
        """Loss of the positive pairs ``(out0[i], out1[i])``, as ``NTXentLoss.forward``.

        Args:
            out0: output projections of the first views, shape ``(batch_size, dim)``.
            out1: output projections of the second views, shape ``(batch_size, dim)``; with a
                memory bank these (normalised) enter the bank after the loss, as in Lightly.
        """
        if not self.uses_memory_bank:
            return self.criterion(out0, out1)
        # Lightly's bank holds the normalised out1 and is only updated in training.
        _, negatives = self.memory_bank(F.normalize(out1.detach(), dim=1),
                                        update=out0.requires_grad)
        return self.criterion(out0, out1, negatives.to(device=out0.device))

    def extra_repr(self) -> str:
        size = tuple(self.memory_bank.size)
        return f"memory_bank_size={size if size != (0,) else 0}, gather_distributed={self.gather_distributed}"


class NTXentLoss(_LightlyContrastiveLoss):
    """Contrastive cross-entropy (NT-Xent / InfoNCE), a drop-in for ``lightly.loss.NTXentLoss``.

    Same arguments, defaults and value as Lightly's loss (SimCLR [0] without a memory bank, MoCo
    [1] with one), computed by :class:`adaptcl.plugins.InfoNCELoss` in float32 with masked
    logits; ``last_stats`` exposes alignment, ``W = 1 - P_pos`` and the plain loss.

    - [0] SimCLR, 2020, https://arxiv.org/abs/2002.05709
    - [1] MoCo, 2020, https://arxiv.org/abs/1911.05722

    Args:
        temperature: scale logits by the inverse of the temperature.
        memory_bank_size: ``(num_features, dim)`` of the memory bank, 0 disables it.
        gather_distributed: gather negatives from every GPU before the loss.
        form: in-batch candidate set without a memory bank: ``"nt_xent"`` (Lightly's, 2N-2
            negatives), ``"cross_view"`` (N-1 cross-view negatives, one direction) or
            ``"cross_view_symmetric"``.
        persistent_memory_bank: save the memory bank in ``state_dict`` (Lightly does not).

    Examples:
        >>> # from lightly.loss import NTXentLoss
        >>> from adaptcl.adapters.lightly import NTXentLoss
        >>> loss_fn = NTXentLoss(temperature=0.5)
        >>> out0, out1 = model(t0), model(t1)
        >>> loss = loss_fn(out0, out1)
    """

    def __init__(self, temperature: float = 0.5, memory_bank_size: int | Sequence[int] = 0,
                 gather_distributed: bool = False, *, form: str = "nt_xent",
                 persistent_memory_bank: bool = False, tile_size: int | None = None) -> None:
        self._temperature = temperature
        super().__init__(memory_bank_size, gather_distributed, form, persistent_memory_bank,
                         tile_size)

    def _make_core(self, **kwargs: Any) -> nn.Module:
        return plugins.InfoNCELoss(self._temperature, **kwargs)


class DCLLoss(_LightlyContrastiveLoss):
    """Decoupled contrastive loss [0] with ``NTXentLoss``'s signature (memory bank, gather).

    The positive pair leaves the denominator. Without a memory bank and in the default
    ``form="nt_xent"`` it equals ``lightly.loss.DCLLoss(temperature)`` (no weight function).

    - [0] Yeh et al., Decoupled Contrastive Learning, ECCV 2022, https://arxiv.org/abs/2110.06848

    Examples:
        >>> loss_fn = DCLLoss(temperature=0.1)
        >>> loss = loss_fn(model(t0), model(t1))
    """

    def __init__(self, temperature: float = 0.1, memory_bank_size: int | Sequence[int] = 0,
                 gather_distributed: bool = False, *, form: str = "nt_xent",
                 persistent_memory_bank: bool = False, tile_size: int | None = None) -> None:
        self._temperature = temperature
        super().__init__(memory_bank_size, gather_distributed, form, persistent_memory_bank,
                         tile_size)

    def _make_core(self, **kwargs: Any) -> nn.Module:
        return plugins.DCLLoss(self._temperature, **kwargs)


class FlatNCELoss(DCLLoss):
    """FlatNCE [0] (value 1, DCL's gradient) with ``NTXentLoss``'s signature.

    - [0] Chen et al., Simpler, Faster, Stronger: Breaking the log-K Curse on Contrastive
      Learners with FlatNCE, 2021, https://arxiv.org/abs/2107.01152

    Examples:
        >>> loss_fn = FlatNCELoss(temperature=0.1)
        >>> loss = loss_fn(model(t0), model(t1))
    """

    def _make_core(self, **kwargs: Any) -> nn.Module:
        return plugins.FlatNCELoss(self._temperature, **kwargs)


class DualTemperatureLoss(_LightlyContrastiveLoss):
    """Dual-temperature InfoNCE [0] with ``NTXentLoss``'s signature.

    - [0] Zhang et al., Dual Temperature Helps Contrastive Learning Without Many Negative
      Samples, CVPR 2022, https://arxiv.org/abs/2203.17248

    Examples:
        >>> loss_fn = DualTemperatureLoss(temperature=0.1, temperature_beta=1.0)
        >>> loss = loss_fn(model(t0), model(t1))
    """

    def __init__(self, temperature: float = 0.1, temperature_beta: float = 1.0,
                 memory_bank_size: int | Sequence[int] = 0, gather_distributed: bool = False,
                 *, form: str = "nt_xent", persistent_memory_bank: bool = False,
                 tile_size: int | None = None) -> None:
        self._temperature = temperature
        self._temperature_beta = temperature_beta
        super().__init__(memory_bank_size, gather_distributed, form, persistent_memory_bank,
                         tile_size)

    def _make_core(self, **kwargs: Any) -> nn.Module:
        return plugins.DualTemperatureLoss(self._temperature, self._temperature_beta, **kwargs)


class MACLLoss(_LightlyContrastiveLoss):
    """Model-Aware Contrastive Loss [0] with ``NTXentLoss``'s signature.

    The temperature adapts to the alignment of the batch's positive pairs,
    ``tau_a = tau0 * (1 + alpha * (A - A0))`` (clamped to a positive floor), and each anchor's
    loss is reweighted by ``sg(1 / W)``, ``W = 1 - P_pos``, computed in log space. With
    ``alpha=0, reweight=False`` it equals ``lightly.loss.NTXentLoss(temperature)``, with and
    without a memory bank. The paper's settings: SimCLR ``(0.1, 0.5, 0)``, MoCo v2
    ``(0.15, 0.5, 0.2)``.

    Unlike ``lightly.loss.MACLLoss`` it supports a memory bank and ``gather_distributed`` (the
    alignment is all-reduced so every rank uses the same temperature), accepts alpha > 1, and
    stays finite when ``P_pos`` rounds to 1. ``A_0`` is accepted as an alias of ``a0`` so
    ``lightly.loss.MACLLoss(temperature, alpha, A_0)`` calls work unchanged.

    - [0] Huang et al., Model-Aware Contrastive Learning: Towards Escaping the Dilemmas,
      ICML 2023, https://arxiv.org/abs/2207.07874

    Args:
        temperature: tau0, the base temperature.
        alpha: how much the temperature follows the alignment (>= 0).
        a0: initial alignment threshold A0.
        memory_bank_size: ``(num_features, dim)`` of a MoCo-style memory bank, 0 disables it.
        gather_distributed: gather negatives from every GPU and all-reduce the alignment.
        reweight, adaptive, temperature_form, weight_form, min_temperature: ablation switches
            of :class:`adaptcl.plugins.MACLLoss`.
        form: in-batch candidate set without a memory bank (see :class:`NTXentLoss`).
        persistent_memory_bank: save the memory bank in ``state_dict``.

    Examples:
        >>> # from lightly.loss import NTXentLoss
        >>> from adaptcl.adapters.lightly import MACLLoss
        >>> loss_fn = MACLLoss(temperature=0.1, alpha=0.5, a0=0.0)
        >>> loss = loss_fn(model(t0), model(t1))
        >>> loss_fn.last_stats["temperature"], loss_fn.last_stats["mean_w"]
    """

    def __init__(self, temperature: float = 0.1, alpha: float = 0.5, a0: float = 0.0,
                 memory_bank_size: int | Sequence[int] = 0, gather_distributed: bool = False,
                 *, reweight: bool = True, adaptive: bool = True,
                 temperature_form: str = "linear", weight_form: str = "inverse",
                 min_temperature: float | None = None, form: str = "nt_xent",
                 persistent_memory_bank: bool = False, A_0: float | None = None,
                 tile_size: int | None = None) -> None:
        if A_0 is not None:
            a0 = A_0
        self._core_kwargs = dict(temperature=temperature, alpha=alpha, a0=a0, reweight=reweight,
                                 adaptive=adaptive, temperature_form=temperature_form,
                                 weight_form=weight_form, min_temperature=min_temperature)
        super().__init__(memory_bank_size, gather_distributed, form, persistent_memory_bank,
                         tile_size)

    def _make_core(self, **kwargs: Any) -> nn.Module:
        return plugins.MACLLoss(**self._core_kwargs, **kwargs)


class ASCLLoss(nn.Module):
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
        ...                    memory_bank_size=(4096, 128))
        >>> loss = loss_fn(query, key)          # key from the momentum encoder, no gradient
        >>> loss_fn.last_stats["confidence"]
    """

    def __init__(self, temperature: float = 0.1, sharpen_temperature: float = 0.05,
                 num_neighbors: int = 1, mode: str = "ascl",
                 memory_bank_size: int | Sequence[int] = 0, gather_distributed: bool = False,
                 *, persistent_memory_bank: bool = False, **core_kwargs: Any) -> None:
        super().__init__()
        self.memory_bank = _make_memory_bank(memory_bank_size, gather_distributed,
                                             persistent_memory_bank)
        self.gather_distributed = gather_distributed
        self.uses_memory_bank = self.memory_bank.size[0] > 0
        in_batch_gather = gather_distributed and not self.uses_memory_bank
        self.criterion = plugins.ASCLLoss(
            temperature=temperature, sharpen_temperature=sharpen_temperature,
            num_neighbors=num_neighbors, mode=mode,
            form="queue" if self.uses_memory_bank else "cross_view",
            gather_distributed=in_batch_gather,
            gather_fn=lightly_gather if in_batch_gather else None, **core_kwargs,
        )

    @property
    def last_stats(self) -> dict[str, Tensor]:
        return self.criterion.last_stats

    @property
    def temperature(self) -> float:
        return self.criterion.temperature

    def forward(self, out0: Tensor, out1: Tensor) -> Tensor:
        """ASCL loss of queries ``out0`` against keys ``out1`` (and the memory bank)."""
        if not self.uses_memory_bank:
            return self.criterion(out0, out1)
        key = F.normalize(out1.detach(), dim=1)
        # keys enter the bank after the loss; with gather_distributed Lightly gathers them first
        _, negatives = self.memory_bank(key, update=out0.requires_grad)
        return self.criterion(out0, out1, negatives=negatives.to(device=out0.device))


# --------------------------------------------------------------------------------------------
# AMCL: multi-head projections in the style of lightly.models.modules.heads, and the loss
# --------------------------------------------------------------------------------------------

#: AMCL's shared pair-temperature network (re-exported from the core).
PairTemperature = _amcl.PairTemperature


class AMCLProjectionHead(nn.Module):
    """C projection heads of one Lightly architecture with independent weights (AMCL Sec. 4.2).

    ``forward`` maps backbone features ``[B, F]`` to ``[C, B, D]``. Given ``[C, B, D]`` (the
    output of another multi-head, e.g. SimSiam's projection before its prediction head) head
    ``c`` is applied to slice ``c``. Build it from any Lightly head class::

        AMCLProjectionHead.from_lightly(SimCLRProjectionHead, num_heads=3,
                                        input_dim=512, hidden_dim=2048, output_dim=128)

    - [0] Wang et al., Adaptive Multi-head Contrastive Learning, ECCV 2024,
      https://arxiv.org/abs/2310.05615

    Args:
        heads: the C head modules (same architecture, separate weights).

    Examples:
        >>> from lightly.models.modules import SimCLRProjectionHead
        >>> heads = AMCLProjectionHead.from_lightly(SimCLRProjectionHead, num_heads=3,
        ...                                         input_dim=512, output_dim=128)
        >>> z = heads(torch.randn(8, 512))      # [3, 8, 128]
    """

    def __init__(self, heads: Sequence[nn.Module]) -> None:
        super().__init__()
        heads = list(heads)
        if not heads:
            raise ValueError("AMCLProjectionHead needs at least one head")
        self.heads = nn.ModuleList(heads)

    @classmethod
    def from_lightly(cls, head_class: type[nn.Module], num_heads: int = 2,
                     **head_kwargs: Any) -> AMCLProjectionHead:
        """``num_heads`` freshly initialised ``head_class(**head_kwargs)`` heads."""
        _check_int("num_heads", num_heads, 1)
        return cls([head_class(**head_kwargs) for _ in range(num_heads)])

    @property
    def num_heads(self) -> int:
        return len(self.heads)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim == 3:
            if x.shape[0] != len(self.heads):
                raise ValueError(f"got {x.shape[0]} head slices for {len(self.heads)} heads")
            return torch.stack([head(xc) for head, xc in zip(self.heads, x, strict=True)])
        if x.ndim != 2:
            raise ValueError(f"expected [batch, features] or [heads, batch, dim], got {tuple(x.shape)}")
        return torch.stack([head(x) for head in self.heads])


class AMCLLoss(nn.Module):
    """AMCL loss (NT-Xent / InfoNCE forms, Table 2) with ``NTXentLoss``'s call signature.

    Owns the learned :class:`PairTemperature` network (its parameters train with the model:
    keep the loss inside the LightningModule / optimiser). ``forward(out0, out1)`` takes
    ``[C, N, D]`` from an :class:`AMCLProjectionHead` (or ``[N, D]`` for one head). With a
    memory bank (MoCo) each head has its own Lightly ``MemoryBankModule`` of
    ``memory_bank_size = (K, D)``.

    - [0] Wang et al., Adaptive Multi-head Contrastive Learning, ECCV 2024,
      https://arxiv.org/abs/2310.05615

    Args:
        dim: head output dimension d' (input of the temperature network and of Omega).
        beta: weight of the temperature regulariser Omega (paper: 1e-5 ... 10).
        negative_term: ``"topk"`` (mean of the kappa hardest negatives) or ``"softmax"``.
        kappa: negatives in the top-kappa term.
        objective: ``"nt_xent"`` (Table 2.1) or ``"infonce"`` (Table 2.4).
        eta, iota: temperature bounds ``(eta, eta + iota)`` (paper: 1e-5 and 2 on CIFAR).
        memory_bank_size: ``(num_features, dim)`` per head, 0 disables the bank.
        gather_distributed: gather in-batch candidates from every rank.
        num_heads: number of heads C (needed for the per-head memory banks).
        form: in-batch candidate set without a memory bank.
        temperature_net: a custom temperature module (e.g. ``plugins.amcl.ConstantTemperature``).

    Examples:
        >>> loss_fn = AMCLLoss(dim=128, beta=1e-3, kappa=1)
        >>> loss = loss_fn(heads(backbone(x0)), heads(backbone(x1)))
        >>> loss_fn.last_stats["temperature"]
    """

    def __init__(self, dim: int, beta: float = 1e-3, negative_term: str = "topk",
                 kappa: int = 1, objective: str = "nt_xent", eta: float = 1e-5,
                 iota: float = 2.0, memory_bank_size: int | Sequence[int] = 0,
                 gather_distributed: bool = False, *, num_heads: int = 1,
                 form: str = "nt_xent", temperature_net: nn.Module | None = None,
                 persistent_memory_bank: bool = False, tile_size: int | None = None) -> None:
        super().__init__()
        _check_int("dim", dim, 1)
        _check_int("num_heads", num_heads, 1)
        self.num_heads = num_heads
        self.memory_banks = nn.ModuleList(
            _make_memory_bank(memory_bank_size, gather_distributed, persistent_memory_bank)
            for _ in range(num_heads))
        self.uses_memory_bank = self.memory_banks[0].size[0] > 0
        self.gather_distributed = gather_distributed
        net = PairTemperature(dim, eta=eta, iota=iota) if temperature_net is None else temperature_net
        self.criterion = _amcl.AMCLLoss(
            net, beta, negative_term=negative_term, kappa=kappa, objective=objective,
            form="queue" if self.uses_memory_bank else form,
            gather_distributed=gather_distributed and not self.uses_memory_bank,
            tile_size=tile_size,
        )

    @property
    def temperature_net(self) -> nn.Module:
        return self.criterion.temperature_net

    @property
    def last_stats(self) -> dict[str, Tensor]:
        return self.criterion.last_stats

    def forward(self, out0: Tensor, out1: Tensor) -> Tensor:
        """AMCL loss of ``[C, N, D]`` (or ``[N, D]``) projections of two views."""
        if not self.uses_memory_bank:
            return self.criterion(out0, out1)
        heads0 = out0 if out0.ndim == 3 else out0.unsqueeze(0)
        heads1 = out1 if out1.ndim == 3 else out1.unsqueeze(0)
        if heads0.shape[0] != self.num_heads:
            raise ValueError(f"got {heads0.shape[0]} heads, the loss was built for {self.num_heads}")
        negatives = []
        for bank, key in zip(self.memory_banks, heads1, strict=True):
            _, neg = bank(F.normalize(key.detach(), dim=1), update=out0.requires_grad)
            negatives.append(neg.to(device=out0.device))
        return self.criterion(heads0, heads1, torch.stack(negatives))


# --------------------------------------------------------------------------------------------
# ASCL MoCo: momentum key encoder on weak views, strong views for the query, persistent queue
# --------------------------------------------------------------------------------------------


class WeakViewTransform:
    """ASCL's weak augmentation: random resized crop and horizontal flip only (Sec. III-D).

    Examples:
        >>> weak = WeakViewTransform(input_size=32, normalize=CIFAR10_NORMALIZE)
        >>> tensor = weak(pil_image)
    """

    def __init__(self, input_size: int = 224, min_scale: float = 0.2, hf_prob: float = 0.5,
                 normalize: dict[str, list[float]] | None = None) -> None:
        from lightly.transforms.torchvision_v2_compatibility import torchvision_transforms as T
        from lightly.transforms.utils import IMAGENET_NORMALIZE

        normalize = IMAGENET_NORMALIZE if normalize is None else normalize
        self.transform = T.Compose([
            T.RandomResizedCrop(size=input_size, scale=(min_scale, 1.0)),
            T.RandomHorizontalFlip(p=hf_prob),
            T.ToTensor(),
            T.Normalize(mean=normalize["mean"], std=normalize["std"]),
        ])

    def __call__(self, image: Any) -> Tensor:
        return self.transform(image)


class ASCLTransform:
    """Two views for ASCL: ``[strong (query), weak (key)]`` (ASCL Sec. IV-A2).

    The strong view is Lightly's SimCLR view with MoCo v2's colour jitter: crop 0.2-1, flip,
    colour jitter (0.4, 0.4, 0.4, 0.1) = SimCLR's (0.8, 0.8, 0.8, 0.2) x ``cj_strength`` 0.5,
    applied with probability ``cj_prob`` 0.8, grayscale 0.2, Gaussian blur ``gaussian_blur``;
    the weak view keeps only the crop and the flip. Blur is usually off for 32x32 images.

    Examples:
        >>> transform = ASCLTransform(input_size=32, gaussian_blur=0.0,
        ...                           normalize=CIFAR10_NORMALIZE)
        >>> x_strong, x_weak = transform(pil_image)
    """

    def __init__(self, input_size: int = 224, cj_prob: float = 0.8, cj_strength: float = 0.5,
                 min_scale: float = 0.2,
                 gaussian_blur: float = 0.5, random_gray_scale: float = 0.2,
                 normalize: dict[str, list[float]] | None = None) -> None:
        from lightly.transforms.simclr_transform import SimCLRViewTransform
        from lightly.transforms.utils import IMAGENET_NORMALIZE

        normalize = IMAGENET_NORMALIZE if normalize is None else normalize
        self.strong = SimCLRViewTransform(
            input_size=input_size, cj_prob=cj_prob, cj_strength=cj_strength, min_scale=min_scale,
            random_gray_scale=random_gray_scale, gaussian_blur=gaussian_blur, normalize=normalize,
        )
        self.weak = WeakViewTransform(input_size=input_size, min_scale=min_scale,
                                      normalize=normalize)

    def __call__(self, image: Any) -> list[Tensor]:
        return [self.strong(image), self.weak(image)]


class ASCLMoCo(nn.Module):
    """MoCo with the ASCL loss [0]: query from a strong view, key from a weak view.

    The key encoder is a momentum copy (Lightly's ``update_momentum``, momentum 0.99 in the
    paper) of the backbone and MoCo v2 projection head; keys are gathered over ranks (no
    gradient) before they enter the queue; negatives and soft targets come from the queue
    (4096 entries for CIFAR in the paper). The queue is a
    :class:`PersistentMemoryBankModule`: it is saved and restored with ``state_dict``, so a
    resumed run continues with the same queue.

    - [0] Feng & Patras, Adaptive Soft Contrastive Learning, ICPR 2022,
      https://arxiv.org/abs/2207.11163

    Args:
        backbone: module mapping images to ``[B, feature_dim]`` (or ``[B, feature_dim, 1, 1]``).
        feature_dim: backbone output dimension.
        hidden_dim, output_dim: MoCo v2 projection head sizes.
        queue_size: number of keys in the queue.
        momentum: momentum of the key encoder (``m`` in ``update_momentum``).
        temperature, sharpen_temperature, num_neighbors, mode: ASCL's tau, tau', K and variant.
        gather_distributed: gather keys from every rank before they enter the queue.

    Examples:
        >>> model = ASCLMoCo(backbone, feature_dim=512, queue_size=4096)
        >>> x_strong, x_weak = batch[0]           # from ASCLTransform
        >>> model.update_momentum()               # once per step, before the key forward
        >>> loss = model.training_loss(x_strong, x_weak)
        >>> model.criterion.last_stats["confidence"]
    """

    def __init__(self, backbone: nn.Module, feature_dim: int, hidden_dim: int = 2048,
                 output_dim: int = 128, queue_size: int = 4096, momentum: float = 0.99,
                 temperature: float = 0.1, sharpen_temperature: float = 0.05,
                 num_neighbors: int = 1, mode: str = "ascl",
                 gather_distributed: bool = False) -> None:
        super().__init__()
        _check_int("feature_dim", feature_dim, 1)
        _check_int("queue_size", queue_size, 1)
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must be in [0, 1], got {momentum}")
        self.momentum = float(momentum)
        self.backbone = backbone
        self.projection_head = MoCoProjectionHead(feature_dim, hidden_dim, output_dim)
        self.backbone_momentum = copy.deepcopy(backbone)
        self.projection_head_momentum = copy.deepcopy(self.projection_head)
        lightly_utils.deactivate_requires_grad(self.backbone_momentum)
        lightly_utils.deactivate_requires_grad(self.projection_head_momentum)
        self.criterion = ASCLLoss(temperature=temperature,
                                  sharpen_temperature=sharpen_temperature,
                                  num_neighbors=num_neighbors, mode=mode,
                                  memory_bank_size=(queue_size, output_dim),
                                  gather_distributed=gather_distributed,
                                  persistent_memory_bank=True)

    @property
    def queue(self) -> Tensor:
        """The ``[queue_size, output_dim]`` queue of keys (a persistent buffer)."""
        return self.criterion.memory_bank.bank

    def forward(self, x: Tensor) -> Tensor:
        """Backbone features ``[B, feature_dim]`` (what kNN and linear probes use)."""
        return self.backbone(x).flatten(start_dim=1)

    def forward_query(self, x: Tensor) -> Tensor:
        return self.projection_head(self.forward(x))

    @torch.no_grad()
    def forward_key(self, x: Tensor) -> Tensor:
        world = lightly_dist.world_size()
        if world > 1:  # shuffle BN across GPUs, as in MoCo
            x, shuffle = lightly_utils.batch_shuffle_distributed(x)
        features = self.backbone_momentum(x).flatten(start_dim=1)
        key = self.projection_head_momentum(features).detach()
        if world > 1:
            key = lightly_utils.batch_unshuffle_distributed(key, shuffle)
        return key

    @torch.no_grad()
    def update_momentum(self, momentum: float | None = None) -> None:
        """EMA update of the key encoder (call once per step before :meth:`forward_key`)."""
        m = self.momentum if momentum is None else momentum
        lightly_utils.update_momentum(self.backbone, self.backbone_momentum, m=m)
        lightly_utils.update_momentum(self.projection_head, self.projection_head_momentum, m=m)

    def training_loss(self, x_query: Tensor, x_key: Tensor) -> Tensor:
        """ASCL loss of a strong-view batch against the weak-view keys and the queue."""
        query = self.forward_query(x_query)
        key = self.forward_key(x_key)
        return self.criterion(query, key)


def _check_int(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value

