"""The public API keeps its word: every public name of every public module of adaptcl, and the
signature of every public callable, against the committed snapshot ``tests/public_api.json``.

What is listed. Every module of the package whose dotted path has no component starting with
``_`` (``adaptcl.plugins.logit_scale`` is public, ``adaptcl.adapters.sentence_transformers._arguments``
and ``adaptcl.__main__`` are not). Its public names are its ``__all__`` where it defines one;
otherwise the names its own source defines at the top level (functions, classes, assignments;
imports are not definitions) that do not start with ``_``.

What is recorded of each name. For a function, its signature; for a class, that of its
constructor (``__init__``; a dataclass's fields); as parameter tokens without annotations:
``name``, ``name=default`` (the default's ``repr``; a function, class or any object whose
``repr`` carries a memory address by its dotted name), ``*args``, ``**kwargs``, and ``/`` and
``*`` where positional-only and keyword-only parameters begin. Anything else (constants, type
aliases, instances) is recorded as ``null``: its name only.

What fails.

* A name that **disappeared** (removed, renamed or moved): a user's import breaks. This 0.x has
  no compatibility shims, so a move is allowed, but never silently: add an entry to
  ``docs/changelog.md`` under ``## Unreleased`` naming the old path and its new one, then
  regenerate the snapshot.
* A name that **appeared** and the snapshot lacks: a new promise must be recorded, so that its
  later disappearance is caught. Regenerate the snapshot.
* A **signature that changed**: a parameter renamed, removed, added, moved or made keyword-only,
  a default changed. A user's call may break or compute something else: name the change in the
  changelog, then regenerate the snapshot. The failure says, per callable, which parameters
  went, came or changed.

Regenerating (one command, from the repository root)::

    PYTHONPATH=src:. python -m tests.test_public_api --update

It rewrites ``tests/public_api.json`` from the code as it is (sorted, one name and its signature
per line, so a diff shows exactly what moved) and prints what was added, removed and changed. Several branches that add
public names in parallel need not regenerate it each: after merging them, run the command once
and commit the file (with the changelog entries for whatever it reports as removed).

Modules whose import needs an optional framework (the adapters, the recipes on top of them) are
imported like every other: all extras are installed in CI. Where an extra is missing (a user's
partial install) such a module cannot be read; the test then skips with the modules it could not
import named, after checking all the others, and ``--update`` refuses to write a snapshot that
would drop them.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import pkgutil
import re
import sys
from pathlib import Path
from typing import Any

import pytest

SNAPSHOT = Path(__file__).resolve().parent / "public_api.json"
COMMAND = "PYTHONPATH=src:. python -m tests.test_public_api --update"
PACKAGE = "adaptcl"


def _is_public(module_name: str) -> bool:
    return not any(part.startswith("_") for part in module_name.split("."))


def _public_modules() -> list[str]:
    """Every public module of the package, found from the files (no import needed to list)."""
    package = importlib.import_module(PACKAGE)
    names = [PACKAGE]
    for info in pkgutil.walk_packages(package.__path__, prefix=f"{PACKAGE}.",
                                      onerror=lambda name: None):
        if _is_public(info.name):
            names.append(info.name)
    return sorted(names)


def _defined_names(source: str) -> set[str]:
    """Top-level names a module's source defines (not imports), conditional blocks included."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for leaf in ast.walk(target):
                        if isinstance(leaf, ast.Name):
                            names.add(leaf.id)
            elif isinstance(node, getattr(ast, "TypeAlias", ())):  # `type X = ...`, 3.12+
                names.add(node.name.id)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for block in ("body", "orelse", "finalbody"):
                    visit(getattr(node, block, []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(ast.parse(source).body)
    return names


def _public_names(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    exported = getattr(module, "__all__", None)
    if exported is not None:
        return sorted(set(exported))
    source = Path(module.__file__).read_text(encoding="utf-8")
    return sorted(name for name in _defined_names(source)
                  if not name.startswith("_") and hasattr(module, name))


#: a module's public names, each with its signature tokens (``None``: not a callable)
Names = dict[str, "list[str] | None"]
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _default_repr(value: Any) -> str:
    """A default as a stable string: its ``repr``, or the dotted name of a function or class
    (or the type of an object) where the ``repr`` would carry a memory address."""
    if inspect.isfunction(value) or inspect.isclass(value) or inspect.isbuiltin(value):
        return f"<{getattr(value, '__module__', '?')}.{value.__qualname__}>"
    text = repr(value)
    if _ADDRESS.search(text):
        return f"<{type(value).__module__}.{type(value).__qualname__} object>"
    return text


def signature_tokens(obj: Any) -> list[str] | None:
    """The parameters of a public function or class constructor as tokens (module docstring),
    or ``None`` for anything else or what has no signature."""
    if not (inspect.isfunction(obj) or inspect.isclass(obj)):
        return None
    try:
        parameters = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):  # a builtin's or an extension type's constructor
        return None
    tokens, positional_only, keyword_only = [], False, False
    for p in parameters:
        if p.kind is p.POSITIONAL_ONLY:
            positional_only = True
        elif positional_only:
            tokens.append("/")
            positional_only = False
        if p.kind is p.KEYWORD_ONLY and not keyword_only:
            tokens.append("*")
            keyword_only = True
        if p.kind is p.VAR_POSITIONAL:
            tokens.append(f"*{p.name}")
            keyword_only = True
        elif p.kind is p.VAR_KEYWORD:
            tokens.append(f"**{p.name}")
        elif p.default is p.empty:
            tokens.append(p.name)
        else:
            tokens.append(f"{p.name}={_default_repr(p.default)}")
    if positional_only:
        tokens.append("/")
    return tokens


def _module_api(module_name: str) -> Names:
    module = importlib.import_module(module_name)
    return {name: signature_tokens(getattr(module, name)) for name in _public_names(module_name)}


def current_api() -> tuple[dict[str, Names], dict[str, str]]:
    """``({module: {name: signature tokens}}, {module that could not be imported: why})``."""
    api: dict[str, Names] = {}
    unavailable: dict[str, str] = {}
    for name in _public_modules():
        try:
            api[name] = _module_api(name)
        except ImportError as error:  # an optional framework missing here
            unavailable[name] = f"{type(error).__name__}: {error}"
    return api, unavailable


def _load_snapshot() -> dict[str, Names]:
    return json.loads(SNAPSHOT.read_text(encoding="utf-8"))


def snapshot_text(api: dict[str, Names]) -> str:
    """The snapshot's JSON: modules and names sorted, one name and its signature per line."""
    lines = ["{"]
    for i, module in enumerate(sorted(api)):
        names = api[module]
        lines.append(f" {json.dumps(module)}: {{")
        for j, name in enumerate(sorted(names)):
            comma = "," if j < len(names) - 1 else ""
            lines.append(f"  {json.dumps(name)}: {json.dumps(names[name])}{comma}")
        lines.append(" }" + ("," if i < len(api) - 1 else ""))
    return "\n".join(lines + ["}"]) + "\n"


def _parameter_changes(before: list[str], now: list[str]) -> str:
    """What changed between two signatures, parameter by parameter, in one line."""
    def by_name(tokens):
        return {t.split("=", 1)[0].lstrip("*"): t for t in tokens if t not in ("*", "/")}

    old, new = by_name(before), by_name(now)
    parts = [f"removed {old[n]}" for n in old if n not in new]
    parts += [f"added {new[n]}" for n in new if n not in old]
    parts += [f"{old[n]} -> {new[n]}" for n in old if n in new and old[n] != new[n]]
    if not parts:  # same parameters, another order or kind
        parts = [f"({', '.join(before)}) -> ({', '.join(now)})"]
    return "; ".join(parts)


def _changed_signatures(snapshot: dict[str, Names], api: dict[str, Names],
                        unavailable: dict[str, str]) -> list[str]:
    """``module.name: what changed`` for each name in both whose signature differs."""
    changed = []
    for module, names in snapshot.items():
        if module in unavailable or module not in api:
            continue
        for name, before in names.items():
            if name in api[module] and api[module][name] != before:
                now = api[module][name]
                what = (_parameter_changes(before, now) if before is not None and now is not None
                        else f"{'no signature' if before is None else 'a signature'} -> "
                             f"{'no signature' if now is None else 'a signature'}")
                changed.append(f"{module}.{name}: {what}")
    return changed


def _differences(snapshot: dict[str, Names], api: dict[str, Names],
                 unavailable: dict[str, str]) -> tuple[list[str], list[str]]:
    """``(disappeared, appeared)`` as dotted paths; unavailable modules are not compared."""
    disappeared, appeared = [], []
    for module, names in snapshot.items():
        if module in unavailable:
            continue
        now = set(api.get(module, ()))
        if module not in api:
            disappeared.append(f"{module} (the whole module)")
        disappeared += [f"{module}.{name}" for name in names if name not in now]
    for module, names in api.items():
        before = set(snapshot.get(module, ()))
        if module not in snapshot:
            appeared.append(f"{module} (a new module)")
        appeared += [f"{module}.{name}" for name in names if name not in before]
    return disappeared, appeared


@pytest.fixture(scope="module")
def compared() -> tuple[list[str], list[str], dict[str, str], list[str]]:
    api, unavailable = current_api()
    snapshot = _load_snapshot()
    return (*_differences(snapshot, api, unavailable), unavailable,
            _changed_signatures(snapshot, api, unavailable))


def test_no_public_name_disappeared(compared):
    disappeared, _, unavailable, _ = compared
    assert not disappeared, (
        f"{len(disappeared)} public name(s) of adaptcl disappeared (removed, renamed or moved), "
        "which breaks users' imports:\n  " + "\n  ".join(disappeared) + "\nIf that is intended, "
        "add a changelog entry (docs/changelog.md, '## Unreleased') naming each move and its "
        f"new path, then regenerate the snapshot with: {COMMAND}")
    if unavailable:
        pytest.skip("not compared, their import needs a missing extra: " + ", ".join(unavailable))


def test_every_public_name_is_recorded(compared):
    _, appeared, _, _ = compared
    assert not appeared, (
        f"{len(appeared)} public name(s) of adaptcl are not in tests/public_api.json:\n  "
        + "\n  ".join(appeared) + f"\nRecord them (a new promise) with: {COMMAND}")


def test_no_public_signature_changed(compared):
    *_, changed = compared
    assert not changed, (
        f"{len(changed)} public signature(s) of adaptcl changed (a keyword renamed, removed or "
        "added, a default changed), which can break or silently change a user's call:\n  "
        + "\n  ".join(changed) + "\nIf that is intended, name each change in docs/changelog.md "
        f"('## Unreleased'), then regenerate the snapshot with: {COMMAND}")


def test_signature_tokens_record_names_kinds_and_stable_defaults():
    sentinel = object()

    class Widget:
        def __init__(self, a, /, b, c=0.5, *args, d: int = 1, e=print, f=sentinel, **kw):
            pass

    def loss(z0, z1, *, tile_size="auto", reduction="mean"):
        pass

    assert signature_tokens(Widget) == [
        "a", "/", "b", "c=0.5", "*args", "d=1", "e=<builtins.print>",
        "f=<builtins.object object>", "**kw"]
    assert signature_tokens(loss) == ["z0", "z1", "*", "tile_size='auto'", "reduction='mean'"]
    assert signature_tokens(3) is None and signature_tokens(int) is None
    renamed = _changed_signatures(
        {"m": {"loss": ["z0", "z1", "*", "tile_backend='auto'", "tile_size=None"]}},
        {"m": {"loss": signature_tokens(loss)}}, {})
    assert renamed == ["m.loss: removed tile_backend='auto'; added reduction='mean'; "
                       "tile_size=None -> tile_size='auto'"]
    reordered = _changed_signatures({"m": {"f": ["b", "a"]}}, {"m": {"f": ["a", "b"]}}, {})
    assert reordered == ["m.f: (b, a) -> (a, b)"]


def test_the_walk_sees_private_modules_as_private():
    assert _is_public("adaptcl.plugins.logit_scale")
    assert not _is_public("adaptcl.adapters.sentence_transformers._arguments")
    assert not _is_public("adaptcl.__main__")
    assert _defined_names("import os\nfrom x import y\nA = 1\nif B:\n    def f(): pass\n"
                          "class C: pass\nD: int = 2\n") == {"A", "f", "C", "D"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.test_public_api",
                                     description="Compare or regenerate tests/public_api.json.")
    parser.add_argument("--update", action="store_true",
                        help="rewrite the snapshot from the code as it is")
    args = parser.parse_args(argv)
    api, unavailable = current_api()
    if unavailable:
        print("cannot read (install every extra first):\n  " + "\n  ".join(
            f"{m}: {why}" for m, why in unavailable.items()), file=sys.stderr)
        return 1
    snapshot = _load_snapshot() if SNAPSHOT.exists() else {}
    # a snapshot from before signatures were recorded lists names only
    snapshot = {m: names if isinstance(names, dict) else dict.fromkeys(names)
                for m, names in snapshot.items()}
    disappeared, appeared = _differences(snapshot, api, {})
    changed = _changed_signatures(snapshot, api, {})
    for label, items in (("removed", disappeared), ("added", appeared), ("changed", changed)):
        for item in items:
            print(f"{label}: {item}")
    if not args.update:
        return 1 if disappeared or appeared or changed else 0
    SNAPSHOT.write_text(snapshot_text(api), encoding="utf-8")
    print(f"wrote {SNAPSHOT.name}: {len(api)} modules, {sum(map(len, api.values()))} names"
          + (" (add a changelog entry for every removed name and changed signature)"
             if disappeared or changed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
