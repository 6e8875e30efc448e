"""A recipe's settings: each field of its config declares once, through :func:`setting`, what
the engine must know of it. From these declarations alone the engine builds the command line
and config file, checks a config before any work (:func:`check_settings`), tells what enters a
run's identity (:func:`identity_settings`) and what may be swept (:func:`sweepable`, expanded
by :class:`~adaptcl.recipes.engine.sweep.Sweep`).

Every number declares its range (``check``): a value outside it is refused before any work, in
one line, whichever loss is run, so no recipe meets it later in a loss's own check. A number
that may be any finite value says so with :data:`finite`.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import os
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from adaptcl.recipes.engine.errors import check_seed, note

#: a setting of how a run goes, not of what it computes (where files go, threads)
RUN_ONLY = {"identity": False, "sweep": False}


class Check(NamedTuple):
    """A bound on a number (each item of a list): ``what`` it must be, and the test."""

    what: str
    ok: Callable[[Any], bool]


positive = Check("a positive number", lambda v: v > 0)
non_negative = Check("a number >= 0", lambda v: v >= 0)
fraction = Check("a number in [0, 1)", lambda v: 0 <= v < 1)
open_fraction = Check("a number in (0, 1)", lambda v: 0 < v < 1)
#: any number (a float is always checked to be finite): MACL's A0
finite = Check("a finite number", lambda v: True)
#: a seed that is not an axis (the CV splits'): numpy's and scikit-learn's range
seed_range = Check("an integer in [0, 2**32 - 1]", lambda v: 0 <= v <= 2**32 - 1)


def at_least(low: float) -> Check:
    return Check(f"a number >= {low:g}", lambda v: v >= low)


@dataclasses.dataclass(frozen=True)
class Spec:
    """What the engine knows of one config field (see :func:`setting`)."""

    help: str = ""
    choices: tuple[Any, ...] | None = None
    convert: Callable[[Any], Any] | None = None
    check: Check | None = None
    identity: bool | str | Callable[[Any], Any] = True
    sweep: bool = True
    axis: str | None = None
    folder: bool = False
    losses: tuple[str, ...] | None = None
    omit_default: bool = False
    metavar: str | None = None


def setting(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING,
            help: str = "", choices: Sequence[Any] | None = None,
            convert: Callable[[Any], Any] | None = None, check: Check | None = None,
            identity: bool | str | Callable[[Any], Any] = True, sweep: bool = True,
            axis: str | None = None, folder: bool = False,
            losses: Sequence[str] | None = None, omit_default: bool = False,
            metavar: str | None = None) -> Any:
    """A config field and its :class:`Spec`.

    Args:
        default / factory: the default value, or a function making it (lists).
        help: the option's help text.
        choices: allowed values (strings match case-insensitively and become the canonical
            spelling).
        convert: the canonical form of a value (of each item), ``ValueError`` for a bad one.
        check: a bound every number (every item) must meet; ``None`` passes.
        identity: whether the field determines a result: ``True``, ``False`` (bookkeeping),
            the name of the part of a run it determines (``"pretrain"``, see
            :func:`identity_settings`), or a function of the value giving what enters it.
        sweep: whether a scalar may take several values in one run (each a point of the grid).
        axis: for a list field, the grid axis it holds (``"dataset"``, ``"loss"``, ``"seed"``):
            repeats are dropped with a note, and it may not be empty.
        folder: a folder the run writes: refused before any work if it cannot be written.
        losses: the losses that read the setting (their registry names; ``None``: every
            loss). A cell of another loss leaves it out of what varies its identity (see
            :func:`identity_settings`): a sweep over it computes that loss's cell once.
        omit_default: leave the setting out of a run's identity at its default value: a
            setting added after records were stored, whose default computes what those records
            computed, keeps their identities (any other value enters it).
        metavar: how the option's value is shown in ``--help`` (default: its type's name).
    """
    if losses is not None and (isinstance(losses, str) or not all(
            isinstance(name, str) for name in losses)):
        raise TypeError(f"losses must be a sequence of loss names, got {losses!r}")
    spec = Spec(help=help, choices=tuple(choices) if choices is not None else None,
                convert=convert, check=check, identity=identity, sweep=sweep, axis=axis,
                folder=folder, losses=tuple(losses) if losses is not None else None,
                omit_default=omit_default, metavar=metavar)
    return dataclasses.field(default=default, default_factory=factory,
                             metadata={"adaptcl": spec})


def spec_of(field: dataclasses.Field) -> Spec:
    return field.metadata.get("adaptcl") or Spec()


def specs(config: Any) -> dict[str, Spec]:
    """``{field name: Spec}`` of a config class or instance, in field order."""
    return {f.name: spec_of(f) for f in dataclasses.fields(config)}


def is_list_field(config_class: type, name: str) -> bool:
    return typing.get_origin(typing.get_type_hints(config_class)[name]) in (list, tuple)


def sweepable(config_class: type) -> list[str]:
    """The fields that may take several values: scalar, not boolean, declared ``sweep=True``."""
    hints = typing.get_type_hints(config_class)
    return [name for name, spec in specs(config_class).items() if spec.sweep
            and typing.get_origin(hints[name]) not in (list, tuple) and hints[name] is not bool]


def axis_fields(config_class: type) -> dict[str, str]:
    """``{axis: field}`` of the list fields holding a grid axis (``{"dataset": "datasets"}``)."""
    return {spec.axis: name for name, spec in specs(config_class).items() if spec.axis}


def _canonical(name: str, spec: Spec, value: Any) -> Any:
    if spec.choices is None:
        return value if value is None or spec.convert is None else spec.convert(value)
    for choice in spec.choices:
        if value == choice or (isinstance(value, str) and isinstance(choice, str)
                               and value.casefold() == choice.casefold()):
            return choice
    shown = ", ".join("none" if c is None else str(c) for c in spec.choices)
    raise ValueError(f"unknown {name.replace('_', ' ')} {value!r}; choose from {shown}")


def drop_repeats(name: str, items: list[Any], canonical: list[Any]) -> list[Any]:
    """``canonical`` (the canonical form of each of ``items``, the values given to the setting
    ``name``) without repeats, in first occurrence's order, with one note naming them (a recipe
    that finds the canonical form itself, as ``tu`` a dataset's folder, says it so too)."""
    kept: dict[Any, Any] = {}
    repeats = []
    for text, value in zip(items, canonical, strict=True):
        if value in kept:
            repeats.append(f"{text!r} repeats {kept[value]!r}" if text != kept[value]
                           else f"{text!r} is given more than once")
        else:
            kept[value] = text
    if repeats:
        note(f"--{name.replace('_', '-')}: {', '.join(repeats)}; running each once")
    return list(kept)


