"""The command-line vocabulary every recipe shares: common options, config fields as options,
lists, case-insensitive choices and deprecated spellings."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from adaptcl.recipes.template.errors import RecipeError, check_seed
from adaptcl.recipes.template.loggers import LOGGERS
from adaptcl.recipes.template.torch_env import PRECISIONS
from adaptcl.registry import canonical_loss_name, loss_help


def note(message: str) -> None:
    """One line on stderr, ``adaptcl: note: <message>``: something the user should know that is
    not an error (a repeated value dropped, a cell another process is computing)."""
    print(f"adaptcl: note: {message}", file=sys.stderr, flush=True)


def deprecation_note(message: str) -> None:
    """A :func:`note` that an old spelling was used (and what replaces it)."""
    note(message)


class _DeprecatedAlias(argparse.Action):
    """An old spelling of an option: stores into the new one and prints a deprecation note."""

    def __init__(self, option_strings, dest, new: str = "", convert=None, **kwargs):
        self.new, self.convert = new, convert
        kwargs["default"] = argparse.SUPPRESS  # the new spelling owns the default
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        deprecation_note(f"{option_string} is deprecated; use {self.new}")
        try:
            value = self.convert(values) if self.convert else values
        except (ValueError, argparse.ArgumentTypeError) as err:
            parser.error(f"argument {option_string}: {err}")
        setattr(namespace, self.dest, value)


def _split_items(values: Sequence[str], option: str) -> list[str]:
    items: list[str] = []
    for value in values:
        if "," in value:
            deprecation_note(f"comma-separated {option} is deprecated; separate values with "
                             "spaces")
            items.extend(v for v in value.split(",") if v.strip())
        else:
            items.append(value)
    return items


def unique_items(raw: Sequence[str], converted: Sequence[Any], option: str) -> list[Any]:
    """``converted`` without repeats (first occurrence's order), compared after conversion (a
    case-folded choice, a loss alias, ``07`` and ``7``); one :func:`note` per option naming the
    repeats, e.g. ``--datasets: 'mutag' repeats 'MUTAG'; running each once``."""
    first: dict[Any, str] = {}
    kept, repeats = [], []
    for text, value in zip(raw, converted, strict=True):
        if value in first:
            repeats.append(f"{text!r} repeats {first[value]!r}" if text != first[value]
                           else f"{text!r} is given more than once")
        else:
            first[value] = text
            kept.append(value)
    if repeats:
        note(f"{option}: {', '.join(repeats)}; running each once")
    return kept


class ListAction(argparse.Action):
    """A space-separated list (``nargs='+'``); old comma-separated values still parse, with a note.

    ``item_type`` converts each item (argparse's ``type`` would see the comma form whole);
    repeated values are dropped after conversion, with a note (``unique=False`` keeps them).
    """

    def __init__(self, option_strings, dest, item_type=str, unique: bool = True, **kwargs):
        self.item_type, self.unique = item_type, unique
        kwargs.setdefault("nargs", "+")
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        option = option_string or self.dest
        items = _split_items(list(values), option)
        try:
            converted = [self.item_type(v) for v in items]
        except (ValueError, argparse.ArgumentTypeError) as err:
            parser.error(f"argument {option_string}: {err}")
        if self.unique:
            converted = unique_items(items, converted, option)
        setattr(namespace, self.dest, converted)


def choice_type(choices: Sequence[str], what: str) -> Callable[[str], str]:
    """An argparse ``type`` matching ``choices`` case-insensitively; returns the canonical name."""
    canonical = {c.casefold(): c for c in choices}

    def parse(text: str) -> str:
        try:
            return canonical[text.casefold()]
        except KeyError:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {text!r}; choose from {', '.join(choices)}") from None

    parse.__name__ = what
    return parse


def loss_type(allowed: Sequence[str], aliases: Mapping[str, str] | None = None
              ) -> Callable[[str], str]:
    """An argparse ``type`` resolving a loss name through :mod:`adaptcl.registry`: the canonical
    name; an old spelling with a one-line deprecation note; a recipe's alias silently."""

    def parse(text: str) -> str:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                name = canonical_loss_name(text, allowed=allowed, aliases=aliases)
            except ValueError as err:
                raise argparse.ArgumentTypeError(str(err)) from None
        for warning in caught:
            deprecation_note(str(warning.message))
        return name

    parse.__name__ = "loss"
    return parse


def canonical_choice(value: str, choices: Sequence[str], what: str) -> str:
    """The canonical spelling of ``value`` among ``choices`` (case-insensitive) or ValueError."""
    try:
        return choice_type(choices, what)(value)
    except argparse.ArgumentTypeError as err:
        raise ValueError(str(err)) from None


def seed_type(text: str) -> int:
    """An argparse ``type`` for one seed: an integer in ``[0, 2**32 - 1]`` (numpy's range)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid seed {text!r}; seeds are integers in [0, 2**32 - 1]") from None
    try:
        return check_seed(value, "seed")
    except RecipeError:
        raise argparse.ArgumentTypeError(
            f"seed {value} is out of range; seeds are integers in [0, 2**32 - 1]") from None


seed_type.__name__ = "seed"


def _seed_list(text: str) -> list[int]:
    items = [v.strip() for v in text.split(",") if v.strip()]
    return unique_items(items, [seed_type(v) for v in items], "--seed")


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1 (``--threads``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_common_arguments(parser: argparse.ArgumentParser, *, output_dir: str,
                         seeds: Sequence[int] | None | bool = (0,), data_root: bool = True,
                         data_root_help: str = "benchmark data folder",
                         threads: int | None = 1, device: bool = True,
                         devices: bool = False, logger: bool = True) -> None:
    """The options every recipe spells the same way.

    ``--data-root`` (default ``$ADAPTCL_DATA``), ``--output-dir`` (old ``--out-dir``),
    ``--seeds`` space-separated (``seeds=None``: the recipe's preset supplies them;
    ``seeds=False``: a recipe without randomness takes none) (old comma form and ``--seed``
    accepted with a note),
    ``--threads`` (old ``--num-threads``), ``--device``, ``--precision``, ``--devices`` /
    ``--strategy`` (where the framework supports several devices), ``--logger``,
    ``--no-progress``.
    """
    if data_root:
        parser.add_argument("--data-root", default=None,
                            help=f"{data_root_help} (default: $ADAPTCL_DATA)")
    parser.add_argument("--output-dir", default=output_dir, help="where results are written")
    parser.add_argument("--out-dir", dest="output_dir", action=_DeprecatedAlias,
                        new="--output-dir", help=argparse.SUPPRESS)
    if seeds is not False:
        parser.add_argument("--seeds", action=ListAction, item_type=seed_type, metavar="SEED",
                            default=argparse.SUPPRESS if seeds is None else list(seeds),
                            help="seeds, space-separated integers in [0, 2**32 - 1]"
                                 + (" (default: the preset's)" if seeds is None else ""))
        parser.add_argument("--seed", dest="seeds", action=_DeprecatedAlias, new="--seeds",
                            convert=_seed_list, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=positive_int, default=threads,
                        help="torch CPU threads (recorded in the results)")
    parser.add_argument("--num-threads", dest="threads", action=_DeprecatedAlias, new="--threads",
                        convert=positive_int, help=argparse.SUPPRESS)
    if device:
        parser.add_argument("--device", default="auto",
                            help="auto (CUDA when available, else CPU), cpu, cuda or cuda:N")
        parser.add_argument("--precision", choices=PRECISIONS, default="32",
                            help="training precision: 32, bf16-mixed or 16-mixed (fp16 with a "
                                 "gradient scaler)")
    if devices:
        parser.add_argument("--devices", type=int, default=1,
                            help="number of devices (Lightning; with --strategy ddp)")
        parser.add_argument("--strategy", default="auto", help="Lightning strategy, e.g. ddp")
    if logger:
        parser.add_argument("--logger", choices=LOGGERS, default="none",
                            help="training curves through the framework's logger")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bars")


def _optional(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return None if text.lower() == "none" else kind(text)

    parse.__name__ = getattr(kind, "__name__", "value")
    return parse


def add_config_arguments(parser: argparse.ArgumentParser, config_cls: type, *,
                         helps: Mapping[str, str] | None = None,
                         choices: Mapping[str, Sequence[str]] | None = None,
                         exclude: Sequence[str] = (),
                         loss_aliases: Mapping[str, str] | None = None) -> None:
    """One option per field of the dataclass ``config_cls`` not registered yet.

    ``--field-name`` with the field's type (``X | None`` also takes ``none``; lists are
    space-separated; a ``bool`` defaulting to false is a flag, one defaulting to true gets
    ``--no-field-name``); ``choices`` entries match case-insensitively. Options not given on
    the command line stay absent from the namespace, so the dataclass (or a preset) supplies
    the default, which the help shows.
    """
    hints = typing.get_type_hints(config_cls)
    defaults = config_cls()
    registered = {action.dest for action in parser._actions}
    for spec in dataclasses.fields(config_cls):
        name = spec.name
        option = "--" + name.replace("_", "-")
        if name in exclude or name in registered:
            continue
        default = getattr(defaults, name)
        text = (helps or {}).get(name, name.replace("_", " "))
        losses = name == "losses" and choices and name in choices
        if losses:  # loss names come from the registry: canonical names and the recipe's aliases
            text += f"; one of {loss_help(choices[name], loss_aliases)}"
        elif choices and name in choices:
            text += f"; one of {', '.join(choices[name])}"
        if not isinstance(default, bool) and not (default is None and "default" in text):
            text += f" (default: {default})"
        hint = hints[name]
        args = typing.get_args(hint)
        optional = (isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union) \
            and type(None) in args
        if optional:
            hint = next(a for a in args if a is not type(None))
        kind: Any = typing.get_args(hint)[0] if typing.get_origin(hint) in (list, tuple) else hint
        if losses:
            kind = loss_type(choices[name], loss_aliases)
        elif choices and name in choices:
            kind = choice_type(choices[name], name.replace("_", " "))
        common = dict(dest=name, default=argparse.SUPPRESS, help=text)
        if hint is bool:
            flag = option if not default else "--no-" + name.replace("_", "-")
            parser.add_argument(flag, action="store_false" if default else "store_true", **common)
        elif typing.get_origin(hint) in (list, tuple):
            parser.add_argument(option, action=ListAction, item_type=kind, metavar=name.upper(),
                                **common)
        else:
            parser.add_argument(option, type=_optional(kind) if optional else kind,
                                metavar=name.upper(), **common)


def config_kwargs(config_cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The fields of ``config_cls`` present in ``args`` (given, or common options)."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(config_cls)
            if hasattr(args, f.name)}
