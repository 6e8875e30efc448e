"""The temperature schedule's settings as the training recipes take them: Kukleva et al.'s
tau_max (``--max-temperature``) and a period in epochs (``--schedule-period``).

Reference: Kukleva et al., "Temperature Schedules for self-supervised contrastive methods on
long-tail data", ICLR 2023 (tau 0.1 to 1.0, five periods per training).
"""

from __future__ import annotations

from typing import Any


def resolve_schedule(cfg: Any) -> None:
    """Fill in ``cfg.schedule_period`` (none: a fifth of ``cfg.epochs``, the paper's five
    periods) and, with ``temperature_schedule``, refuse ``max_temperature < temperature`` (its
    tau_max and tau_min) with a ``ValueError`` naming both."""
    if cfg.schedule_period is None:
        cfg.schedule_period = cfg.epochs / 5
    if "temperature_schedule" in cfg.losses and cfg.max_temperature < cfg.temperature:
        raise ValueError(f"max_temperature ({cfg.max_temperature}) must be >= temperature "
                         f"({cfg.temperature}): the schedule's tau_max and tau_min")


def schedule_steps(period_epochs: float, steps_per_epoch: int) -> int:
    """The schedule's period in optimisation steps: ``period_epochs`` epochs, at least one step.

    >>> schedule_steps(4.0, 2), schedule_steps(0.1, 3)
    (8, 1)
    """
    return max(1, round(period_epochs * steps_per_epoch))
