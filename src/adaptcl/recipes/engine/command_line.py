"""A recipe's command line and config file, built from its config's declarations by tyro.

One option per config field (``--batch-size``; a boolean ``--x`` / ``--no-x``; a sweepable
setting takes several values, an axis of the grid), the job options, ``--preset NAME``,
``--config FILE`` (a run's ``config.yaml`` as the defaults) and ``--print-config``. Every
refusal is one line (``adaptcl <recipe>: error: ...``, exit 2).

Why tyro: of the libraries that build a command line from dataclasses it alone keeps this
project's GNU flag style (``--batch-size``, ``--no-progress``, space-separated lists) with
``--help`` in a fraction of a second; jsonargparse spells ``--batch_size`` with JSON lists and
Hydra ``key=value``. tyro prints its errors in a box: :func:`_one_line` makes them one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

from adaptcl.recipes.engine.errors import RecipeError, user_errors
from adaptcl.recipes.engine.jobs import JobOptions
from adaptcl.recipes.engine.settings import Sweep, field_defaults, one_value, spec_of, sweepable


@dataclasses.dataclass
class Invocation:
    """What a command line asks for: the settings, how the cells run, the preset named and
    whether only to print the config."""

    sweep: Sweep
    jobs: JobOptions
    preset: str | None
    print_config: bool = False


class _OneLine(Exception):
    """A parse error, turned into one line by :func:`parse`."""


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _one_line(event: Any) -> None:
    """tyro's parse-error hook: the error as one line (tyro would print a box)."""
    from tyro import _errors as errors

    argument = getattr(event, "argument", None)
    option = (_option(argument.field.intern_name) if argument is not None
              and getattr(argument, "field", None) is not None else None)
    if isinstance(event, errors.UnrecognizedArgs):
        raise _OneLine(f"unrecognized arguments: {' '.join(event.tokens)}")
    if isinstance(event, errors.InvalidChoice):
        raise _OneLine(f"argument {option}: invalid choice {event.value!r} (choose from "
                       f"{', '.join(event.choices)})")
    if isinstance(event, errors.BadValue):
        raise _OneLine(f"argument {option}: {event.reason}")
    message = str(getattr(event, "message", "") or type(event).__name__)
    if "Could not find valid parse for arguments:" in message:
        given = message.split(":", 1)[1].strip().strip("[]")
        message = f"invalid value {given}"
    raise _OneLine(f"argument {option}: {message}" if option else message)


def _unwrap(hint: Any) -> tuple[Any, bool, bool]:
    """``(item type, is a list, may be None)`` of a field's annotation."""
    optional = False
    args = typing.get_args(hint)
    if (isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union) \
            and type(None) in args:
        optional = True
        hint = next(a for a in args if a is not type(None))
    if typing.get_origin(hint) in (list, tuple):
        return typing.get_args(hint)[0], True, optional
    return hint, False, optional


@functools.cache
def _item(kind: type, optional: bool) -> Any:
    """An option's item type for tyro: ``kind``, or when ``optional`` also ``none`` (any case)."""
    import tyro

    if not optional:
        return kind

    def parse(args: list[str]) -> Any:
        return None if args[0].lower() == "none" else kind(args[0])

    spec = tyro.constructors.PrimitiveConstructorSpec(
        nargs=1, metavar=getattr(kind, "__name__", "VALUE").upper() + "|none",
        instance_from_str=parse, is_instance=lambda v: v is None or isinstance(v, kind),
        str_from_instance=lambda v: ["none" if v is None else str(v)])
    return Annotated[kind | None, spec]


def _view(config_class: type, defaults: Mapping[str, Any], presets: Sequence[str]) -> type:
    """The dataclass tyro parses: every config field (a scalar as a list of values), the job
    options and the meta options, with ``defaults``."""
    import tyro

    hints = {**typing.get_type_hints(config_class), **typing.get_type_hints(JobOptions)}
    swept = set(sweepable(config_class))
    fields: list[Any] = []
    for f in (*dataclasses.fields(config_class), *dataclasses.fields(JobOptions)):
        spec, default = spec_of(f), defaults[f.name]
        kind, is_list, optional = _unwrap(hints[f.name])
        text = spec.help + ("" if spec.choices is None else "; one of " + ", ".join(
            "none" if c is None else str(c) for c in spec.choices))
        metavar = getattr(kind, "__name__", "VALUE").upper() + ("|none" if optional else "")
        if is_list or f.name in swept or f.name == "cluster_option":
            metavar = f"{metavar} [{metavar} ...]"
        # a help text that says its default itself (an environment variable) gets no other
        hint = {"help_behavior_hint": ""} if "(default:" in spec.help else {}
        arg = tyro.conf.arg(help=text, metavar=metavar, **hint)
        if kind is bool and not is_list:
            fields.append((f.name, Annotated[bool, arg], dataclasses.field(default=default)))
            continue
        value = list(default) if isinstance(default, (list, tuple)) else [default]
        fields.append((f.name, Annotated[list[_item(kind, optional)], arg],  # type: ignore[misc]
                       dataclasses.field(default_factory=lambda v=value: list(v))))
    shown = f": {', '.join(presets)} (default: {presets[0]})" if presets else ": this recipe has none"
    meta = [("preset", Annotated[str | None, tyro.conf.arg(
                 help=f"named defaults{shown}; options given override them", metavar="NAME",
                 help_behavior_hint="")], dataclasses.field(default=None)),
            ("config", Annotated[str | None, tyro.conf.arg(
                help="a run's config.yaml: run its settings again (options given override "
                     "them)", metavar="FILE", help_behavior_hint="")],
             dataclasses.field(default=None)),
            ("print_config", Annotated[bool, tyro.conf.arg(
                help="print the settings as a config file and exit", help_behavior_hint=""),
                tyro.conf.FlagCreatePairsOff], dataclasses.field(default=False))]
    view = dataclasses.make_dataclass(config_class.__name__, [*meta, *fields])
    view.__doc__ = config_class.__doc__
    return view


