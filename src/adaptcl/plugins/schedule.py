"""Temperature schedules: InfoNCE whose temperature follows a cosine of the training step.

Reference:
    Kukleva, Böhle, Schiele, Kuehne & Rupprecht, "Temperature Schedules for self-supervised
    contrastive methods on long-tail data", ICLR 2023 (arXiv:2303.13664); the authors' code,
    github.com/Annusha/temperature_schedules (``train_simCLR.py``, ``--adj_tau cos``).

The schedule changes one part of InfoNCE, the temperature: one scalar per step,

    ``tau(t) = tau_min + (tau_max - tau_min) * (1 + cos(2 pi t / T)) / 2``,

periodic with period ``T``: ``tau_max`` at ``t = 0, T, 2T, ...`` (group-wise discrimination),
``tau_min`` at ``T / 2, 3T / 2, ...`` (instance discrimination).

Which form, and why. The authors' script computes, once per epoch,
``tau = min_tau + 0.5 * (max_tau - min_tau) * (1 + cos(pi * epoch / t_max))`` with
``t_max = 200``, ``temperature_min = 0.1``, ``temperature_max = 1.0`` in every command of its
README (CIFAR10-LT, CIFAR100-LT, ImageNet100-LT; its argparse default ``temperature_max`` is
0.5). ``cos(pi t / t_max)`` returns to its start after ``2 t_max``: ``t_max`` is half a period.
The formula above is the same cosine written with the full period ``T = 2 t_max``, the
"period T" of the issue, so the defaults here are the README's: ``min_temperature=0.1``,
``max_temperature=1.0``, ``period=400``. Two differences, both deliberate:

* the authors count epochs from 1 (their first epoch is already ``cos(pi / 200)`` past the
  top); here ``t`` counts from 0, so the first step has ``tau_max`` exactly;
* the authors advance ``t`` once per epoch; every adapter here drives ``t`` with the
  optimisation step (Lightning's ``global_step``, the sentence-transformers trainer's
  ``global_step``, the steps of GraphCL's loops), so ``period`` counts steps. Their setting is
  five periods in a 2000-epoch CIFAR run: choose ``period`` from the length of yours (a fifth of
  its steps keeps their ratio), or count epochs yourself (``loss.step = epoch``).

Who sets the step. The loss never changes it by itself: a driver does, before the forward
pass, and the step is part of ``state_dict`` (``torch.save(loss.state_dict())`` / load resumes
it). In a plain loop either set it (``loss.step = global_step``) or advance it after each
optimiser step like an LR scheduler (``loss.advance()``). :func:`set_schedule_step` and
:func:`advance_schedules` do the same for every scheduled loss inside any module (a
LightningModule, a GraphCL model, a sentence-transformers loss); the adapters call them.

Example:
    >>> import torch
    >>> loss_fn = TemperatureScheduleLoss(0.1, 1.0, period=400)
    >>> for step in range(3):
    ...     loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32))   # tau(step)
    ...     _ = loss_fn.advance()                                      # after optimizer.step()
    >>> loss_fn.step, round(loss_fn.temperature, 4)
    (3, 0.9995)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .base import (
    ContrastiveLoss,
    Reduction,
    Stats,
    functional_candidates,
    per_anchor_losses,
    reduce,
)
from .candidates import Candidates, Form
from .distributed import GatherFn
from .validation import TileSize, check_int, check_temperature_range

__all__ = ["TemperatureScheduleLoss", "temperature_schedule", "cosine_temperature",
           "set_schedule_step", "advance_schedules", "SCHEDULE_PAPER", "ScheduleControls"]

#: the authors' setting (README commands of Annusha/temperature_schedules): tau between 0.1
#: and 1.0 with ``t_max = 200`` epochs, i.e. a full period of 400 (here counted in steps)
SCHEDULE_PAPER: dict[str, float | int] = {"min_temperature": 0.1, "max_temperature": 1.0,
                                          "period": 400}


def cosine_temperature(step: int, min_temperature: float, max_temperature: float,
                       period: int) -> float:
    """``tau(step) = tau_min + (tau_max - tau_min) (1 + cos(2 pi step / period)) / 2``.

    A Python float (no tensor, so nothing synchronises with a device). The phase is taken
    modulo ``period`` first, so the value is exactly periodic however long the run; with
    ``min_temperature == max_temperature`` it is that temperature exactly.

    >>> cosine_temperature(0, 0.1, 1.0, 400), cosine_temperature(200, 0.1, 1.0, 400)
    (1.0, 0.1)
    """
    phase = (step % period) / period
    return min_temperature + (max_temperature - min_temperature) * 0.5 * (
        1.0 + math.cos(2.0 * math.pi * phase))


def _schedule_options(min_temperature: float, max_temperature: float, period: int,
                      positive_in_denominator: bool) -> dict:
    """The schedule's hyper-parameters checked once for the module and the functional form."""
    low, high = check_temperature_range(min_temperature, max_temperature)
    return {"min_temperature": low, "max_temperature": high,
            "period": check_int("period", period, 1),
            "positive_in_denominator": bool(positive_in_denominator)}


