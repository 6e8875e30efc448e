"""A recipe's command line and config file, built from its config's declarations by tyro.

``adaptcl <recipe> --option value ...``: one option per config field (``--batch-size``; a
boolean is ``--x`` / ``--no-x``), the job options (:class:`~adaptcl.recipes.engine.jobs.
JobOptions`), ``--preset NAME`` (a named set of defaults the recipe declares; options given
override it), ``--config FILE`` (a run's ``config.yaml``: its settings become the defaults, so
the same command runs the same cells) and ``--print-config`` (print the settings as a config
file and exit). Every scalar setting the config declares sweepable takes one or more values
(``--temperature 0.1 0.2``); more than one makes it an axis of the grid. The settings are
checked by the config itself before any work; every refusal is one line (``adaptcl <recipe>:
error: ...``, exit 2).

Why tyro: of the libraries that build a command line from dataclasses it alone keeps this
project's GNU flag style as it is (``--batch-size``, ``--no-progress``, space-separated
lists) with ``--help`` in a fraction of a second; jsonargparse (LightningCLI's) spells options
``--batch_size`` with JSON lists and Hydra ``key=value``. tyro prints its errors in a box: its
parse-error hook (:func:`_one_line`) turns them into the project's one line.
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

from adaptcl.recipes.engine.errors import RecipeError
from adaptcl.recipes.engine.jobs import JobOptions
from adaptcl.recipes.engine.settings import Spec, Sweep, spec_of

_META = ("preset", "config", "print_config")


@dataclasses.dataclass
class Invocation:
    """What a command line asks for: the settings (a :class:`Sweep`), how the cells run, the
    preset named and whether only to print the config."""

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
    """The item type of an option for tyro: ``kind``, accepting ``none`` (any case) for
    ``None`` when ``optional``."""
    import tyro

    if not optional:
        return kind
    def parse(args: list[str]) -> Any:
        text = args[0]
        return None if text.lower() == "none" else kind(text)

    metavar = getattr(kind, "__name__", "VALUE").upper() + "|none"
    spec = tyro.constructors.PrimitiveConstructorSpec(
        nargs=1, metavar=metavar, instance_from_str=parse,
        is_instance=lambda v: v is None or isinstance(v, kind),
        str_from_instance=lambda v: ["none" if v is None else str(v)])
    return Annotated[kind | None, spec]


def _help(spec: Spec) -> str:
    text = spec.help
    if spec.choices is not None:
        shown = ", ".join("none" if c is None else str(c) for c in spec.choices)
        text += f"; one of {shown}"
    return text


def _metavar(kind: Any, optional: bool, several: bool) -> str:
    """``FLOAT``, ``INT|none``; ``FLOAT [FLOAT ...]`` where several values are taken."""
    one = getattr(kind, "__name__", "VALUE").upper() + ("|none" if optional else "")
    return f"{one} [{one} ...]" if several else one


def _view(config_class: type, defaults: Mapping[str, Any], presets: Sequence[str]) -> type:
    """The dataclass tyro parses: every config field (a scalar as a list of values), the job
    options and the meta options, with ``defaults``."""
    import tyro

    from adaptcl.recipes.engine.settings import sweepable

    hints = {**typing.get_type_hints(config_class), **typing.get_type_hints(JobOptions)}
    swept = set(sweepable(config_class))
    fields: list[Any] = []
    for f in (*dataclasses.fields(config_class), *dataclasses.fields(JobOptions)):
        spec, default = spec_of(f), defaults[f.name]
        kind, is_list, optional = _unwrap(hints[f.name])
        # a help text that says its default itself (an environment variable) gets no other
        hint = {"help_behavior_hint": ""} if "(default:" in spec.help else {}
        arg = tyro.conf.arg(help=_help(spec), metavar=_metavar(
            kind, optional, is_list or f.name in swept or f.name == "cluster_option"), **hint)
        if kind is bool and not is_list:
            fields.append((f.name, Annotated[bool, arg], dataclasses.field(default=default)))
            continue
        value = list(default) if isinstance(default, (list, tuple)) else [default]
        fields.append((f.name, Annotated[list[_item(kind, optional)], arg],  # type: ignore[misc]
                       dataclasses.field(default_factory=lambda v=value: list(v))))
    meta = [("preset", Annotated[str | None, tyro.conf.arg(
                 help="named defaults" + (f": {', '.join(presets)} (default: {presets[0]})"
                                          if presets else ": this recipe has none")
                 + "; options given override them", metavar="NAME", help_behavior_hint="")],
             dataclasses.field(default=None)),
            ("config", Annotated[str | None, tyro.conf.arg(
                help="a run's config.yaml: run its settings again (options given override "
                     "them)", metavar="FILE", help_behavior_hint="")],
             dataclasses.field(default=None)),
            ("print_config", Annotated[bool, tyro.conf.arg(
                help="print the settings as a config file and exit", help_behavior_hint=""),
                tyro.conf.FlagCreatePairsOff],
             dataclasses.field(default=False))]
    view = dataclasses.make_dataclass(config_class.__name__, [*meta, *fields])
    view.__doc__ = config_class.__doc__
    return view


def _meta(argv: Sequence[str]) -> argparse.Namespace:
    """``--preset``, ``--config`` and ``--print-config`` read first: they set the defaults."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--preset")
    parser.add_argument("--config")
    parser.add_argument("--print-config", action="store_true")
    known, _ = parser.parse_known_args(list(argv))
    return known


