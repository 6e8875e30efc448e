"""The ``>>>`` examples in the loss core's docstrings run and print what they claim."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import adaptcl.plugins

# every module of the core, its subpackages (adaptcl.plugins.tiles) included
MODULES = sorted(m.name for m in pkgutil.walk_packages(adaptcl.plugins.__path__, "adaptcl.plugins."))


@pytest.mark.parametrize("name", MODULES)
def test_plugins_docstring_examples_pass(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_plugins_have_docstring_examples_to_run():
    attempted = 0
    for name in MODULES:
        finder = doctest.DocTestFinder()
        attempted += sum(len(t.examples) for t in finder.find(importlib.import_module(name)))
    assert attempted >= 10
