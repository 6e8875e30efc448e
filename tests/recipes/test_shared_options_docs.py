"""The docs' table of shared options (docs/recipes/index.md) and the README's sentence about them
say what every recipe's ``--help`` offers."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from adaptcl import cli
from tests.recipes._process import REPO as ROOT

RECIPES = [name for name in cli.RECIPES if name != "compare"]  # compare reads result files


def _options(recipe: str) -> set[str]:
    """The options ``adaptcl <recipe> --help`` lists."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli.main([recipe, "--help"])
    return set(re.findall(r"(--[a-z][a-z-]*)", out.getvalue()))


def _table() -> dict[str, set[str]]:
    """option -> the recipes the docs say take it."""
    text = (ROOT / "docs/recipes/index.md").read_text()
    section = text.split("## Options the recipes share", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`--"):
            continue
        named = set(re.findall(r"`([a-z]+)`", cells[1]))
        takers = set(RECIPES) - named if cells[1].startswith("every recipe") else named
        for option in re.findall(r"`(--[a-z-]+)`", cells[0]):
            rows[option] = takers
    return rows


def test_the_docs_table_lists_every_shared_option():
    assert set(_table()) == {"--output-dir", "--data-root", "--seeds", "--preset", "--config",
                             "--print-config", "--threads", "--device", "--precision",
                             "--logger", "--devices", "--strategy", "--no-progress",
                             "--no-plot", "--jobs", "--cluster", "--cluster-partition",
                             "--cluster-time", "--cluster-gpus", "--cluster-option",
                             "--max-cells", "--tile-size"}


@pytest.mark.parametrize("option", sorted(_table()))
def test_each_recipe_takes_a_shared_option_exactly_when_the_docs_say_so(option):
    takers = {recipe for recipe in RECIPES if option in _options(recipe)}
    assert takers == _table()[option]


def test_the_readme_names_only_options_of_the_table():
    readme = (ROOT / "README.md").read_text()
    sentence = readme.split("Shared options (", 1)[1].split(")", 1)[0]
    named = set(re.findall(r"`(--[a-z-]+)", sentence))
    assert named and named <= set(_table())
    assert "docs/recipes/index.md#options-the-recipes-share" in readme
