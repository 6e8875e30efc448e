"""Lightly's memory bank and distributed gather around a core loss: written once, used by all.

Every Lightly loss of :mod:`adaptcl.adapters.lightly` is a :class:`MemoryBankLoss`: the
subclass says how to build its core loss from :mod:`adaptcl.plugins` (always kept as the
attribute ``criterion``) and this class does what ``lightly.loss.NTXentLoss`` does around its maths:

- ``memory_bank_size`` uses Lightly's :class:`~lightly.models.modules.memory_bank.MemoryBankModule`
  (Lightly 1.6 wants a ``(num_features, dim)`` tuple, ``0`` disables it). The bank stores the
  normalised second view and is updated only when ``out0`` requires a gradient; with a bank
  the core loss runs in its ``"queue"`` form (positive ``out1[i]`` plus the bank's negatives),
  which it uses as they are, unit rows, without normalising them again (as Lightly does).
- ``gather_distributed`` passes ``lightly.utils.dist.gather`` (gradient-carrying) to the core,
  which offsets the positive index by the rank; with a bank, Lightly gathers the keys of every
  rank before they enter it.
- ``labels`` (optional third argument of ``forward``, ``[N]`` class indices or ``[N, C]`` one-hot
  rows): multi-positive (SupCon) targets for the losses that take them; with a memory bank
  they need ``memory_bank_labels=True``, a second Lightly bank that keeps the class of every
  entry in step with the first (``-1`` for entries without one, e.g. Lightly's random initial
  rows), saved with ``persistent_memory_bank``;
- one validation path: the shared arguments are checked here; the embeddings must be
  floating-point tensors (a ``TypeError`` naming ``out0``/``out1``, raised before the bank
  touches them) and are brought to one dtype (the bank is float32; float64 inputs keep
  float64); a bank whose feature dimension differs from the embeddings raises a
  ``ValueError`` naming both dimensions before anything is written to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, get_args

import torch
from lightly.models.modules.memory_bank import MemoryBankModule
from lightly.utils import dist as lightly_dist
from torch import Tensor, nn

from adaptcl.plugins.candidates import compute_dtype, normalize
from adaptcl.plugins.validation import (
    TileSize,
    check_bool,
    check_choice,
    check_int,
    check_shared,
)

__all__ = ["InBatchForm", "IN_BATCH_FORMS", "PersistentMemoryBankModule", "MemoryBankLoss",
           "MultiHeadBankLoss", "lightly_gather",
           "core_attribute", "class_indices"]

#: in-batch candidate sets a Lightly loss may choose; the queue form is chosen by the bank
InBatchForm = Literal["nt_xent", "cross_view", "cross_view_symmetric"]
IN_BATCH_FORMS: tuple[InBatchForm, ...] = get_args(InBatchForm)


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


def core_attribute(name: str, check: Callable[[str, Any], Any] | None = None,
                   public_name: str | None = None) -> property:
    """A property that reads and (validated) writes ``self.criterion.<name>``.

    Lightly's losses keep their hyper-parameters as plain attributes (``loss.temperature =
    0.2`` between epochs); ours live in the core loss, so the adapter forwards them.
    """
    label = public_name or name

    def fget(self: nn.Module) -> Any:
        return getattr(self.criterion, name)

    def fset(self: nn.Module, value: Any) -> None:
        setattr(self.criterion, name, value if check is None else check(label, value))

    return property(fget, fset, doc=f"``{label}`` of the core loss (readable and settable).")


class MemoryBankLoss(nn.Module):
    """Base of the Lightly losses: one core loss with Lightly's memory bank and gather.

    Multi-head losses override :meth:`_bank_rows` and :meth:`_bank_negatives` to store several
    heads per bank row.

    Args:
        make_core: builds the core loss from the keyword arguments ``form``,
            ``gather_distributed``, ``gather_fn``, ``check_finite`` and ``tile_size``.
        memory_bank_size: ``(num_features, dim)`` of the memory bank, 0 disables it.
        gather_distributed: gather candidates (or, with a bank, keys) from every rank.
        form: in-batch candidate set without a bank (one of ``forms``).
        persistent_memory_bank: save the bank in ``state_dict`` (Lightly does not).
        check_finite: NaN/inf embeddings are a ``ValueError`` on the CPU; on a GPU a NaN
            loss, which a ``GradScaler`` skips under AMP, and a ``NonFiniteWarning``, never a
            wait (:func:`~adaptcl.plugins.validation.check_all_finite`).
        tile_size: ``"auto"``, ``None`` or an int: how the logits are computed (see
            :mod:`adaptcl.plugins.execution`).
        forms: the in-batch forms this loss supports.
        bank_width: bank entries per row (heads of a multi-head loss).
        memory_bank_labels: keep the class of every bank entry (a second Lightly bank of
            ``(num_features, 1)``), so that ``forward(out0, out1, labels)`` with a memory bank
            makes the bank entries of the anchor's class positives. Classes must be below
            2**24 (the bank holds them as float32, exactly).
    """

    def __init__(self, make_core: Callable[..., nn.Module],
                 memory_bank_size: int | Sequence[int] = 0,
                 gather_distributed: bool = False, *, form: InBatchForm = "nt_xent",
                 persistent_memory_bank: bool = False, check_finite: bool = True,
                 tile_size: TileSize = "auto", forms: tuple[str, ...] = IN_BATCH_FORMS,
                 bank_width: int = 1, memory_bank_labels: bool = False) -> None:
        super().__init__()
        # the core's checks, made before Lightly's bank sees gather_distributed
        check_shared(gather_distributed=gather_distributed, gather_fn=None,
                     check_finite=check_finite, tile_size=tile_size)
        check_bool("persistent_memory_bank", persistent_memory_bank)
        check_bool("memory_bank_labels", memory_bank_labels)
        if form == "queue":
            raise ValueError(f"form must be one of {forms}: the queue form is chosen by "
                             f"memory_bank_size, got {form!r}")
        check_choice("form", form, forms)
        _check_bank_size(memory_bank_size)
        bank_class = PersistentMemoryBankModule if persistent_memory_bank else MemoryBankModule
        # (num_features, dim) rows: the core takes negatives as [K, D].
        self.memory_bank = bank_class(size=_widen(memory_bank_size, bank_width),
                                      gather_distributed=gather_distributed,
                                      feature_dim_first=False)
        self.uses_memory_bank = self.memory_bank.size[0] > 0
        #: feature dimension of one bank entry (that of the embeddings), None without a bank
        self.memory_bank_dim = (self.memory_bank.size[1] // bank_width
                                if self.uses_memory_bank else None)
        self.gather_distributed = gather_distributed
        self.form = "queue" if self.uses_memory_bank else form
        self.criterion = make_core(
            form=self.form, gather_distributed=gather_distributed,
            gather_fn=lightly_gather if gather_distributed else None,
            check_finite=check_finite, tile_size=tile_size,
        )
        # A one-entry-per-row bank holds unit rows (Lightly's initial ones and _bank_rows'):
        # the core uses them as they are, as Lightly does, so an entry equals the key it was
        # made from. A multi-head row is not: Lightly normalises its initial rows over all
        # heads together, so each head's part is normalised by the core.
        self.criterion.unit_negatives = self.uses_memory_bank and bank_width == 1
        self.label_bank = None
        if memory_bank_labels:
            if not self.uses_memory_bank:
                raise ValueError("memory_bank_labels=True needs a memory bank (memory_bank_size="
                                 "(num_features, dim)); without one the labels of the batch "
                                 "are all there is")
            if not self.criterion.takes_labels:
                raise ValueError(f"memory_bank_labels=True: {type(self).__name__} takes no labels")
            # A bank of one float per entry, updated with the feature bank, so its pointer and
            # Lightly's wrap-around stay in step; -1 marks an entry without a class.
            self.label_bank = bank_class(size=(self.memory_bank.size[0], 1),
                                         gather_distributed=gather_distributed,
                                         feature_dim_first=False)
            with torch.no_grad():
                self.label_bank.bank.fill_(-1.0)

    check_finite = core_attribute("check_finite", check_bool)

    @property
    def last_stats(self) -> dict[str, Tensor]:
        """What the core loss computed in the last call (detached 0-d tensors)."""
        return self.criterion.last_stats

    def forward(self, out0: Tensor, out1: Tensor, labels: Tensor | None = None) -> Tensor:
        """Loss of the positive pairs ``(out0[i], out1[i])``, as ``NTXentLoss.forward``.

        Args:
            out0: output projections of the first views, shape ``(batch_size, dim)``.
            out1: output projections of the second views, shape ``(batch_size, dim)``; with a
                memory bank these (normalised) enter the bank after the loss, as in Lightly.
            labels: optional class of each pair, ``(batch_size,)`` integers or
                ``(batch_size, num_classes)`` one-hot rows: every candidate of the anchor's class
                is a positive (SupCon's ``L_out``, :mod:`adaptcl.plugins.targets`). For the
                losses whose core takes labels (NT-Xent, MACL, DySTreSS); a ``TypeError``
                otherwise.
        """
        out0, out1 = same_dtype(out0, out1)
        pairs = {}
        if labels is not None:
            if not self.criterion.takes_labels:
                raise TypeError(f"{type(self).__name__} takes no labels: multi-positive labels "
                                "are for NTXentLoss, MACLLoss and DySTreSSLoss")
            pairs["labels"] = class_indices(labels, out0.shape[0])
        if not self.uses_memory_bank:
            return self.criterion(out0, out1, **pairs)
        for name, out in (("out0", out0), ("out1", out1)):
            if out.shape[-1] != self.memory_bank_dim:
                raise ValueError(
                    f"the memory bank holds {self.memory_bank_dim}-dimensional features but "
                    f"{name} has feature dimension {out.shape[-1]}; build the loss with "
                    f"memory_bank_size=({self.memory_bank.size[0]}, {out.shape[-1]})")
        if labels is not None and self.label_bank is None:
            raise ValueError(
                "labels with a memory bank need the class of every bank entry: build the loss "
                "with memory_bank_labels=True (Lightly's bank stores features only)")
        # Lightly's bank holds the normalised out1 and is only updated in training.
        _, bank = self.memory_bank(self._bank_rows(out1), update=out0.requires_grad)
        negatives = bank.to(device=out0.device, dtype=compute_dtype(out0))
        if self.label_bank is not None:
            new = (pairs["labels"] if labels is not None
                   else torch.full((out0.shape[0],), -1, device=out0.device))
            _, bank_labels = self.label_bank(new.to(torch.float32)[:, None],
                                             update=out0.requires_grad)
            if labels is not None:
                pairs["negative_labels"] = bank_labels[:, 0].to(device=out0.device,
                                                                dtype=torch.long)
        return self.criterion(out0, out1, self._bank_negatives(negatives), **pairs)

    def _bank_rows(self, out1: Tensor) -> Tensor:
        """The ``[N, width * dim]`` rows ``out1`` adds to the bank: normalised by the core's
        :func:`~adaptcl.plugins.candidates.normalize`, so each equals the positive key the
        core computed from it (``F.normalize`` gives the same rows except at extreme norms)."""
        return normalize(out1.detach())

    def _bank_negatives(self, bank: Tensor) -> Tensor:
        """The bank ``[K, width * dim]`` as the core loss takes its negatives."""
        return bank

    def extra_repr(self) -> str:
        size = (self.memory_bank.size[0], self.memory_bank_dim) if self.uses_memory_bank else 0
        return f"memory_bank_size={size}, gather_distributed={self.gather_distributed}"


class MultiHeadBankLoss(MemoryBankLoss):
    """A :class:`MemoryBankLoss` of ``num_heads`` projection heads: ``forward(out0, out1)`` takes
    ``[C, N, D]`` (``[N, D]`` for one head) and, with a memory bank, every head has its own
    ``(K, D)`` queue. The C queues share one Lightly bank whose rows hold the C keys of a sample
    side by side (``memory_bank.size`` is ``(K, C * D)``). Used by the losses with one
    temperature per head or pair (AMCL, the learnable temperature).

    Args:
        make_core, memory_bank_size, gather_distributed: as in :class:`MemoryBankLoss`.
        num_heads: the number of heads C.
        **kwargs: the other keywords of :class:`MemoryBankLoss`.
    """

    def __init__(self, make_core: Callable[..., nn.Module],
                 memory_bank_size: int | Sequence[int] = 0, gather_distributed: bool = False,
                 *, num_heads: int = 1, **kwargs: Any) -> None:
        super().__init__(make_core, memory_bank_size, gather_distributed,
                         bank_width=check_int("num_heads", num_heads, 1), **kwargs)
        self.num_heads = num_heads

    def _heads(self, out: Tensor) -> Tensor:
        heads = out if out.ndim == 3 else out.unsqueeze(0)
        if heads.shape[0] != self.num_heads:
            raise ValueError(f"got {heads.shape[0]} heads, the loss was built for {self.num_heads}")
        return heads

    def _bank_rows(self, out1: Tensor) -> Tensor:
        heads = self._heads(out1).detach()  # [C, N, D], normalised as the core's positive keys
        heads = normalize(heads.reshape(-1, heads.shape[-1])).view(heads.shape)
        return heads.transpose(0, 1).reshape(heads.shape[1], -1)  # [N, C * D]

    def _bank_negatives(self, bank: Tensor) -> Tensor:
        return bank.view(bank.shape[0], self.num_heads, -1).transpose(0, 1)  # [C, K, D]


def class_indices(labels: Tensor, rows: int) -> Tensor:
    """``[rows]`` class indices from class indices or one-hot ``[rows, num_classes]`` rows (the
    form of the SupCon loss proposed to Lightly, lightly-ai/lightly#1877); the core checks the
    indices themselves."""
    if not isinstance(labels, Tensor) or labels.ndim != 2:
        return labels
    if labels.shape[0] != rows:
        raise ValueError(f"labels must have one row per pair, got {tuple(labels.shape)} for "
                         f"{rows} pairs")
    one_hot = (((labels == 0) | (labels == 1)).all() & (labels.sum(dim=1) == 1).all())
    message = "labels of shape [pairs, classes] must be one-hot rows (or give class indices)"
    if labels.device.type == "cpu":
        if not bool(one_hot):
            raise ValueError(message)
    else:
        torch._assert_async(one_hot, message)
    return labels.argmax(dim=1)


def _check_bank_size(size: int | Sequence[int]) -> None:
    """Lightly 1.6's rule, on every Lightly this package supports: a bank names its feature
    dimension, ``(num_features, dim)``, or is ``0``. Lightly 1.5 accepts a bare ``num_features``
    with a warning (its bank then takes the dimension from the first batch), which the
    feature-dimension check here cannot use."""
    if isinstance(size, int) and not isinstance(size, bool):
        if size > 0:
            raise ValueError(
                f"Memory bank size 'size={size}' does not specify the feature dimension. Set it "
                f"with 'size=({size}, dim)', or pass 'size=0' to disable the memory bank.")
    elif isinstance(size, Sequence) and len(size) != 2 and tuple(size) != (0,):
        raise ValueError(f"Illegal memory bank size {size}, expected a (num_features, dim) "
                         "tuple, or 'size=0' to disable the memory bank.")


def _widen(size: int | Sequence[int], width: int) -> int | Sequence[int]:
    """``(K, D)`` -> ``(K, width * D)``; anything else goes to Lightly's own validation."""
    if width == 1 or isinstance(size, int) or len(size) != 2:
        return size
    return (size[0], width * size[1])


def same_dtype(out0: Tensor, out1: Tensor) -> tuple[Tensor, Tensor]:
    """Both views in their promoted dtype (float32 and float64 mix as in torch arithmetic).

    First of all, before the memory bank or a ``weight_fn`` sees them, each view must be a
    floating-point ``torch.Tensor``: anything else raises a ``TypeError`` naming ``out0`` or
    ``out1`` (the core loss checks shapes and values).
    """
    for name, out in (("out0", out0), ("out1", out1)):
        if not isinstance(out, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(out).__name__}")
        if not out.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {out.dtype}")
    if out0.dtype == out1.dtype:
        return out0, out1
    dtype = torch.promote_types(out0.dtype, out1.dtype)
    return out0.to(dtype), out1.to(dtype)
