"""Every setting of every recipe refuses a value outside what it declares: one line ``adaptcl
<recipe>: error: ...`` naming it, exit 2, before any work or file write (no ``config.yaml``, no
lock), whichever losses run; on the command line, and in a config file, where a value may also
be of the wrong type (``losses: [macl, 0]``, ``losses: 5``, ``{macl: 1}``, ``null``).

The table is derived from the declarations themselves (:func:`~adaptcl.recipes.engine.setting`:
its type, ``choices``, ``convert``, ``check``, ``folder``, ``axis``), so a recipe added later is
walked too, and a number can only escape it by declaring no range, which
:func:`test_every_number_declares_its_range` refuses.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import importlib
import types
import typing

import pytest
import yaml

from adaptcl.cli import RECIPES
from adaptcl.recipes.engine.job_options import JobOptions
from adaptcl.recipes.engine.settings import Spec, spec_of
from tests.recipes._cli import one_line_error

#: values tried, in order, for one that a declared ``check`` refuses
OUT_OF_RANGE = (-3, 0, 1, 2, 10**12)
#: what the sentence-encoder recipes need besides (they have no default model)
REQUIRED = {"sts": ["--model", "m:f"], "transfer": ["--model", "m:f"]}


def _recipes() -> dict[str, type]:
    """``{name: recipe class}`` of every recipe built on the engine (``compare`` reads result
    files and declares no settings)."""
    out = {}
    for name in RECIPES:
        recipe = importlib.import_module(f"adaptcl.recipes.{name}.recipe").RECIPE
        if dataclasses.is_dataclass(getattr(recipe, "config_class", None)):
            out[name] = recipe
    return out


def _number_kind(hint: typing.Any) -> type | None:
    """``int`` or ``float`` when a field (an item of a list field) holds numbers."""
    if typing.get_origin(hint) in (list, tuple):
        hint = typing.get_args(hint)[0]
    kinds = {a for a in typing.get_args(hint) if a is not type(None)} or {hint}
    return next((k for k in (float, int) if k in kinds), None)


def _invalid(name: str, hint: typing.Any, spec: Spec) -> tuple[str, str] | None:
    """``(value, what the line must hold)``: a value the declaration of the field ``name``
    refuses (``{afile}``: a file of the test's), or ``None`` where it declares nothing to refuse
    (a flag, a free text such as a model name or a device)."""
    if spec.choices is not None:
        return "no-such-value", "unknown "  # ... 'no-such-value'; choose from ...
    if spec.convert is not None:  # the line is the converter's own refusal
        try:
            spec.convert("no-such-value")
        except ValueError as refusal:
            return "no-such-value", str(refusal).split("'no-such-value'")[0]
        return "no-such-value", "error: "  # a converter that takes anything fails its case
    if spec.folder:
        return "{afile}/sub", f"--{name.replace('_', '-')} '{{afile}}/sub' is inside"
    if spec.axis == "seed":
        return "-1", "seed -1 is out of range"
    if spec.check is not None:
        bad = next((v for v in OUT_OF_RANGE if not spec.check.ok(v)), None)
        if bad is not None:
            return str(bad), f"{name} must be {spec.check.what}, got "
    if _number_kind(hint) is float:
        return "nan", f"{name} must be a finite number, got nan"
    return None


def _cases() -> list[tuple[str, str, str, str, list[str]]]:
    """``(recipe, field, value, expected, extra options)`` for every field of every recipe
    that declares something to refuse, and once more for a field read by some losses only,
    with a loss that does not read it."""
    cases = []
    for name, recipe in _recipes().items():
        config_class = recipe.config_class
        hints = typing.get_type_hints(config_class) | typing.get_type_hints(JobOptions)
        losses = next((f for f in dataclasses.fields(config_class)
                       if spec_of(f).axis == "loss"), None)
        for f in (*dataclasses.fields(config_class), *dataclasses.fields(JobOptions)):
            invalid = _invalid(f.name, hints[f.name], spec_of(f))
            if invalid is None:
                continue
            cases.append((name, f.name, *invalid, []))
            readers = spec_of(f).losses
            other = [loss for loss in (losses.default_factory() if losses else [])
                     if readers is not None and loss not in readers]
            if other:
                cases.append((name, f.name, *invalid, [f"--{losses.name}", other[0]]))
    return cases


@pytest.mark.parametrize(("recipe", "field", "value", "expected", "extra"), _cases(),
                         ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_a_value_outside_the_declaration_is_one_line_before_any_file(
        recipe, field, value, expected, extra, tmp_path, monkeypatch, capsys):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    value, expected = value.format(afile=afile), expected.format(afile=afile)
    monkeypatch.chdir(tmp_path)  # a default output folder would be made here
    argv = [recipe, *REQUIRED.get(recipe, []), *extra, f"--{field.replace('_', '-')}", value]
    if field != "output_dir":
        argv += ["--output-dir", str(tmp_path / "out")]
    line = one_line_error(capsys, argv, expected)
    assert value in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing written


def test_every_number_declares_its_range():
    """A number with no declared range would be refused, if at all, by a loss or a model deep in
    the run (after the data loaded, a config.yaml and locks written): every ``int`` / ``float``
    setting declares a ``check`` (``finite`` where any finite value is right) or a ``convert``
    that refuses what it cannot read (``--tile-size``), but the seeds axis, checked as seeds."""
    missing = []
    for name, recipe in _recipes().items():
        hints = typing.get_type_hints(recipe.config_class)
        for f in dataclasses.fields(recipe.config_class):
            spec = spec_of(f)
            if _number_kind(hints[f.name]) and spec.check is None and spec.axis != "seed" \
                    and spec.choices is None and spec.convert is None:
                missing.append(f"{name}.{f.name}")
    assert not missing, f"numbers without a declared range: {missing}"


#: one value of each YAML type a config file may hold where a setting wants another
YAML_VALUES = (None, True, 0, 1.5, "text")


def _accepts(hint: typing.Any, value: typing.Any) -> bool:
    """Whether a field (an item of a list field) annotated ``hint`` takes ``value``'s type, read
    from the annotation here (a ``float`` takes an int, a ``bool`` is no number)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_accepts(arg, value) for arg in typing.get_args(hint))
    if typing.get_origin(hint) is collections.abc.Callable:
        return callable(value)
    if isinstance(value, bool) or hint is bool:
        return hint is bool and isinstance(value, bool)
    return isinstance(value, {float: (int, float)}.get(hint, hint)) if isinstance(hint, type) \
        else True


