"""The house's sizes in the recipes: a function at most 60 lines (its docstring counted), a
module at most 400; past them a function or a file does more than one job, and is split by
job, not squeezed."""

from __future__ import annotations

import ast
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[2] / "src" / "adaptcl" / "recipes"
FUNCTION_LINES, MODULE_LINES = 60, 400


def test_recipe_functions_and_modules_keep_to_the_house_sizes():
    long = []
    for path in sorted(RECIPES.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(RECIPES)
        if text.count("\n") > MODULE_LINES:
            long.append(f"{where}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES:
                    long.append(f"{where}:{node.lineno} {node.name}: {lines} lines")
    assert not long, long