def _temperature_schedule(cands: list[Candidates], temperature: float, *,
                          positive_in_denominator: bool,
                          tile_size: TileSize) -> tuple[Tensor, Stats]:
    """InfoNCE (or DCL) at the step's temperature: the kernel of :class:`InfoNCELoss`."""
    return per_anchor_losses(cands, temperature, method="TemperatureSchedule",
                             tile_size=tile_size, positive_in_denominator=positive_in_denominator)


class TemperatureScheduleLoss(ContrastiveLoss):
    """InfoNCE with a cosine temperature schedule (Kukleva et al., ICLR 2023).

    ``tau(step)`` is :func:`cosine_temperature`; see the module docstring for the form, the
    defaults (the authors' README: 0.1 to 1.0, period 400) and who sets the step. With
    ``min_temperature == max_temperature`` it is exactly ``InfoNCELoss(min_temperature)``
    (``positive_in_denominator=False``: ``DCLLoss``, GraphCL's loss).

    Args:
        min_temperature: tau_min, the lowest temperature (> 0).
        max_temperature: tau_max, the highest (>= ``min_temperature``); the first step's.
        period: T, the number of steps of one period (>= 1).
        step: the step to start at (>= 0); a driver sets it later (:attr:`step`).

    ``form``, ``positive_in_denominator``, ``gather_distributed``, ``gather_fn``,
    ``check_finite``, ``tile_size`` and ``reduction`` are as in
    :class:`~adaptcl.plugins.InfoNCELoss`. Every rank computes the same temperature from the
    same step, so gathering needs no communication beyond the candidates.

    ``step`` is saved in ``state_dict`` (as this module's extra state, a 0-d int64 tensor) and
    restored by ``load_state_dict``. After each call ``last_stats`` holds ``loss``, ``plain_loss``,
    ``alignment``, ``temperature`` (the step's tau), ``mean_w`` and ``positive_probability``.

    Examples:
        >>> import torch
        >>> loss_fn = TemperatureScheduleLoss(0.1, 1.0, period=1000)
        >>> loss_fn.step = 500                 # e.g. Lightning's self.global_step
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32))
        >>> loss_fn.last_stats["temperature"]  # 0.1, the bottom of the cosine
        tensor(0.1000)
    """

    def __init__(self, min_temperature: float = 0.1, max_temperature: float = 1.0,
                 period: int = 400, *, step: int = 0, form: Form = "nt_xent",
                 positive_in_denominator: bool = True, gather_distributed: bool = False,
                 gather_fn: GatherFn | None = None, check_finite: bool = True,
                 tile_size: TileSize = "auto", reduction: Reduction = "mean") -> None:
        super().__init__(form=form, gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size, reduction=reduction)
        options = _schedule_options(min_temperature, max_temperature, period,
                                    positive_in_denominator)
        for name, value in options.items():
            setattr(self, name, value)
        self._step = check_int("step", step, 0)
        self._driven = False

    @property
    def step(self) -> int:
        """The step the next forward pass uses (an int >= 0); setting it marks the loss as
        :attr:`driven`."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        self._step = check_int("step", value, 0)
        self._driven = True

    def advance(self, steps: int = 1) -> int:
        """Move the schedule on by ``steps`` (after ``optimizer.step()``, like an LR
        scheduler's ``step()``); returns the new step. Marks the loss as :attr:`driven`."""
        self.step = self._step + check_int("steps", steps, 0)
        return self._step

    @property
    def driven(self) -> bool:
        """Whether a driver has set or advanced the step (an adapter that counts its own
        training steps when nothing drives the loss stops counting then)."""
        return self._driven

    def count_step(self) -> int:
        """Advance by one without becoming :attr:`driven`: for an adapter that counts its own
        training steps while no driver sets the step. Returns the new step."""
        self._step += 1
        return self._step

    @property
    def temperature(self) -> float:
        """tau at the current step (a Python float)."""
        return cosine_temperature(self._step, self.min_temperature, self.max_temperature,
                                  self.period)

    def get_extra_state(self) -> Tensor:
        # a 0-d CPU tensor: state dicts stay tensors only (weights_only loads, digests of them)
        return torch.tensor(self._step, dtype=torch.int64)

    def set_extra_state(self, state: Tensor) -> None:
        self._step = check_int("step", int(state), 0)

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None) -> tuple[Tensor, Stats]:
        return self.compute_from_candidates(self.candidates(z0, z1, negatives))

    def compute_from_candidates(self, cands: list[Candidates]) -> tuple[Tensor, Stats]:
        """Per-anchor losses on prepared candidates (adapters that build their own)."""
        return _temperature_schedule(cands, self.temperature,
                                     positive_in_denominator=self.positive_in_denominator,
                                     tile_size=self.tile_size)

    def extra_repr(self) -> str:
        return (f"min_temperature={self.min_temperature}, max_temperature="
                f"{self.max_temperature}, period={self.period}, step={self._step}, "
                f"positive_in_denominator={self.positive_in_denominator}, "
                f"{super().extra_repr()}")


