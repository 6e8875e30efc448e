"""One name per loss: every recipe's ``--losses`` comes from the registry, and so do the docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from adaptcl import cli
from adaptcl.registry import LOSSES

ROOT = Path(__file__).resolve().parents[2]
OLD_SPELLINGS = {old for info in LOSSES.values() for old in info.deprecated}


def _losses_action(recipe: str):
    parser = cli.build_parser(recipe)
    sub = next(a for a in parser._actions if a.dest == "recipe").choices[recipe]
    return next((a for a in sub._actions if a.dest == "losses"), None), sub


@pytest.mark.parametrize("recipe", sorted(cli.RECIPES))
def test_every_recipes_losses_are_registry_names(recipe):
    action, _ = _losses_action(recipe)
    if action is None:
        return
    for old in OLD_SPELLINGS:  # no recipe shows a deprecated spelling
        assert not re.search(rf"(?<![\w-]){re.escape(old)}(?![\w:-])", action.help), (recipe, old)
    listed = re.search(r"one of (.*?) \(default", " ".join(action.help.split()))
    if recipe == "compare":  # filters the methods of result files: any name they hold
        assert listed is None
        return
    listed, parse = listed.group(1), action.item_type
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
def test_old_spellings_parse_with_one_note(recipe, capsys):
    action, _ = _losses_action(recipe)
    assert action.item_type("nt_xent") == "infonce"
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["adaptcl: note: loss 'nt_xent' is deprecated; use 'infonce'"]


def test_docs_and_readme_name_losses_by_their_registry_names():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    aliases = {"graphcl"}
    for page in pages:
        if "_build" in page.parts or page.name == "changelog.md":
            continue
        for match in re.finditer(r"--losses((?: [a-z_]+)+)", page.read_text(encoding="utf-8")):
            for name in match.group(1).split():
                assert name in LOSSES or name in aliases, (page.name, match.group(0))

