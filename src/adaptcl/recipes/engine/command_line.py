"""A recipe's command line and config file, built from its config's declarations by tyro.

One option per config field (``--batch-size``; a boolean ``--x`` / ``--no-x``; a sweepable
setting takes several values, an axis of the grid), the job options, ``--preset NAME``,
``--config FILE`` (a run's ``config.yaml`` as the defaults) and ``--print-config``. Every
refusal is one line (``adaptcl <recipe>: error: ...``, exit 2).

Why tyro: of the libraries that build a command line from dataclasses it alone keeps this
project's GNU flag style (``--batch-size``, ``--no-progress``, space-separated lists) with
``--help`` in a fraction of a second; jsonargparse spells ``--batch_size`` with JSON lists and
Hydra ``key=value``. Only tyro's public API is used (``tyro.cli``, ``tyro.conf``,
``tyro.constructors``), and the parse errors are ours, one line each (tyro would print boxes):
every value is read by our own converter (:func:`_item`: a bad one is kept as
:class:`_Invalid` and named after parsing), and tyro hands back what it does not recognise
(``return_unknown_args``), which :func:`_unrecognized` names with the closest option.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import re
import types
import typing
import warnings
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, NamedTuple

from adaptcl.recipes.engine.config_file import read_config_file
from adaptcl.recipes.engine.errors import RecipeError, user_errors
from adaptcl.recipes.engine.job_options import JobOptions
from adaptcl.recipes.engine.settings import check_given, field_defaults, spec_of, sweepable
from adaptcl.recipes.engine.sweep import Sweep, grid_size, one_value


@dataclasses.dataclass
class Invocation:
    """What a command line asks for: the settings, how the cells run, the preset named and
    whether only to print the config."""

    sweep: Sweep
    jobs: JobOptions
    preset: str | None
    print_config: bool = False


class _Invalid(NamedTuple):
    """A value that is not of its option's type, named after parsing (:func:`_check_values`)."""

    text: str
    kind: str


