"""A run's config file: ``config.yaml``, written into the run folder (:func:`config_text`) and
read back by ``--config`` (:func:`read_config_file`).

Reading refuses YAML aliases before anything is built (a kilobyte of nested anchors expands to
gigabytes), and resolves a relative folder (``output_dir: .``) against the file's own folder, so
a run folder that moved runs where it now is. Writing keeps what the folder held before when the
settings that determine the results change: the old ``config.yaml`` and result files move to
``history/<n>/`` (the old run records stay under ``runs/``, superseded where recomputed).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adaptcl.recipes.engine.cells import RunLayout
from adaptcl.recipes.engine.errors import RecipeError, note
from adaptcl.recipes.engine.settings import as_record, spec_of, specs
from adaptcl.recipes.engine.sweep import Sweep


class _AliasFound(Exception):
    def __init__(self, event: Any) -> None:
        super().__init__()
        self.event = event


@functools.cache
def _loader() -> type:
    """PyYAML's safe loader, stopping at the first alias (``*name``) before it is composed, and
    at a key a mapping gives twice (PyYAML keeps the last silently)."""
    import yaml

    class Strict(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                raise _AliasFound(self.peek_event())
            return super().compose_node(parent, index)

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, int] = {}
                for key_node, _ in node.value:
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    try:
                        if key in seen:
                            raise ValueError(f"{key} is given twice (lines {seen[key]} and "
                                             f"{line}); keep one")
                        seen[key] = line
                    except TypeError:  # an unhashable key: PyYAML's own error follows
                        continue
            return super().construct_mapping(node, deep=deep)

    return Strict


def load_yaml(text: str) -> Any:
    """``text`` as PyYAML's ``safe_load`` reads it, but refusing any alias and any key given
    twice in one mapping (``ValueError`` naming the lines)."""
    import yaml

    try:
        return yaml.load(text, Loader=_loader())  # noqa: S506 (a safe loader)
    except _AliasFound as found:
        event = found.event
        raise ValueError(f"line {event.start_mark.line + 1}: YAML aliases (*{event.anchor}) are "
                         "not read (nested ones expand to gigabytes); write the values out"
                         ) from None


def read_config_file(path: str, recipe: str, config_class: type) -> dict[str, Any]:
    """The settings of a config file (a run's ``config.yaml``), each relative folder resolved
    against the file's folder, or one line naming the file and what is wrong with it."""
    import yaml

    file = Path(path).expanduser()
    try:
        loaded = load_yaml(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecipeError(f"--config {path}: no such file") from None
    except ValueError as err:  # an alias (UnicodeDecodeError is a ValueError too)
        if isinstance(err, UnicodeDecodeError):
            raise RecipeError(f"--config {path} is not a readable YAML file ({err})") from None
        raise RecipeError(f"--config {path}: {err}") from None
    except (OSError, yaml.YAMLError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RecipeError(f"--config {path} is not a readable YAML file ({first})") from None
    if not isinstance(loaded, dict):
        raise RecipeError(f"--config {path}: expected settings by name, got "
                          f"{type(loaded).__name__}")
    if loaded.get("recipe", recipe) != recipe:
        raise RecipeError(f"--config {path} is a config of adaptcl {loaded['recipe']}, not of "
                          f"adaptcl {recipe}")
    settings = {k: v for k, v in loaded.items() if k != "recipe"}
    base = run_folder_of(file)
    if base != file.parent:
        note(f"--config {path} is an earlier run of {base}: it runs there again (the runs "
             "stored under it are reused)")
    for f in dataclasses.fields(config_class):
        value = settings.get(f.name)
        if spec_of(f).folder and isinstance(value, str):
            settings[f.name] = _folder(base, Path(value).expanduser())
    return settings


def run_folder_of(file: Path) -> Path:
    """The run folder whose settings the config file ``file`` holds, which its relative folders
    are relative to: the file's own folder, but ``<out>`` for an earlier run's config that
    :func:`keep_previous_run` moved to ``<out>/history/<n>/`` (written as ``<out>``'s)."""
    folder = file.parent
    if folder.name.isdigit():
        layout = RunLayout(folder.parent.parent)
        if layout.history(int(folder.name)) == folder:
            return layout.root
    return folder


def _folder(base: Path, given: Path) -> str:
    """A config file's folder setting, relative to the file's folder ``base``; a config.yaml
    written before that rule names its own folder from the current one, and means it."""
    try:
        if not given.is_absolute() and os.path.samefile(given, base):
            return os.path.normpath(base)
    except OSError:  # either is missing
        pass
    return os.path.normpath(base / given)


def _determining(settings: Any, config_class: type) -> dict[str, Any] | None:
    """The settings of a config file that determine results (``None``: not a mapping)."""
    if not isinstance(settings, dict):
        return None
    return {f.name: settings.get(f.name) for f in dataclasses.fields(config_class)
            if spec_of(f).identity is not False}


def keep_previous_run(layout: RunLayout, config_class: type, text: str,
                      outputs: Sequence[Path] = ()) -> Path | None:
    """Before ``text`` becomes the folder's ``config.yaml``: if the folder holds the config of a
    run whose result-determining settings differ, move it, ``results.json`` / ``.md`` and
    ``outputs`` (a plot) to ``history/<n>/`` with one note; returns that folder."""
    import yaml

    if not layout.config.exists():
        return None
    try:
        before = load_yaml(layout.config.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):  # unreadable: kept all the same
        before = None
    if before is not None and (_determining(before, config_class)
                               == _determining(load_yaml(text), config_class)):
        return None
    taken = [int(p.name) for p in layout.history_root.glob("*") if p.name.isdigit()]
    folder = layout.history(max(taken, default=0) + 1)
    folder.mkdir(parents=True)
    for path in (layout.config, layout.results("json"), layout.results("md"), *outputs):
        if path.exists():
            os.replace(path, folder / path.name)
    note(f"{layout.config} held other settings: it and its results moved to {folder} (the "
         "stored runs stay under runs/)")
    return folder


def config_text(recipe: str, preset: str | None, sweep: Sweep,
                folder: str | os.PathLike | None = None) -> str:
    """A run's settings as a config file: what ``--print-config`` prints, what a run writes as
    ``config.yaml`` and ``--config`` reads back to the same cells.

    A folder setting is written relative to ``folder``, the run folder holding the file (the
    output folder itself is ``.``), where it was given relative or lies inside it, so that a
    moved run folder runs where it is; absolute otherwise, and everywhere when ``folder`` is
    ``None`` (``--print-config``: the text may be saved anywhere)."""
    import yaml

    values = as_record(sweep.values())
    for name, spec in specs(sweep.config_class).items():
        if spec.folder and isinstance(values.get(name), str):
            values[name] = _folder_text(values[name], folder)
    head = (f"# adaptcl {recipe}: `adaptcl {recipe} --config <this file>` runs these settings "
            "again (a relative folder is relative to this file's folder)\n")
    body = {"recipe": recipe, "preset": preset, **values}
    return head + yaml.safe_dump(body, sort_keys=False)


def _folder_text(value: str, folder: str | os.PathLike | None) -> str:
    path = os.path.abspath(os.path.expanduser(value))
    if folder is None:
        return path
    base = os.path.abspath(os.path.expanduser(folder))
    inside = os.path.commonpath([path, base]) == base
    return os.path.relpath(path, base) if inside or not os.path.isabs(
        os.path.expanduser(value)) else path
