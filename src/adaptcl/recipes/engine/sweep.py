"""A run's sweep: the settings as given, where a sweepable setting may hold several values,
expanded into its points (:class:`Sweep`), each a config of its own; and the grid's size,
counted before any config is built (:func:`grid_size`)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from adaptcl.recipes.engine.settings import (
    axis_fields,
    drop_repeats,
    field_defaults,
    is_list_field,
    sweepable,
)

#: a point of a sweep: ``((field, value), ...)`` in the config's field order
Point = tuple[tuple[str, Any], ...]


def one_value(name: str, values: Sequence[Any]) -> Any:
    """The one value given to an option that cannot vary within one run, or ``ValueError``."""
    option = "--" + name.replace("_", "-")
    if not values:
        raise ValueError(f"{option} needs a value")
    if len(values) > 1:
        raise ValueError(f"{option} takes one value (it cannot vary within one run), got "
                         f"{' '.join('none' if v is None else str(v) for v in values)}")
    return values[0]


def grid_size(config_class: type, values: Mapping[str, Any]) -> tuple[int, str]:
    """The cells ``values`` (``{field: value}``, a swept one a list) ask for, counted before
    any config is built: the product of the axes' and the swept settings' numbers of values (a
    repeat once), and how they multiply (`` (losses 2 x seeds 3 x lr 1,000)``)."""
    axes, swept = set(axis_fields(config_class).values()), set(sweepable(config_class))
    sizes = [(name, len({repr(v) for v in value})) for name, value in values.items()
             if isinstance(value, (list, tuple)) and (name in axes or name in swept)]
    sizes = [(name, n) for name, n in sizes if name in axes or n > 1]
    shown = " x ".join(f"{name} {n:,}" for name, n in sizes)
    return math.prod(n for _, n in sizes), f" ({shown})" if shown else ""


class Sweep:
    """A run's settings where sweepable ones may hold several values: ``raw`` (the settings as
    given, each swept field at its first value), ``axes`` (``{field: [values]}`` of those with
    more), the ``base`` config and one config per point. Each point's config is built from the
    settings as given, so a default derived from another field is derived per point."""

    def __init__(self, config_class: type, raw: Mapping[str, Any],
                 axes: Mapping[str, Sequence[Any]] | None = None) -> None:
        self.config_class = config_class
        self.raw = dict(raw)
        self.axes = {name: list(values) for name, values in (axes or {}).items()}
        allowed = sweepable(config_class)
        for name, values in self.axes.items():
            if name not in allowed:
                one_value(name, values)
        points = self.points()
        self.base = self._build(points[0])
        # the axes as the first config spelled them (canonical, no repeats): the other points
        # and the config file take them so, and a repeat is noted once
        self.raw.update({name: list(getattr(self.base, name))
                         for name in axis_fields(config_class).values()})
        self._configs = {points[0]: self.base} | {p: self._build(p) for p in points[1:]}

    @classmethod
    def of(cls, config: Any) -> Sweep:
        """The run of one config (no swept setting)."""
        return cls(type(config), {f.name: getattr(config, f.name)
                                  for f in dataclasses.fields(config)})

    @classmethod
    def from_values(cls, config_class: type, values: Mapping[str, Any]) -> Sweep:
        """From ``{field: value}`` where a sweepable scalar may be a list of values; a field not
        given takes its default, an unknown one is refused."""
        known = field_defaults(config_class)
        unknown = [name for name in values if name not in known]
        if unknown:
            raise ValueError(f"unknown setting{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(unknown)} for this recipe")
        raw, axes, allowed = {}, {}, sweepable(config_class)
        for name, value in (known | dict(values)).items():
            if isinstance(value, (list, tuple)) and not is_list_field(config_class, name):
                # several values of what cannot vary (repeats too) are refused by __init__
                items = (drop_repeats(name, list(value), list(value)) if name in allowed
                         else list(value))
                raw[name] = one_value(name, items[:1])
                if len(items) > 1:
                    axes[name] = items
            else:
                raw[name] = value
        return cls(config_class, raw, axes)

    def points(self) -> list[Point]:
        """Every combination of the swept values, first axis outermost (``[()]`` without)."""
        names = list(self.axes)
        return [tuple(zip(names, combo, strict=True))
                for combo in itertools.product(*(self.axes[n] for n in names))]

    def _build(self, point: Point) -> Any:
        try:
            return self.config_class(**(self.raw | dict(point)))
        except ValueError as err:
            if not point:
                raise
            where = ", ".join(f"{k}={v}" for k, v in point)
            raise ValueError(f"{where}: {err}") from None

    def config_at(self, point: Point) -> Any:
        return self._configs[tuple(point)]

    def values(self) -> dict[str, Any]:
        """``{field: value}`` as given, swept fields as lists: what :meth:`from_values` reads
        back to the same run."""
        return self.raw | {name: list(values) for name, values in self.axes.items()}
