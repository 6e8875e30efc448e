"""Run a test file under Triton's interpreter in a fresh process.

Triton fixes whether its kernels are compiled or interpreted when it is first imported
(``import torch._dynamo`` imports it), so ``TRITON_INTERPRET=1`` cannot be switched on inside a
pytest process that has run other tests, and setting it there would interpret every later
kernel of the process. The files run this way have no ``test_`` prefix (a plain run does not
collect them) and skip themselves without the interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_interpreted(path: Path) -> str:
    """pytest on ``path`` with ``TRITON_INTERPRET=1`` in a fresh process; asserts that it ran
    and passed with nothing skipped, and returns its output."""
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT),
                                          os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-W", "ignore::RuntimeWarning", str(path)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-2000:]
    return run.stdout