def field_defaults(config_class: type) -> dict[str, Any]:
    """``{field: default}`` of a config class (a factory's value for a list)."""
    return {f.name: f.default_factory() if f.default is dataclasses.MISSING  # type: ignore[misc]
            else f.default for f in dataclasses.fields(config_class)}


def _kinds(hint: Any) -> tuple[type, ...]:
    """The types a value (an item of a list) of a field annotated ``hint`` may have."""
    if typing.get_origin(hint) in (list, tuple):
        return _kinds(typing.get_args(hint)[0])
    if typing.get_origin(hint) is collections.abc.Callable:
        return (collections.abc.Callable,)  # a model given through the Python API
    args = typing.get_args(hint)
    if args and typing.get_origin(hint) in (typing.Union, types.UnionType):
        return tuple(k for a in args for k in _kinds(a))
    if hint is float:
        return (int, float)
    if hint is str:  # a path given through the Python API is a path
        return (str, os.PathLike)
    return (hint,) if isinstance(hint, type) else (object,)


def _wanted(kinds: tuple[type, ...]) -> str:
    """``kinds`` as a message names them: ``float``, ``str or none``."""
    return " or ".join("none" if k is type(None) else k.__name__ for k in kinds
                       if (k is not int or float not in kinds) and k is not os.PathLike)


def _check_type(name: str, hint: Any, value: Any, *, several: bool = False,
                items: bool = True) -> None:
    """Refuse a ``value`` of the field ``name`` (annotated ``hint``) that is not of its type,
    in one ``ValueError`` naming the field: a list field takes a list of its item type; a
    scalar one value of its type or, where ``several`` (a config file's swept setting), a list
    of such values. ``items=False`` checks the list only (seeds are checked as seeds)."""
    kinds = _kinds(hint)
    if typing.get_origin(hint) in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} must be a list of {_wanted(kinds)}, got {value!r}")
        values = value
    else:
        values = value if several and isinstance(value, (list, tuple)) else [value]
    for item in values if items else ():
        wrong = isinstance(item, bool) and bool not in kinds  # True is an int to Python
        if wrong or not isinstance(item, kinds):
            quote = (f" (text in quotes: '{item}')" if str in kinds and not isinstance(item, bool)
                     and isinstance(item, (int, float)) else "")  # YAML's precision: 32
            raise ValueError(f"{name} must be {_wanted(kinds)}, got {item!r}{quote}")


