"""The ``>>>`` examples of the open_clip adapter's docstrings run and print what they claim."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import warnings

import pytest
import torch

pytest.importorskip("open_clip.loss")

import adaptcl.adapters.open_clip as package  # noqa: E402

MODULES = sorted(m.name for m in pkgutil.iter_modules(package.__path__, f"{package.__name__}."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_pass(name):
    module = importlib.import_module(name)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "(DySTreSS|TemperatureSchedule)ClipLoss ignores")
        result = doctest.testmod(module, extraglobs={"torch": torch}, report=True, verbose=False,
                                 optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_every_loss_has_an_example():
    finder = doctest.DocTestFinder()
    tested = {t.name.rsplit(".", 1)[-1] for m in MODULES
              for t in finder.find(importlib.import_module(m)) if t.examples}
    for name in package.__all__:
        if name.endswith("ClipLoss") and name != "AdaptiveClipLoss":
            assert name in tested, name
