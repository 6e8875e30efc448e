"""DySTreSS with the call signature of Lightly's losses (and of the authors' own Lightly loss).

The authors of DySTreSS wrote their ImageNet loss as a Lightly loss, ``TSNTXentLoss(min_temp=0.1,
max_temp=0.2, memory_bank_size=0, gather_distributed=False)``, called ``loss(out0, out1)``; this
one takes its arguments in that order, with the keyword-only options of
:class:`~adaptcl.adapters.lightly.NTXentLoss`, and computes it with
:class:`adaptcl.plugins.DySTreSSLoss` (see :mod:`adaptcl.plugins.dystress` for what follows the
authors' code: the cosine function by default, the temperature detached, every pair at its own
temperature).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from adaptcl import plugins
from adaptcl.plugins.dystress import Shape
from adaptcl.plugins.validation import TileSize, check_positive

from .memory_bank import InBatchForm, MemoryBankLoss

__all__ = ["DySTreSSLoss"]


class DySTreSSLoss(MemoryBankLoss):
    """DySTreSS [0]: NT-Xent with a temperature per pair from its cosine similarity.

    ``tau_ij = tau_min + 1/2 (tau_max - tau_min) (1 + cos(pi (1 + s_ij)))`` (or the authors'
    piecewise variant), SimCLR's symmetric form without a memory bank and MoCo's with one.
    ``loss_fn(out0, out1, labels)`` gives multi-positive (SupCon) targets, as
    :class:`~adaptcl.adapters.lightly.NTXentLoss`.

    - [0] Manna et al., Dynamically Scaled Temperature in Self-Supervised Contrastive Learning,
      IEEE TAI 2025, https://arxiv.org/abs/2308.01140

    Args:
        min_temperature, max_temperature: tau_min and tau_max (the authors' ImageNet setting:
            0.1 and 0.2).
        memory_bank_size: ``(num_features, dim)`` of a MoCo-style memory bank, 0 disables it.
        gather_distributed: gather negatives from every GPU before the loss.
        shape, threshold, width, detach_temperature: as in :class:`adaptcl.plugins.DySTreSSLoss`.
        form, persistent_memory_bank, memory_bank_labels, check_finite, tile_size: as in
            :class:`~adaptcl.adapters.lightly.NTXentLoss`.

    Examples:
        >>> from adaptcl.adapters.lightly import DySTreSSLoss
        >>> loss_fn = DySTreSSLoss(0.1, 0.2)
        >>> loss = loss_fn(torch.randn(8, 16), torch.randn(8, 16))
        >>> tau_pos = loss_fn.last_stats["temperature"]   # mean temperature of the positives
    """

    def __init__(self, min_temperature: float = 0.1, max_temperature: float = 0.2,
                 memory_bank_size: int | Sequence[int] = 0, gather_distributed: bool = False, *,
                 shape: Shape = "cosine", threshold: float = 0.4, width: float = 0.7,
                 detach_temperature: bool = True, form: InBatchForm = "nt_xent",
                 persistent_memory_bank: bool = False, memory_bank_labels: bool = False,
                 check_finite: bool = True, tile_size: TileSize = "auto") -> None:
        core = functools.partial(plugins.DySTreSSLoss, min_temperature, max_temperature,
                                 shape=shape, threshold=threshold, width=width,
                                 detach_temperature=detach_temperature)
        super().__init__(core, memory_bank_size, gather_distributed, form=form,
                         persistent_memory_bank=persistent_memory_bank,
                         check_finite=check_finite, tile_size=tile_size,
                         memory_bank_labels=memory_bank_labels)

    @property
    def min_temperature(self) -> float:
        """tau_min (readable and settable, kept <= ``max_temperature``)."""
        return self.criterion.min_temperature

    @min_temperature.setter
    def min_temperature(self, value: float) -> None:
        self._set_bounds(check_positive("min_temperature", value), self.max_temperature)

    @property
    def max_temperature(self) -> float:
        """tau_max (readable and settable, kept >= ``min_temperature``)."""
        return self.criterion.max_temperature

    @max_temperature.setter
    def max_temperature(self, value: float) -> None:
        self._set_bounds(self.min_temperature, check_positive("max_temperature", value))

    def _set_bounds(self, low: float, high: float) -> None:
        if low > high:
            raise ValueError(f"min_temperature must be <= max_temperature, got {low} > {high}")
        self.criterion.min_temperature, self.criterion.max_temperature = low, high
