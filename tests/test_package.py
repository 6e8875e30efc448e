"""Packaging promises: the core imports with torch alone; the CLI lists its recipes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from adaptcl import cli

BLOCK_FRAMEWORKS = r"""
import sys, importlib.abc
BLOCKED = {"lightly", "sentence_transformers", "transformers", "torch_geometric", "ogb",
           "rdkit", "pytorch_lightning", "lightning", "sklearn", "matplotlib", "tqdm"}
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked {name}")
        return None
sys.meta_path.insert(0, Blocker())
import torch
import adaptcl.plugins as p
z = torch.randn(4, 8)
print(float(p.MACLLoss()(z, z + 0.1)))
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print("LOADED", loaded)
"""


def test_core_imports_with_torch_alone():
    out = subprocess.run([sys.executable, "-c", BLOCK_FRAMEWORKS], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stdout


def test_cli_lists_recipes_and_rejects_unknown(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    assert "demo" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        cli.main(["no-such-recipe"])
    assert exc.value.code == 2


def test_public_names():
    from adaptcl.plugins import (  # noqa: F401
        AMCLLoss,
        ASCLLoss,
        DCLLoss,
        InfoNCELoss,
        MACLLoss,
        alignment,
        uniformity,
    )
