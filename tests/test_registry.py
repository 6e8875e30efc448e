"""The loss registry: one canonical name per method, old spellings with one FutureWarning,
a recipe's aliases resolved silently, clear errors; importable without torch."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from adaptcl.registry import LOSSES, LossInfo, canonical_loss_name, loss_help

DEPRECATED = [(old, info.name) for info in LOSSES.values() for old in info.deprecated]


def test_the_canonical_names_and_their_old_spellings():
    assert list(LOSSES) == ["infonce", "dcl", "flatnce", "dual_temperature", "macl", "dystress",
                            "temperature_schedule", "learnable_temperature", "ascl", "ahcl",
                            "hard", "amcl", "negcos", "barlow"]
    assert dict(DEPRECATED) == {"nt_xent": "infonce", "ntxent": "infonce", "moco": "infonce",
                                "flat_nce": "flatnce", "dual": "dual_temperature"}
    for name, info in LOSSES.items():
        assert isinstance(info, LossInfo) and info.name == name
        assert info.label and info.summary and info.paper and "\n" not in info.summary
    with pytest.raises(AttributeError):
        LOSSES["macl"].name = "other"  # frozen


@pytest.mark.parametrize("name", list(LOSSES))
def test_every_canonical_name_resolves_to_itself_silently(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert canonical_loss_name(name) == name
        assert canonical_loss_name(name.upper()) == name  # case-insensitive


@pytest.mark.parametrize(("old", "new"), DEPRECATED)
def test_each_old_spelling_resolves_with_exactly_one_future_warning(old, new):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert canonical_loss_name(old) == new
    assert [(w.category, str(w.message)) for w in caught] == [
        (FutureWarning, f"loss {old!r} is deprecated; use {new!r}")]


def test_an_alias_resolves_silently_and_help_shows_it():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert canonical_loss_name("GraphCL", allowed=("dcl", "infonce", "macl"),
                                   aliases={"graphcl": "dcl"}) == "dcl"
    assert loss_help(("infonce", "macl", "dcl"), {"graphcl": "dcl"}) == \
        "infonce, macl, dcl, graphcl (= dcl)"
    assert loss_help(("negcos", "amcl")) == "negcos, amcl"


def test_unknown_names_raise_naming_the_value_and_the_choices():
    with pytest.raises(ValueError, match=r"unknown loss 'simclr'; choose from infonce, dcl, "
                                         r"macl, graphcl \(= dcl\)$"):
        canonical_loss_name("simclr", allowed=("infonce", "dcl", "macl"),
                            aliases={"graphcl": "dcl"})
    with pytest.raises(TypeError, match="loss name"):
        canonical_loss_name(3)
    with pytest.raises(ValueError, match="'nt_xent' is not a canonical loss name"):
        loss_help(("nt_xent",))
    with pytest.raises(ValueError, match="'flat' is not a canonical loss name"):
        canonical_loss_name("dcl", aliases={"graphcl": "flat"})


def test_allowed_is_enforced_for_canonical_and_old_spellings():
    with pytest.raises(ValueError, match=r"loss 'macl' is not available here; choose from "
                                         r"negcos, amcl$"):
        canonical_loss_name("macl", allowed=("negcos", "amcl"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused, so no deprecation note either
        with pytest.raises(ValueError, match="'nt_xent' is not available here"):
            canonical_loss_name("nt_xent", allowed=("negcos", "amcl"))


def test_registry_imports_the_standard_library_only():
    code = ("import sys; import adaptcl.registry; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'numpy', 'adaptcl') and m not in ('adaptcl', 'adaptcl.registry')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_the_docs_table_lists_every_name_with_its_label_paper_and_old_spellings():
    from tests.conftest import REPO_ROOT

    text = (REPO_ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    for info in LOSSES.values():
        old = ", ".join(f"`{o}`" for o in info.deprecated)
        assert f"| `{info.name}` | {info.label} | {info.paper} | {old} |" in rows, info.name