def read_config_file(path: str, recipe: str) -> dict[str, Any]:
    """The settings of a run's ``config.yaml``, or one line naming what is wrong with it."""
    import yaml

    try:
        loaded = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecipeError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RecipeError(f"--config {path} is not a readable YAML file ({first})") from None
    if not isinstance(loaded, dict):
        raise RecipeError(f"--config {path}: expected settings by name, got "
                          f"{type(loaded).__name__}")
    if loaded.get("recipe", recipe) != recipe:
        raise RecipeError(f"--config {path} is a config of adaptcl {loaded['recipe']}, not of "
                          f"adaptcl {recipe}")
    return {k: v for k, v in loaded.items() if k != "recipe"}


def parse(recipe: Any, argv: Sequence[str], prog: str) -> Invocation:
    """The :class:`Invocation` of ``argv`` for the recipe class ``recipe``; ``--help`` prints
    and exits 0, a bad option or setting is a one-line :class:`RecipeError`."""
    import tyro
    from tyro import _errors as errors

    config_class, presets = recipe.config_class, dict(recipe.presets)
    # --preset, --config and --print-config first: they set the defaults
    first = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name in ("--preset", "--config"):
        first.add_argument(name)
    first.add_argument("--print-config", action="store_true")
    meta, _ = first.parse_known_args(list(argv))
    defaults = field_defaults(config_class) | field_defaults(JobOptions)
    preset = meta.preset if meta.preset is not None else next(iter(presets), None)
    from_file: dict[str, Any] = {}
    if meta.config is not None:
        from_file = read_config_file(meta.config, recipe.name)
        if meta.preset is None and from_file.get("preset") is not None:
            preset = from_file["preset"]
    from_file.pop("preset", None)
    if preset is not None:
        if preset not in presets:
            shown = ", ".join(presets) or "none: this recipe has no presets"
            raise RecipeError(f"--preset {preset!r} is not one of this recipe's presets ({shown})")
        defaults.update(presets[preset])
    unknown = [k for k in from_file if k not in defaults]
    if unknown:
        raise RecipeError(f"--config {meta.config}: unknown setting{'s' * (len(unknown) > 1)} "
                          f"{', '.join(unknown)} for adaptcl {recipe.name}")
    defaults.update(from_file)
    usage = ("A setting given several values (--temperature 0.1 0.2) is run at each: an axis "
             "of the grid beside the datasets, losses and seeds.")
    epilog = ("\n\nexample:\n" + "\n".join(f"  {line}" for line in
                                           recipe.example.strip().splitlines())
              if recipe.example else "")
    try:
        with errors.on_parse_error(_one_line):
            parsed = tyro.cli(_view(config_class, defaults, list(presets)), args=list(argv),
                              prog=prog, description=f"{recipe.description}\n\n{usage}{epilog}")
    except _OneLine as err:  # the CLI prints it as its one line, exit 2
        raise RecipeError(str(err)) from None
    return _invocation(recipe, parsed, preset, meta.print_config)


def _invocation(recipe: Any, parsed: Any, preset: str | None, print_config: bool) -> Invocation:
    """The settings and job options of a parsed view (a scalar's values as a list: a sweep, or
    one value for what cannot vary)."""
    values = {f.name: getattr(parsed, f.name) for f in dataclasses.fields(recipe.config_class)}
    with user_errors():
        sweep = Sweep.from_values(recipe.config_class, values)
        options = {}
        for f in dataclasses.fields(JobOptions):  # each a scalar, but --cluster-option's list
            value = getattr(parsed, f.name)
            single = isinstance(value, list) and f.name != "cluster_option"
            options[f.name] = one_value(f.name, value) if single else value
    return Invocation(sweep=sweep, jobs=JobOptions(**options), preset=preset,
                      print_config=print_config)
