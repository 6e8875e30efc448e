"""What every recipe test shares."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(autouse=True)
def _adaptcl_logging_restored():
    """``sts``/``transfer``'s main sends the ``adaptcl`` logger to the stderr of the moment,
    which pytest captures and then closes: each test starts from the logger as it was."""
    logger = logging.getLogger("adaptcl")
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
