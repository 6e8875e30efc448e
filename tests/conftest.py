"""Shared fixtures: the benchmark data folder and a default dtype guard.

The real benchmark data lives outside the repository. Tests find it through ``$ADAPTCL_DATA``
or, failing that, ``../shared/data`` next to the checkout. Off CI a missing folder skips the
data tests with a reason; on CI (``CI`` set) a missing folder is an error, never a skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def _shared_data() -> Path | None:
    env = os.environ.get("ADAPTCL_DATA")
    if env:
        return Path(env)
    candidate = REPO_ROOT.parent / "shared" / "data"
    return candidate if candidate.is_dir() else None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = _shared_data()
    if path is None or not path.is_dir():
        message = "benchmark data not found: set $ADAPTCL_DATA or place it at ../shared/data"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path
