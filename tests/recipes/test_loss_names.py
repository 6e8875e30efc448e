"""One name per loss: every recipe's ``--losses`` comes from the registry, and so do the docs."""

from __future__ import annotations

import dataclasses
import importlib
import re

import pytest

from adaptcl import cli
from adaptcl.recipes.engine.settings import spec_of
from adaptcl.registry import LOSSES
from tests.recipes._process import REPO as ROOT

OLD_SPELLINGS = {old for info in LOSSES.values() for old in info.deprecated}


def _losses_spec(recipe: str):
    """The ``losses`` setting of a recipe's config (``None`` where it has none)."""
    config = importlib.import_module(f"adaptcl.recipes.{recipe}.recipe").RECIPE.config_class
    field = next((f for f in dataclasses.fields(config) if f.name == "losses"), None)
    return None if field is None else spec_of(field)


@pytest.mark.parametrize("recipe", sorted(set(cli.RECIPES) - {"compare"}))
def test_every_recipes_losses_are_registry_names(recipe):
    spec = _losses_spec(recipe)
    if spec is None:
        return
    for old in OLD_SPELLINGS:  # no recipe shows a deprecated spelling
        assert not re.search(rf"(?<![\w-]){re.escape(old)}(?![\w:-])", spec.help), (recipe, old)
    listed = re.search(r"one of (.*)$", " ".join(spec.help.split()))
    listed, parse = listed.group(1), spec.convert
    names = [n.strip() for n in listed.split(",")]
    assert names, recipe
    for entry in names:
        alias = re.fullmatch(r"(\w+) \(= (\w+)\)", entry)
        if alias:  # a paper's own name, shown with what it resolves to
            assert alias.group(2) in LOSSES and parse(alias.group(1)) == alias.group(2)
        else:
            assert entry in LOSSES, (recipe, entry)
            assert parse(entry) == entry
            assert parse(entry.upper()) == entry


@pytest.mark.parametrize("recipe", ["images", "simcse", "tu"])
def test_old_spellings_warn_in_python_and_are_one_note_on_the_command_line(recipe, capsys):
    with pytest.warns(FutureWarning, match="loss 'nt_xent' is deprecated; use 'infonce'"):
        assert _losses_spec(recipe).convert("nt_xent") == "infonce"
    # a sweep of two points: the losses are converted once
    argv = [recipe, "--losses", "nt_xent", "macl", "--batch-size", "32", "64", "--print-config"]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == ["adaptcl: note: loss 'nt_xent' is deprecated; use 'infonce'"]
    assert "losses:\n- infonce\n- macl\n" in out


def test_docs_and_readme_name_losses_by_their_registry_names():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    aliases = {"graphcl"}
    for page in pages:
        if "_build" in page.parts or page.name == "changelog.md":
            continue
        for match in re.finditer(r"--losses((?: [a-z_]+)+)", page.read_text(encoding="utf-8")):
            for name in match.group(1).split():
                assert name in LOSSES or name in aliases, (page.name, match.group(0))

