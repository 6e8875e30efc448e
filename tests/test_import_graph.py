"""The import graph of ``src/adaptcl`` (every import: module level, inside functions, under
TYPE_CHECKING): no circle anywhere, the layers only downward (recipes -> evaluation -> adapters
-> plugins), the experiment engine's layers too, each recipe package from its config up, and the
command line on the engine's public face alone."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "adaptcl").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _graph() -> dict[str, set[str]]:
    """module -> the ``adaptcl`` modules it imports (a name from a package: the submodule when
    there is one, else the package)."""
    modules = _modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != module and not module.startswith(target + "."):
                    edges[module].add(target)
    return edges


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_anywhere():
    assert _circles(_graph()) == []


LAYERS = ("plugins", "adapters", "evaluation", "recipes", "cli")


def _layer(module: str) -> int:
    """A module's layer; the package's own top-level modules (io, precision, registry) sit
    under every layer."""
    part = module.split(".")[1] if "." in module else ""
    part = "cli" if part == "__main__" else part  # ``python -m adaptcl`` is the command line
    return LAYERS.index(part) + 1 if part in LAYERS else 0


def test_layers_import_only_downward():
    offences = [f"{a} -> {b}" for a, targets in _graph().items() for b in targets
                if _layer(b) > _layer(a) and a != "adaptcl"]
    assert not offences, offences


ENGINE = ("errors", "files", "provenance", "torch_env", "progress", "loggers", "plots",
          "settings", "sweep", "options", "cells", "config_file", "active_runs", "store",
          "job_options",
          "job_cells", "jobs", "grid", "summary", "report", "command_line", "recipe")


def test_the_engine_is_layered_and_knows_no_recipe():
    offences = []
    for module, targets in _graph().items():
        if not module.startswith("adaptcl.recipes.engine."):
            continue
        rank = ENGINE.index(module.rsplit(".", 1)[1])
        for target in targets:
            if target.startswith("adaptcl.recipes.engine."):
                if ENGINE.index(target.rsplit(".", 1)[1]) >= rank:
                    offences.append(f"{module} -> {target}")
            elif target.startswith("adaptcl.recipes"):
                offences.append(f"{module} -> {target}")
    assert not offences, offences


RECIPE_ORDER = ("config", "data", "model", "train", "recipe")


def test_each_recipe_package_builds_up_from_its_config():
    """Within a recipe package a module imports only the ones below it (config <- data <- model
    <- train <- recipe); recipes import no other recipe (what two share sits in ``common``),
    and ``common`` imports no recipe."""
    offences = []
    for module, targets in _graph().items():
        parts = module.split(".")
        if len(parts) < 3 or parts[1] != "recipes" or parts[2] == "engine":
            continue
        for target in targets:
            tparts = target.split(".")
            if len(tparts) < 3 or tparts[1] != "recipes" or tparts[2] in ("engine", "common"):
                if parts[2] == "common" and len(tparts) > 2 and tparts[1] == "recipes" \
                        and tparts[2] not in ("engine", "common"):
                    offences.append(f"{module} -> {target}")
                continue
            if tparts[2] != parts[2]:
                offences.append(f"{module} -> {target}")  # another recipe
            elif len(parts) > 3 and len(tparts) > 3 and parts[3] in RECIPE_ORDER \
                    and tparts[3] in RECIPE_ORDER \
                    and RECIPE_ORDER.index(tparts[3]) >= RECIPE_ORDER.index(parts[3]):
                offences.append(f"{module} -> {target}")
    assert not offences, offences


def test_the_command_line_imports_only_the_engines_public_face():
    recipes = {t for t in _graph()["adaptcl.cli"] if t.startswith("adaptcl.recipes")}
    assert recipes == {"adaptcl.recipes.engine"}


#: the loss core's ground floor: what the candidates, every method and both tile backends stand
#: on (the argument checks, the gather, the precision of the products, the execution setting)
GROUND_FLOOR = ("validation", "distributed", "_trace", "execution", "_products", "candidates")


def test_the_cores_ground_floor_imports_nothing_above_it():
    """Issue 53: ``candidates.py`` imported the product policy from ``tiles/``, the one arrow in
    the core running back up. The ground floor imports only itself (downward, in this order)
    and nothing of ``tiles/`` or of the methods."""
    offences = []
    for i, name in enumerate(GROUND_FLOOR):
        for target in _graph()[f"adaptcl.plugins.{name}"]:
            below = {f"adaptcl.plugins.{n}" for n in GROUND_FLOOR[:i]}
            if target.startswith("adaptcl.") and target not in below:
                offences.append(f"adaptcl.plugins.{name} -> {target}")
    assert not offences, offences
