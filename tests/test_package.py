"""Packaging promises: the core imports with torch alone; each adapter without its extra names
the extra to install; one version; the CLI lists its recipes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from adaptcl import cli

# Makes the packages in BLOCKED unimportable, as if they were not installed.
BLOCKER = r"""
import sys, importlib.abc
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, Blocker())
"""

BLOCK_FRAMEWORKS = r"""
BLOCKED = {"lightly", "sentence_transformers", "transformers", "torch_geometric", "ogb",
           "rdkit", "pytorch_lightning", "lightning", "sklearn", "matplotlib", "tqdm"}
""" + BLOCKER + r"""
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


ADAPTER_WITHOUT_EXTRA = r"""
import sys
BLOCKED = set(sys.argv[1].split(","))
""" + BLOCKER + r"""
try:
    __import__(sys.argv[2])
except ImportError as err:
    print("IMPORTERROR", err)
else:
    print("IMPORTED")
"""


@pytest.mark.parametrize(("module", "blocked", "extra"), [
    ("adaptcl.adapters.lightly", "lightly", "vision"),
    ("adaptcl.adapters.lightning_modules", "lightly,pytorch_lightning", "vision"),
    ("adaptcl.adapters.sentence_transformers", "sentence_transformers", "text"),
    ("adaptcl.adapters.simcse", "sentence_transformers", "text"),
    ("adaptcl.adapters.graphcl", "torch_geometric", "graph"),
])
def test_adapter_without_its_extra_names_the_pip_install_command(module, blocked, extra):
    out = subprocess.run([sys.executable, "-c", ADAPTER_WITHOUT_EXTRA, blocked, module],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"pip install 'adaptcl[{extra}]'" in out.stdout, out.stdout


def test_version_is_read_from_installed_metadata():
    import importlib.metadata

    import adaptcl

    assert adaptcl.__version__ == importlib.metadata.version("adaptcl")
