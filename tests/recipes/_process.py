"""What the recipe tests that start processes share: the checkout's ``src`` first on the path."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"


def env_with_src(**extra: str) -> dict[str, str]:
    """This process's environment with the checkout's ``src`` first on ``PYTHONPATH`` (a
    subprocess imports the code under test, not another install) and ``extra`` set."""
    path = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    return dict(os.environ, PYTHONPATH=path, **extra)
