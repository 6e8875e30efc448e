"""The temperature schedule's settings as the training recipes take them: Kukleva et al.'s
tau_max (``--max-temperature``) and a period in epochs (``--schedule-period``).

Reference: Kukleva et al., "Temperature Schedules for self-supervised contrastive methods on
long-tail data", ICLR 2023 (tau 0.1 to 1.0, five periods per training).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adaptcl.recipes.engine.settings import positive, setting

#: the losses that read the schedule's settings
SCHEDULE_LOSSES = ("temperature_schedule",)


def max_temperature() -> Any:
    """The ``--max-temperature`` setting (tau_max; read by ``temperature_schedule`` only)."""
    return setting(1.0, check=positive, losses=SCHEDULE_LOSSES, help="temperature_schedule's "
                   "tau_max (Kukleva et al.'s; tau_min: --temperature)")


def schedule_period() -> Any:
    """The ``--schedule-period`` setting, in epochs (``None``: :func:`resolve_schedule`)."""
    return setting(None, check=positive, losses=SCHEDULE_LOSSES, help="temperature_schedule's "
                   "period in epochs (none: a fifth of --epochs, the five periods per training "
                   "of Kukleva et al.; at least 2 steps)")


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


def check_period(cfg: Any, steps_per_epoch: int, where: str) -> None:
    """Refuse a schedule whose period is one optimisation step (``ValueError`` naming
    ``--schedule-period``, ``where`` the data it trains on): the cosine is at tau_max at every
    multiple of the period, so the temperature would never move and ``temperature_schedule``
    would silently train a fixed tau_max. Refused rather than said: such a cell is no result
    of the method it is labelled with, and nothing must be trained for it.

    >>> check_period(type("C", (), {"losses": ["temperature_schedule"], "schedule_period": 0.4,
    ...                             "epochs": 2})(), 2, "MUTAG")
    Traceback (most recent call last):
    ...
    ValueError: --schedule-period 0.4 (epochs; none: a fifth of --epochs 2) is 1 optimisation step on MUTAG (2 per epoch): temperature_schedule's temperature would stay at --max-temperature; give at least 1 epoch (2 steps)
    """
    if not set(SCHEDULE_LOSSES) & set(cfg.losses):
        return
    steps = schedule_steps(cfg.schedule_period, steps_per_epoch)
    if steps <= 1:
        raise ValueError(
            f"--schedule-period {cfg.schedule_period:g} (epochs; none: a fifth of --epochs "
            f"{cfg.epochs}) is {steps} optimisation step on {where} ({steps_per_epoch} per "
            "epoch): temperature_schedule's temperature would stay at --max-temperature; give "
            f"at least {2 / steps_per_epoch:g} epoch{'' if steps_per_epoch == 2 else 's'} "
            "(2 steps)")


def period_in_steps(settings: Mapping[str, Any], steps_per_epoch: int) -> dict[str, Any]:
    """A ``temperature_schedule`` cell's identity settings with the period as the steps it
    runs (``schedule_period_steps``), what determines its numbers: two periods that round to
    the same steps are one run.

    >>> period_in_steps({"lr": 0.01, "schedule_period": 4.1}, 2)
    {'lr': 0.01, 'schedule_period_steps': 8}
    """
    out = {k: v for k, v in settings.items() if k != "schedule_period"}
    out["schedule_period_steps"] = schedule_steps(settings["schedule_period"], steps_per_epoch)
    return out
