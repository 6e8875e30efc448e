"""Packaging promises: the core imports with torch alone; each adapter without its extra names
the extra to install; one version; the CLI lists its recipes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from adaptcl import cli

REPO_ROOT = Path(__file__).resolve().parents[1]

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


# The frameworks of each extra that `make floors` installs at its lowest allowed versions.
FLOOR_EXTRAS = {"vision": ("lightly", "pytorch_lightning"),
                "text": ("sentence_transformers", "transformers", "datasets", "accelerate"),
                "graph": ("torch_geometric", "ogb", "rdkit")}


def _floors_function(name: str, extra: str) -> list[str]:
    """Output of a function of .ci/check_floors.sh, defined alone (the script is not run)."""
    script = REPO_ROOT / ".ci" / "check_floors.sh"
    body = subprocess.run(["sed", "-n", f"/^{name}() {{/,/^}}/p", str(script)],
                          capture_output=True, text=True, check=True).stdout
    out = subprocess.run(["bash", "-c", f'{body}\n{name} "$1"', "_", extra], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60, env={"PYTHON": sys.executable,
                                                                          "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and body, (name, out.stderr)
    return out.stdout.split()


def test_floors_check_runs_every_adapter_test_of_each_extra():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "floors:" in makefile and ".ci/check_floors.sh" in makefile
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    listed = {}
    for extra in FLOOR_EXTRAS:
        files = _floors_function("tests_for", extra)
        assert files and all((REPO_ROOT / f).is_file() for f in files), (extra, files)
        listed.update(dict.fromkeys(files, extra))
        # the requirements it installs at their floors are the extra's, less torch/torchvision
        wanted = [r for r in extras[extra] if not r.startswith(("torch>", "torchvision"))]
        assert " ".join(_floors_function("requirements_for", extra)) == " ".join(wanted)
    # every adapter test that imports an extra's framework runs in that extra's floors venv
    for path in sorted((REPO_ROOT / "tests" / "adapters").glob("test_*.py")):
        text = path.read_text()
        for extra, modules in FLOOR_EXTRAS.items():
            if any(f'"{m}"' in text or f"import {m}" in text or f"from {m}" in text
                   for m in modules[:1]):
                assert listed.get(str(path.relative_to(REPO_ROOT))) == extra, path.name