def _wrong_types(hint: typing.Any, default: typing.Any, several: bool) -> list[typing.Any]:
    """Values of the wrong type for a field annotated ``hint`` whose default is ``default``:
    a mapping and a nested list everywhere; for a list field its item alone, and a list holding
    an item of each YAML type the item does not take; for a scalar each such value, and
    (``several``: a setting whose values may be listed) a list of its default and it."""
    listed = typing.get_origin(hint) in (list, tuple)
    item = typing.get_args(hint)[0] if listed else hint
    good = (default[0] if default else None) if listed else default
    wrong = [v for v in YAML_VALUES if not _accepts(item, v)]
    values: list[typing.Any] = [{"key": 1}, [[good]]]
    if listed:
        values += [good, None, *([good, v] for v in wrong)]
    else:
        values += [*wrong, *([good, v] for v in wrong if several)]
    return values


def _config_cases() -> list[tuple[str, str, list[typing.Any]]]:
    """``(recipe, field, wrong values)`` for every setting of every recipe (its config and the
    job options)."""
    cases = []
    for name, recipe in _recipes().items():
        hints = typing.get_type_hints(recipe.config_class) | typing.get_type_hints(JobOptions)
        defaults = {f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
                    for f in (*dataclasses.fields(recipe.config_class),
                              *dataclasses.fields(JobOptions))}
        for field, hint in hints.items():
            cases.append((name, field, _wrong_types(hint, defaults[field], hint is not bool)))
    return cases


@pytest.mark.parametrize(("recipe", "field", "values"), _config_cases(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_a_value_of_the_wrong_type_in_a_config_file_is_one_line_before_any_file(
        recipe, field, values, tmp_path, monkeypatch, capsys):
    """Each wrong value in turn: one line naming the file and the setting, exit 2, before
    anything is written (``--print-config`` too: it prints no config)."""
    monkeypatch.chdir(tmp_path)
    option = f"--{field.replace('_', '-')}"
    config, out = tmp_path / "config.yaml", tmp_path / "out"
    for value in values:
        config.write_text(yaml.safe_dump({"recipe": recipe, field: value}))
        for meta in ([], ["--print-config"]):
            argv = [recipe, *REQUIRED.get(recipe, []), "--config", str(config), *meta]
            if field != "output_dir":
                argv += ["--output-dir", str(out)]
            line = one_line_error(capsys, argv, f"--config {config}: ")
            assert field in line or option in line, (value, line)
            assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"], value