def check_settings(config: Any) -> None:
    """Canonicalise and check every field of ``config`` by its :class:`Spec`, in place.

    Each value must have its field's type; choices and converters give it its canonical
    spelling; an axis drops repeats (with a note) and may not be empty, seeds must be integers
    in ``[0, 2**32 - 1]``; floats must be finite and numbers meet the field's ``check``.
    Raises ``ValueError`` naming the field and the bad value.
    """
    hints = typing.get_type_hints(type(config))
    for name, spec in specs(config).items():
        setattr(config, name, _checked(name, spec, hints[name], getattr(config, name)))


def check_given(config_class: type, values: Mapping[str, Any]) -> None:
    """Check each of ``values`` (a config file's settings, of ``config_class`` or another
    settings class such as the job options: a setting of neither is left alone) as
    :func:`check_settings` checks its field, one field at a time: ``ValueError`` naming it.

    Every value must have its field's type (a file holds any YAML: ``losses: 5``, ``[macl,
    null]``, ``{macl: 1}``); a scalar but a flag may hold a list, the values of a sweep (one
    value where the setting cannot vary, as on the command line)."""
    hints, known = typing.get_type_hints(config_class), specs(config_class)
    for name, value in values.items():
        if name in known:
            _checked(name, known[name], hints[name], value, unique=False,
                     several=hints[name] is not bool)


def _checked(name: str, spec: Spec, hint: Any, value: Any, unique: bool = True,
             several: bool = False) -> Any:
    """``value`` of the field ``name`` checked, in its canonical form (see
    :func:`check_settings`); ``unique=False`` keeps an axis' repeats (and says nothing);
    ``several``: a scalar may hold a list of values (a config file's sweep)."""
    _check_type(name, hint, value, several=several, items=spec.axis != "seed")
    if isinstance(value, (list, tuple)):
        items = [_canonical(name, spec, item) for item in value]
        if spec.axis:
            items = drop_repeats(name, list(value), items) if unique else items
            if not items:
                raise ValueError(f"{name} must not be empty")
            if spec.axis == "seed":
                items = [check_seed(s, f"--{name}") for s in items]
        value = items
    else:
        value = _canonical(name, spec, value)
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{name} must be a finite number, got {item!r}")
        if spec.check is None or item is None:
            continue
        if (isinstance(item, bool) or not isinstance(item, (int, float))
                or not spec.check.ok(item)):
            shown = f"each value of {name}" if isinstance(value, list) else name
            raise ValueError(f"{shown} must be {spec.check.what}, got "
                             f"{value if isinstance(value, list) else item!r}")
    return value


def as_record(values: Any) -> dict[str, Any]:
    """A config (or ``{field: value}``) as JSON and YAML hold it: paths as strings, tuples as
    lists, anything else not plain (a callable given as ``model``) by its ``repr``."""
    if dataclasses.is_dataclass(values):
        values = {f.name: getattr(values, f.name) for f in dataclasses.fields(values)}

    def plain(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        return value.__fspath__() if hasattr(value, "__fspath__") else repr(value)

    return {name: plain(value) for name, value in values.items()}


def identity_settings(config: Any, part: str | None = None, *, loss: str | None = None,
                      base: Any = None) -> dict[str, Any]:
    """What of ``config`` enters a run's identity: the fields declared ``identity=True``, those
    of ``part`` (every part when it is ``None``), a function's value for those declared with
    one; never an axis (the cell holds it).

    With ``loss``, a setting declared for other losses (``setting(losses=...)``) does not
    determine the cell's numbers: it enters at ``base``'s value (the run's first point, the
    same at every point of a sweep; a run that does not sweep it keeps the value, so the cell's
    identity, and a record stored before, stay as they were), or not at all without ``base``.
    A setting declared ``omit_default`` enters only where its value is not the default.
    """
    out = {}
    defaults = field_defaults(type(config))
    for name, spec in specs(config).items():
        rule = spec.identity
        if spec.axis or rule is False or (isinstance(rule, str) and part not in (None, rule)):
            continue
        source = config
        if loss is not None and spec.losses is not None and loss not in spec.losses:
            if base is None:
                continue
            source = base
        value = getattr(source, name)
        if spec.omit_default and value == defaults[name]:
            continue
        out[name] = rule(value) if callable(rule) else value
    return out
