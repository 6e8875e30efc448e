"""The settings of a GraphCL training on several devices (no framework import: the configs of
``tu`` and ``moleculenet`` check them)."""

from __future__ import annotations

from typing import Any

#: on several devices each rank draws its augmentations from ``seed + stride * rank``
AUGMENTATION_RANK_STRIDE = 1_000_003

#: Lightning strategies of a multi-device training ("auto" is "ddp" on several devices); a
#: spawned or forked rank would not give its history back to the command
STRATEGIES = ("auto", "ddp")


def check_devices(batch_size: int, devices: int, strategy: str, *,
                  batch_name: str = "batch_size") -> None:
    """Refuse a batch that does not split evenly with at least 2 graphs per device, or a
    strategy not in :data:`STRATEGIES`: ``ValueError`` naming the field."""
    if devices > 1 and (batch_size % devices or batch_size // devices < 2):
        raise ValueError(f"{batch_name} ({batch_size}) must be a multiple of devices ({devices}) "
                         "with at least 2 graphs per device (each device takes its share of "
                         "the batch)")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(map(repr, STRATEGIES))} (each "
                         f"rank runs the command again), got {strategy!r}")


def devices_identity(devices: int, strategy: str) -> dict[str, Any]:
    """What a run on several devices adds to its identity (per-rank BatchNorm and data order,
    the gathering loss); one device adds nothing."""
    return {} if devices <= 1 else {"distributed": {"devices": devices, "strategy": strategy}}