def terminal_text(text: str) -> str:
    """A docstring's reST inline markup as a terminal shows it (``--help``): an inline literal
    and a role (``:func:``, ``:class:``, ``:ref:``, ...) as their text, the last part of a
    target written with ``~``.

    >>> terminal_text("``adaptcl <recipe> ...``: see :func:`~adaptcl.cli.main`")
    'adaptcl <recipe> ...: see main'
    """
    def role(match: re.Match[str]) -> str:
        shown, short = match.group("text").strip(), match.group("short")
        return shown.rsplit(".", 1)[-1] if short else shown

    text = re.sub(r":[a-z]+(?::[a-z]+)*:`(?P<short>~)?(?P<text>[^`<]*)(?:<[^`>]*>)?`", role, text)
    return re.sub(r"``(.+?)``", r"\1", text)


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


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
def _item(kind: type, optional: bool, converted: Any = None) -> Any:
    """An option's item type for tyro, read by our converter: ``kind(text)`` (or, when
    ``optional``, ``none`` in any case), an :class:`_Invalid` where that fails, so that tyro
    never refuses a value itself. ``converted``: the annotation of a setting whose own
    ``convert`` reads its values (``str | int | None``: ``"auto"`` or a number), so that a
    default of any of its types is one."""
    import tyro

    name = getattr(kind, "__name__", "VALUE")

    def parse(args: list[str]) -> Any:
        if optional and args[0].lower() == "none":
            return None
        try:
            return kind(args[0])
        except (TypeError, ValueError):
            return _Invalid(args[0], name)

    numbers = (int, float) if kind is float else (kind,)  # a float setting's default may be 1
    spec = tyro.constructors.PrimitiveConstructorSpec(
        nargs=1, metavar=name.upper() + ("|none" if optional else ""),
        instance_from_str=parse, str_from_instance=lambda v: ["none" if v is None else str(v)],
        is_instance=lambda v: converted is not None or (optional and v is None) or (
            isinstance(v, numbers) and not isinstance(v, bool)))
    if converted is not None:
        return Annotated[converted, spec]
    return Annotated[kind | None if optional else kind, spec]  # type: ignore[operator]


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
        text = terminal_text(spec.help) + ("" if spec.choices is None else "; one of " + ", ".join(
            "none" if c is None else str(c) for c in spec.choices))
        metavar = spec.metavar or (getattr(kind, "__name__", "VALUE").upper()
                                   + ("|none" if optional else ""))
        if is_list or f.name in swept or f.name == "cluster_option":
            metavar = f"{metavar} [{metavar} ...]"
        # a help text that says its default itself (an environment variable) gets no other
        hint = {"help_behavior_hint": ""} if "(default:" in spec.help else {}
        arg = tyro.conf.arg(help=text, metavar=metavar, **hint)
        if kind is bool and not is_list:
            fields.append((f.name, Annotated[bool, arg], dataclasses.field(default=default)))
            continue
        value = list(default) if isinstance(default, (list, tuple)) else [default]
        item = _item(kind, optional, None if spec.convert is None or is_list else hints[f.name])
        fields.append((f.name, Annotated[list[item], arg],  # type: ignore[misc]
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


def parse(recipe: Any, argv: Sequence[str], prog: str) -> Invocation:
    """The :class:`Invocation` of ``argv`` for the recipe class ``recipe``; ``--help`` prints
    and exits 0, a bad option or setting is a one-line :class:`RecipeError`."""
    import tyro

    config_class, presets = recipe.config_class, dict(recipe.presets)
    # --preset, --config and --print-config first: they set the defaults
    first = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for name in ("--preset", "--config"):
        first.add_argument(name)
    first.add_argument("--print-config", action="store_true")
    try:
        meta, _ = first.parse_known_args(list(argv))
    except argparse.ArgumentError as err:
        raise RecipeError(str(err)) from None
    defaults = field_defaults(config_class) | field_defaults(JobOptions)
    preset = meta.preset if meta.preset is not None else next(iter(presets), None)
    from_file: dict[str, Any] = {}
    if meta.config is not None:
        from_file = read_config_file(meta.config, recipe.name, config_class)
        if not isinstance(from_file.get("preset"), (str, type(None))):
            raise RecipeError(f"--config {meta.config}: preset must be str or none, got "
                              f"{from_file['preset']!r}")
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
    try:  # each of the file's settings on its own, so that its errors name the file
        with warnings.catch_warnings():  # (an old loss spelling is noted once, below)
            warnings.simplefilter("ignore", FutureWarning)
            for settings in (config_class, JobOptions):
                check_given(settings, from_file)
    except ValueError as err:
        raise RecipeError(f"--config {meta.config}: {err}") from None
    defaults.update(from_file)
    usage = ("A setting given several values (--temperature 0.1 0.2) is run at each: an axis "
             "of the grid beside the datasets, losses and seeds.")
    epilog = ("\n\nexample:\n" + "\n".join(f"  {line}" for line in
                                           recipe.example.strip().splitlines())
              if recipe.example else "")
    view = _view(config_class, defaults, list(presets))
    parsed, unknown = tyro.cli(view, args=list(argv), prog=prog, return_unknown_args=True,
                               description=terminal_text(f"{recipe.description}\n\n{usage}{epilog}"))
    if unknown:
        raise RecipeError(_unrecognized(unknown, view))
    _check_values(parsed)
    return _invocation(recipe, parsed, preset, meta.print_config)


def _unrecognized(tokens: Sequence[str], view: type) -> str:
    """``unrecognized arguments: ...``, with the closest option to each unknown one."""
    hints = typing.get_type_hints(view)
    known = ["--help"]
    for f in dataclasses.fields(view):
        known.append(_option(f.name))
        if hints[f.name] is bool and f.name != "print_config":
            known.append(_option("no_" + f.name))
    guesses = []
    for token in (t.split("=", 1)[0] for t in tokens if t.startswith("--") and len(t) > 2):
        # an option it begins (--temp: --temperature), else the most alike (--loss: --losses)
        close = sorted((k for k in known if k.startswith(token)), key=len) \
            or difflib.get_close_matches(token, known, n=1, cutoff=0.75)
        if close:
            guesses.append((token, close[0]))
    hint = ""
    if len(guesses) == 1:
        hint = f" (did you mean {guesses[0][1]}?)"
    elif guesses:
        hint = " (" + "; ".join(f"{n}: did you mean {c}?" for n, c in guesses) + ")"
    return f"unrecognized arguments: {' '.join(tokens)}{hint}"


def _check_values(parsed: Any) -> None:
    """Refuse the first value our converter could not read, naming its option."""
    for f in dataclasses.fields(parsed):
        value = getattr(parsed, f.name)
        bad = next((v for v in value if isinstance(v, _Invalid)), None) \
            if isinstance(value, list) else None
        if bad is not None:
            raise RecipeError(f"argument {_option(f.name)}: invalid {bad.kind} value "
                              f"{bad.text!r}")


def _invocation(recipe: Any, parsed: Any, preset: str | None, print_config: bool) -> Invocation:
    """The settings and job options of a parsed view (a scalar's values as a list: a sweep, or
    one value for what cannot vary)."""
    values = {f.name: getattr(parsed, f.name) for f in dataclasses.fields(recipe.config_class)}
    with user_errors():
        options = {}
        for f in dataclasses.fields(JobOptions):  # each a scalar, but --cluster-option's list
            value = getattr(parsed, f.name)
            single = isinstance(value, list) and f.name != "cluster_option"
            options[f.name] = one_value(f.name, value) if single else value
        jobs = JobOptions(**options)
        jobs.check_cells(*grid_size(recipe.config_class, values))  # before building a point
        sweep = Sweep.from_values(recipe.config_class, values)
    return Invocation(sweep=sweep, jobs=jobs, preset=preset, print_config=print_config)
