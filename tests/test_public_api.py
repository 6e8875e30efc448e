"""The public API keeps its word: every public name of every public module of adaptcl, against
the committed snapshot ``tests/public_api.json``.

What is listed. Every module of the package whose dotted path has no component starting with
``_`` (``adaptcl.plugins.logit_scale`` is public, ``adaptcl.adapters.sentence_transformers._arguments``
and ``adaptcl.__main__`` are not). Its public names are its ``__all__`` where it defines one;
otherwise the names its own source defines at the top level (functions, classes, assignments;
imports are not definitions) that do not start with ``_``.

What fails.

* A name that **disappeared** (removed, renamed or moved): a user's import breaks. This 0.x has
  no compatibility shims, so a move is allowed, but never silently: add an entry to
  ``docs/changelog.md`` under ``## Unreleased`` naming the old path and its new one, then
  regenerate the snapshot.
* A name that **appeared** and the snapshot lacks: a new promise must be recorded, so that its
  later disappearance is caught. Regenerate the snapshot.

Regenerating (one command, from the repository root)::

    PYTHONPATH=src:. python -m tests.test_public_api --update

It rewrites ``tests/public_api.json`` from the code as it is (sorted, one name per line, so a
diff shows exactly what moved) and prints what was added and removed. Several branches that add
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
import json
import pkgutil
import sys
from pathlib import Path

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


def current_api() -> tuple[dict[str, list[str]], dict[str, str]]:
    """``({module: names}, {module that could not be imported: why})``."""
    api: dict[str, list[str]] = {}
    unavailable: dict[str, str] = {}
    for name in _public_modules():
        try:
            api[name] = _public_names(name)
        except ImportError as error:  # an optional framework missing here
            unavailable[name] = f"{type(error).__name__}: {error}"
    return api, unavailable


def _load_snapshot() -> dict[str, list[str]]:
    return json.loads(SNAPSHOT.read_text(encoding="utf-8"))


def _differences(snapshot: dict[str, list[str]], api: dict[str, list[str]],
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
def compared() -> tuple[list[str], list[str], dict[str, str]]:
    api, unavailable = current_api()
    return (*_differences(_load_snapshot(), api, unavailable), unavailable)


def test_no_public_name_disappeared(compared):
    disappeared, _, unavailable = compared
    assert not disappeared, (
        f"{len(disappeared)} public name(s) of adaptcl disappeared (removed, renamed or moved), "
        "which breaks users' imports:\n  " + "\n  ".join(disappeared) + "\nIf that is intended, "
        "add a changelog entry (docs/changelog.md, '## Unreleased') naming each move and its "
        f"new path, then regenerate the snapshot with: {COMMAND}")
    if unavailable:
        pytest.skip("not compared, their import needs a missing extra: " + ", ".join(unavailable))


def test_every_public_name_is_recorded(compared):
    _, appeared, _ = compared
    assert not appeared, (
        f"{len(appeared)} public name(s) of adaptcl are not in tests/public_api.json:\n  "
        + "\n  ".join(appeared) + f"\nRecord them (a new promise) with: {COMMAND}")


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
    disappeared, appeared = _differences(snapshot, api, {})
    for label, items in (("removed", disappeared), ("added", appeared)):
        for item in items:
            print(f"{label}: {item}")
    if not args.update:
        return 1 if disappeared or appeared else 0
    SNAPSHOT.write_text(json.dumps(api, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {SNAPSHOT.name}: {len(api)} modules, {sum(map(len, api.values()))} names"
          + (" (add a changelog entry for every removed name)" if disappeared else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
