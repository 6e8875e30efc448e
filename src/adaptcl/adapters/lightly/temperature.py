"""The two temperature rules with ``lightly.loss.NTXentLoss``'s call signature: a cosine
schedule of the training step and a learned temperature.

Both are InfoNCE (NT-Xent, or MoCo's loss with a memory bank) with the temperature changed, and
take Lightly's ``memory_bank_size`` and ``gather_distributed`` exactly as :class:`NTXentLoss`
does (the bank and the gather are wired once in :class:`~.memory_bank.MemoryBankLoss`).

- :class:`TemperatureScheduleLoss` (Kukleva et al., ICLR 2023): the temperature at the loss's
  ``step``. Lightly has no trainer of its own: in a LightningModule set ``step`` to
  ``self.global_step`` in ``training_step`` (the modules of
  :mod:`adaptcl.adapters.lightning` do), in a plain loop call ``advance()`` after each
  optimiser step. The step is saved in ``state_dict`` (and so in Lightning's checkpoints).
- :class:`LearnableTemperatureLoss` (CLIP's logit scale): the temperature is the parameter
  ``logit_scale`` of the loss, so keep the loss inside the LightningModule (its
  ``self.parameters()``, hence its optimiser and checkpoints, include it). One temperature per
  head with ``num_heads`` and ``[C, N, D]`` inputs (e.g. from
  :class:`~adaptcl.adapters.lightly.AMCLProjectionHead`), each head with its own queue.

References:
    - Kukleva, Böhle, Schiele, Kuehne & Rupprecht, "Temperature Schedules for self-supervised
      contrastive methods on long-tail data", ICLR 2023, https://arxiv.org/abs/2303.13664
    - Radford et al., "Learning Transferable Visual Models From Natural Language Supervision"
      (CLIP), ICML 2021, https://arxiv.org/abs/2103.00020
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from torch import Tensor

from adaptcl import plugins
from adaptcl.plugins.logit_scale import OPEN_CLIP_TEMPERATURE
from adaptcl.plugins.schedule import SCHEDULE_PAPER, ScheduleControls
from adaptcl.plugins.validation import TileSize

from .memory_bank import InBatchForm, MemoryBankLoss, MultiHeadBankLoss

__all__ = ["TemperatureScheduleLoss", "LearnableTemperatureLoss"]

BankSize = int | Sequence[int]


class TemperatureScheduleLoss(ScheduleControls, MemoryBankLoss):
    """NT-Xent (MoCo's InfoNCE with a memory bank) at a cosine-scheduled temperature [0].

    ``tau(step) = tau_min + (tau_max - tau_min) (1 + cos(2 pi step / period)) / 2``
    (:class:`adaptcl.plugins.TemperatureScheduleLoss`, whose docstring says which form and
    defaults follow the authors' code). Set :attr:`step` before the forward pass (Lightning:
    ``self.criterion.step = self.global_step``) or call :meth:`advance` after each optimiser
    step. With ``min_temperature == max_temperature`` it equals :class:`NTXentLoss` at that
    temperature, with and without a memory bank.

    - [0] Kukleva et al., Temperature Schedules for self-supervised contrastive methods on
      long-tail data, ICLR 2023, https://arxiv.org/abs/2303.13664

    Args:
        min_temperature, max_temperature, period: the schedule (the authors': 0.1, 1.0, 400).
        memory_bank_size: ``(num_features, dim)`` of a MoCo-style memory bank, 0 disables it.
        gather_distributed: gather negatives from every GPU before the loss.
        step: the step to start at.
        positive_in_denominator: ``False`` gives DCL at the scheduled temperature.
        form, persistent_memory_bank, check_finite, tile_size: as in
            :class:`NTXentLoss`.

    Examples:
        >>> loss_fn = TemperatureScheduleLoss(0.1, 1.0, period=400)
        >>> loss_fn.step = 100                   # e.g. self.global_step
        >>> loss = loss_fn(torch.randn(8, 16), torch.randn(8, 16))
        >>> round(loss_fn.temperature, 3)
        0.55
    """

    def __init__(self, min_temperature: float = SCHEDULE_PAPER["min_temperature"],
                 max_temperature: float = SCHEDULE_PAPER["max_temperature"],
                 period: int = SCHEDULE_PAPER["period"], memory_bank_size: BankSize = 0,
                 gather_distributed: bool = False, *, step: int = 0,
                 positive_in_denominator: bool = True, form: InBatchForm = "nt_xent",
                 persistent_memory_bank: bool = False, check_finite: bool = True,
                 tile_size: TileSize = "auto") -> None:
        core = functools.partial(plugins.TemperatureScheduleLoss, min_temperature,
                                 max_temperature, period, step=step,
                                 positive_in_denominator=positive_in_denominator)
        super().__init__(core, memory_bank_size, gather_distributed, form=form,
                         persistent_memory_bank=persistent_memory_bank,
                         check_finite=check_finite, tile_size=tile_size)

    def extra_repr(self) -> str:
        c = self.criterion
        return (f"min_temperature={c.min_temperature}, max_temperature={c.max_temperature}, "
                f"period={c.period}, step={c.step}, {super().extra_repr()}")


class LearnableTemperatureLoss(MultiHeadBankLoss):
    """NT-Xent (MoCo's InfoNCE with a memory bank) at a learned temperature ``exp(-s)`` [0].

    ``s`` (:attr:`logit_scale`) is a parameter of this loss, initialised at
    ``log(1 / temperature)`` and clamped as open_clip clamps CLIP's ``logit_scale``
    (:class:`adaptcl.plugins.LearnableTemperatureLoss`). Keep the loss inside the module being
    optimised (a LightningModule's ``self.criterion``) so that ``parameters()``, the optimiser
    and the checkpoints hold it. Before any update it equals :class:`NTXentLoss` at
    ``float(loss.temperature)``.

    - [0] Radford et al., Learning Transferable Visual Models From Natural Language
      Supervision (CLIP), ICML 2021, https://arxiv.org/abs/2103.00020

    Args:
        temperature: the initial tau (CLIP: 0.07).
        memory_bank_size: ``(num_features, dim)`` per head, 0 disables the bank.
        gather_distributed: gather in-batch candidates (or, with a bank, keys) from every rank.
        min_temperature, max_temperature: the bounds of tau (open_clip: 0.01 and 1).
        num_heads: one learned temperature per head; ``forward`` then takes ``[C, N, D]`` and
            the bank keeps one queue per head.
        positive_in_denominator: ``False`` gives DCL at the learned temperature.
        form, persistent_memory_bank, check_finite, tile_size: as in
            :class:`NTXentLoss`.

    Examples:
        >>> loss_fn = LearnableTemperatureLoss(0.07)
        >>> loss = loss_fn(torch.randn(8, 16), torch.randn(8, 16))
        >>> [name for name, _ in loss_fn.named_parameters()]
        ['criterion.logit_scale']
    """

    def __init__(self, temperature: float = OPEN_CLIP_TEMPERATURE["temperature"],
                 memory_bank_size: BankSize = 0, gather_distributed: bool = False, *,
                 min_temperature: float = OPEN_CLIP_TEMPERATURE["min_temperature"],
                 max_temperature: float = OPEN_CLIP_TEMPERATURE["max_temperature"],
                 num_heads: int = 1, positive_in_denominator: bool = True,
                 form: InBatchForm = "nt_xent", persistent_memory_bank: bool = False,
                 check_finite: bool = True, tile_size: TileSize = "auto") -> None:
        core = functools.partial(plugins.LearnableTemperatureLoss, temperature,
                                 min_temperature=min_temperature,
                                 max_temperature=max_temperature, num_heads=num_heads,
                                 positive_in_denominator=positive_in_denominator)
        super().__init__(core, memory_bank_size, gather_distributed, num_heads=num_heads,
                         form=form, persistent_memory_bank=persistent_memory_bank,
                         check_finite=check_finite, tile_size=tile_size)

    @property
    def logit_scale(self) -> Tensor:
        """The learned ``s = log(1 / tau)`` (one per head)."""
        return self.criterion.logit_scale

    @property
    def temperature(self) -> Tensor:
        """The current tau, ``exp(-s)`` (detached; one per head)."""
        return self.criterion.temperature

    def clamp_(self) -> LearnableTemperatureLoss:
        """Clamp ``s`` in place now (as open_clip does after ``optimizer.step()``)."""
        self.criterion.clamp_()
        return self