class ScheduleControls:
    """The schedule's controls on a framework adapter whose core loss is a
    :class:`TemperatureScheduleLoss` (the attribute :attr:`schedule_attribute` names), written
    once for the Lightly, open_clip and sentence-transformers adapters: :attr:`step` (read and
    set; the core validates it), :meth:`advance`, :attr:`temperature` and
    :meth:`count_training_step`.
    """

    #: the attribute of the adapter that holds its core :class:`TemperatureScheduleLoss`
    schedule_attribute: str = "criterion"

    @property
    def _schedule(self) -> TemperatureScheduleLoss:
        return getattr(self, self.schedule_attribute)

    @property
    def step(self) -> int:
        """The step the next forward pass uses (the core's :attr:`TemperatureScheduleLoss.step`)."""
        return self._schedule.step

    @step.setter
    def step(self, value: int) -> None:
        self._schedule.step = value

    def advance(self, steps: int = 1) -> int:
        """Move the schedule on by ``steps`` (after ``optimizer.step()``); the new step."""
        return self._schedule.advance(steps)

    @property
    def temperature(self) -> float:
        """tau at the current step."""
        return self._schedule.temperature

    def count_training_step(self) -> None:
        """After a forward pass: one more step if gradients are on (a training step) and no
        driver has set the step (:attr:`TemperatureScheduleLoss.driven`), for a framework
        whose loop does not tell the loss its step."""
        schedule = self._schedule
        if torch.is_grad_enabled() and not schedule.driven:
            schedule.count_step()


def temperature_schedule(z0: Tensor, z1: Tensor, min_temperature: float = 0.1,
                         max_temperature: float = 1.0, period: int = 400, *, step: int = 0,
                         negatives: Tensor | None = None, form: Form = "nt_xent",
                         positive_in_denominator: bool = True, gather_distributed: bool = False,
                         gather_fn: GatherFn | None = None, check_finite: bool = True,
                         tile_size: TileSize = "auto",
                         reduction: Reduction = "mean") -> Tensor:
    """Functional temperature schedule at ``step``; arguments as :class:`TemperatureScheduleLoss`.

    Examples:
        >>> import torch
        >>> loss = temperature_schedule(torch.randn(8, 32), torch.randn(8, 32), 0.1, 1.0, 400,
        ...                             step=120)
    """
    options = _schedule_options(min_temperature, max_temperature, period,
                                positive_in_denominator)
    tau = cosine_temperature(check_int("step", step, 0), options["min_temperature"],
                             options["max_temperature"], options["period"])
    cands = functional_candidates(z0, z1, negatives, form=form,
                                  gather_distributed=gather_distributed, gather_fn=gather_fn,
                                  check_finite=check_finite, tile_size=tile_size, reduction=reduction)
    per_anchor, _ = _temperature_schedule(
        cands, tau, positive_in_denominator=options["positive_in_denominator"],
        tile_size=tile_size)
    return reduce(per_anchor, reduction)


def set_schedule_step(module: nn.Module, step: int) -> int:
    """Set the step of every :class:`TemperatureScheduleLoss` inside ``module`` (itself
    included); returns how many there were. What each adapter's training step calls with its
    framework's step (a plain loop may call it too).

    >>> set_schedule_step(nn.Sequential(TemperatureScheduleLoss(), nn.Linear(2, 2)), 7)
    1
    """
    check_int("step", step, 0)
    found = 0
    for m in module.modules():
        if isinstance(m, TemperatureScheduleLoss):
            m.step = step
            found += 1
    return found


def advance_schedules(module: nn.Module, steps: int = 1) -> int:
    """Advance every :class:`TemperatureScheduleLoss` inside ``module`` by ``steps`` (after an
    optimiser step); returns how many there were.

    >>> advance_schedules(TemperatureScheduleLoss())
    1
    """
    check_int("steps", steps, 0)
    found = 0
    for m in module.modules():
        if isinstance(m, TemperatureScheduleLoss):
            m.advance(steps)
            found += 1
    return found
