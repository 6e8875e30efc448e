"""The settings of a GraphCL training on several devices, checked before any work (imports no
framework: the configs of ``tu`` and ``moleculenet`` use it)."""

from __future__ import annotations

from typing import Any

#: on several devices each rank draws its augmentations from ``seed + stride * rank``
AUGMENTATION_RANK_STRIDE = 1_000_003

#: Lightning strategies of a multi-device training ("auto" is "ddp" on several devices); a
#: spawned or forked rank would not give its history back to the command
STRATEGIES = ("auto", "ddp")


def check_devices(batch_size: int, devices: int, strategy: str, *,
                  batch_name: str = "batch_size") -> None:
    """Refuse a multi-device setting that cannot run: ``ValueError`` naming the field.

    Each of ``devices`` processes takes ``batch_size / devices`` graphs a step, so the batch
    must split evenly with at least 2 graphs per device; ``strategy`` must be one of
    :data:`STRATEGIES` (each rank runs the command again).
    """
    if devices > 1 and (batch_size % devices or batch_size // devices < 2):
        raise ValueError(f"{batch_name} ({batch_size}) must be a multiple of devices ({devices}) "
                         "with at least 2 graphs per device (each device takes its share of "
                         "the batch)")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(map(repr, STRATEGIES))} (each "
                         f"rank runs the command again), got {strategy!r}")


def devices_identity(devices: int, strategy: str) -> dict[str, Any]:
    """What a run on several devices adds to its identity (per-rank BatchNorm and data order,
    the gathering loss). One device adds nothing, so its stored runs stay those of one
    process."""
    return {} if devices <= 1 else {"distributed": {"devices": devices, "strategy": strategy}}