def read_config_file(path: str, recipe: str) -> dict[str, Any]:
    """The settings of a config file written by a run (``config.yaml``), or one line naming
    what is wrong with it."""
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
    """The :class:`Invocation` of ``argv`` for ``recipe`` (a recipe class: ``name``,
    ``config_class``, ``presets``, ``description``, ``example``); ``--help`` prints and exits
    0 (:class:`SystemExit`), a bad option or setting is a :class:`RecipeError` (one line)."""
    import tyro
    from tyro import _errors as errors

    config_class, presets = recipe.config_class, dict(recipe.presets)
    meta = _meta(argv)
    defaults = {f.name: (f.default if f.default is not dataclasses.MISSING
                         else f.default_factory())  # type: ignore[misc]
                for f in (*dataclasses.fields(config_class), *dataclasses.fields(JobOptions))}
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
    view = _view(config_class, defaults, list(presets))
    usage = ("A setting given several values (--temperature 0.1 0.2) is run at each: an axis "
             "of the grid beside the datasets, losses and seeds.")
    epilog = ("example:\n" + "\n".join(f"  {line}" for line in recipe.example.strip().splitlines())
              if recipe.example else None)
    try:
        with errors.on_parse_error(_one_line):
            parsed = tyro.cli(view, args=list(argv), prog=prog, description=recipe.description
                              + f"\n\n{usage}" + (f"\n\n{epilog}" if epilog else ""))
    except _OneLine as err:  # the CLI prints it as its one line, exit 2
        raise RecipeError(str(err)) from None
    return _invocation(recipe, parsed, preset, meta.print_config)


def _invocation(recipe: Any, parsed: Any, preset: str | None, print_config: bool) -> Invocation:
    """The settings and job options of a parsed view; one value for what cannot vary."""
    from adaptcl.recipes.engine.errors import user_errors
    from adaptcl.recipes.engine.settings import is_list_field, sweepable

    config_class = recipe.config_class
    swept = set(sweepable(config_class))
    values: dict[str, Any] = {}
    for f in dataclasses.fields(config_class):
        value = getattr(parsed, f.name)
        if isinstance(value, list) and not is_list_field(config_class, f.name):
            if not value:
                raise RecipeError(f"{_option(f.name)} needs a value")
            if len(value) > 1 and f.name not in swept:
                raise RecipeError(f"{_option(f.name)} takes one value (it cannot vary within "
                                  f"one run), got {' '.join(map(str, value))}")
            value = value if len(value) > 1 else value[0]
        values[f.name] = value
    options = {}
    for f in dataclasses.fields(JobOptions):
        value = getattr(parsed, f.name)
        if f.name != "cluster_option" and isinstance(value, list):
            if len(value) != 1:
                raise RecipeError(f"{_option(f.name)} takes one value, got "
                                  f"{' '.join(map(str, value)) or 'none'}")
            value = value[0]
        options[f.name] = value
    with user_errors():
        sweep = Sweep.from_values(config_class, values)
    return Invocation(sweep=sweep, jobs=JobOptions(**options), preset=preset,
                      print_config=print_config)
