"""Packaging promises: the core imports with torch alone; each adapter without its extra names
the extra to install; one version; the CLI lists its recipes."""

from __future__ import annotations

import os
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
module, _, name = sys.argv[2].partition(":")
try:
    __import__(module)
    if name:  # a package that imports its framework with the name (PEP 562 __getattr__)
        getattr(sys.modules[module], name)
except ImportError as err:
    print("IMPORTERROR", err)
else:
    print("IMPORTED")
"""


@pytest.mark.parametrize(("module", "blocked", "extra"), [
    ("adaptcl.adapters.lightly", "lightly", "vision"),
    ("adaptcl.adapters.lightning.modules", "lightly,pytorch_lightning", "vision"),
    ("adaptcl.adapters.lightning.backbones", "lightly", "vision"),
    ("adaptcl.adapters.lightning.features", "lightly", "vision"),
    ("adaptcl.adapters.lightning.factory", "pytorch_lightning", "vision"),
    ("adaptcl.adapters.lightning:SimCLRModule", "lightly,pytorch_lightning", "vision"),
    ("adaptcl.adapters.sentence_transformers.losses", "sentence_transformers", "text"),
    ("adaptcl.adapters.sentence_transformers.simcse", "sentence_transformers", "text"),
    ("adaptcl.adapters.sentence_transformers:MACLLoss", "sentence_transformers", "text"),
    ("adaptcl.recipes.simcse.train", "sentence_transformers", "text"),
    ("adaptcl.adapters.graphcl:GraphCL", "torch_geometric", "graph"),
    ("adaptcl.adapters.graphcl.lightning", "pytorch_lightning", "graph"),
    ("adaptcl.adapters.open_clip:MACLClipLoss", "open_clip", "clip"),
    ("adaptcl.adapters.open_clip.factory", "open_clip", "clip"),
])
def test_adapter_without_its_extra_names_the_pip_install_command(module, blocked, extra):
    out = subprocess.run([sys.executable, "-c", ADAPTER_WITHOUT_EXTRA, blocked, module],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"pip install 'adaptcl[{extra}]'" in out.stdout, out.stdout


@pytest.mark.slow  # a fresh interpreter importing torch_geometric: about 4.5 s here
def test_graph_adapter_imports_without_lightning():
    """Only :mod:`adaptcl.adapters.graphcl.lightning` needs Lightning; the rest of the graph
    adapter (and ``train_epoch``) imports without it."""
    pytest.importorskip("torch_geometric")
    out = subprocess.run([sys.executable, "-c", ADAPTER_WITHOUT_EXTRA, "pytorch_lightning,lightning",
                          "adaptcl.adapters.graphcl:train_epoch"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "IMPORTED", out.stdout


FRAMEWORK_FREE = r"""
BLOCKED = {"torch", "numpy", "lightly", "sentence_transformers", "transformers", "torch_geometric",
           "pytorch_lightning", "lightning", "open_clip"}
""" + BLOCKER + r"""
import adaptcl.adapters.lightning, adaptcl.adapters.sentence_transformers
from adaptcl.adapters.lightning.methods import METHOD_LOSSES
from adaptcl.adapters.sentence_transformers.simcse_names import LOSSES, POOLERS
from adaptcl.adapters.open_clip import LOSS_NAMES as CLIP_LOSS_NAMES
import adaptcl.io
print("OK", adaptcl.adapters.lightning.METHODS, adaptcl.adapters.sentence_transformers.POOLERS,
      CLIP_LOSS_NAMES)
"""


def test_framework_packages_list_their_names_without_torch_or_the_framework():
    """What a command line's --help needs (the image methods and their losses, SimCSE's poolers
    and losses) imports without torch or any framework; the rest of each package loads on use."""
    out = subprocess.run([sys.executable, "-c", FRAMEWORK_FREE], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "OK ('simclr'" in out.stdout and "'avg_top2')" in out.stdout
    assert "('infonce', 'dcl', 'macl', 'dystress', 'temperature_schedule')" in out.stdout


@pytest.mark.parametrize("package", ["adaptcl.adapters.lightning",
                                     "adaptcl.adapters.sentence_transformers",
                                     "adaptcl.adapters.open_clip"])
def test_lazy_package_exports_every_public_name_from_its_module(package):
    """``__all__`` of a lazily importing package: each name resolves, to the object its module
    defines, and the package's dir() lists it; an unknown name is an AttributeError."""
    import importlib

    pytest.importorskip({"adaptcl.adapters.sentence_transformers": "sentence_transformers",
                         "adaptcl.adapters.open_clip": "open_clip"}.get(package,
                                                                        "pytorch_lightning"))
    module = importlib.import_module(package)
    assert set(module.__all__) == set(module._EXPORTS) | {
        n for n in module.__all__ if n not in module._EXPORTS and n in vars(module)}
    for name in module.__all__:
        value = getattr(module, name)
        if name in module._EXPORTS:
            home = importlib.import_module(f"{package}.{module._EXPORTS[name]}")
            assert value is getattr(home, name), name
        assert name in dir(module)
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name  # noqa: B018


def test_adapters_root_holds_only_packages():
    root = REPO_ROOT / "src" / "adaptcl" / "adapters"
    modules = sorted(p.name for p in root.glob("*.py"))
    assert modules == ["__init__.py"], modules
    assert all((p / "__init__.py").is_file() for p in root.iterdir()
               if p.is_dir() and p.name != "__pycache__")


def test_no_module_imports_a_private_module_of_another_layer():
    """A layer (adapters, recipes, plugins, the top-level modules) imports another layer's
    public modules only; a private module (``_name``) is shared within its own package."""
    import ast

    src = REPO_ROOT / "src"
    offences = []
    for path in sorted((src / "adaptcl").rglob("*.py")):
        package = ".".join(path.relative_to(src).with_suffix("").parts[:-1])
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                private = [i for i, part in enumerate(parts) if part.startswith("_")
                           and not part.startswith("__")]
                if parts[0] == "adaptcl" and private:
                    owner = ".".join(parts[:private[0]])
                    if not (package == owner or package.startswith(owner + ".")):
                        offences.append(f"{path.relative_to(src)} imports {name}")
    assert not offences, offences


def test_version_is_read_from_installed_metadata():
    import importlib.metadata

    import adaptcl

    assert adaptcl.__version__ == importlib.metadata.version("adaptcl")


# The frameworks of each extra that `make floors` installs at its lowest allowed versions.
FLOOR_EXTRAS = {"vision": ("lightly", "pytorch_lightning"),
                "text": ("sentence_transformers", "transformers", "datasets", "accelerate"),
                "graph": ("torch_geometric", "ogb", "rdkit", "pytorch_lightning"),
                "clip": ("open_clip",)}


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
        # each framework of the extra is imported before the tests, and a test skipped because
        # it cannot be imported counts as a failure (else importorskip hides a broken floor)
        imported = {m.strip(",") for m in _floors_function("imports_for", extra)}
        skip_fails = set("".join(_floors_function("modules_for", extra)).split("|"))
        for module in FLOOR_EXTRAS[extra]:
            assert module in imported and module in skip_fails, (extra, module)
    # every adapter test that imports an extra's framework runs in that extra's floors venv
    for path in sorted((REPO_ROOT / "tests" / "adapters").rglob("test_*.py")):
        text = path.read_text()
        for extra, modules in FLOOR_EXTRAS.items():
            if any(f'"{m}"' in text or f"import {m}" in text or f"from {m}" in text
                   for m in modules[:1]):
                assert listed.get(str(path.relative_to(REPO_ROOT))) == extra, path.name


def test_python_dash_m_adaptcl_is_the_command_line():
    """``python -m adaptcl`` (what ``torchrun -m adaptcl simcse`` runs) is the ``adaptcl``
    command: the version, and a user error's one line with exit status 2."""
    import importlib.metadata

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
    out = subprocess.run([sys.executable, "-m", "adaptcl", "--version"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"adaptcl {importlib.metadata.version('adaptcl')}"
    out = subprocess.run([sys.executable, "-m", "adaptcl", "compare", "no-such.json", "--by",
                          "seeds"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2 and out.stderr.strip() == (
        "adaptcl compare: error: no result file no-such.json")


def test_ci_runs_the_result_pins_again_on_other_cpu_kernels():
    """A trained number is bit-exact on one CPU's kernels only: ``.ci/run`` runs ``make
    test-pins``, the tests marked ``pins_result`` once more under ATen's scalar path and oneDNN
    at AVX2, so a value pinned to this machine's kernels fails in CI, not on a user's CPU."""
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert 'step "make test-pins" make test-pins' in ci.splitlines()
    # --no-print-directory: under `make test` this make is a sub-make, which would print
    # "make[1]: Leaving directory ..." after the command (as in CI)
    dry = subprocess.run(["make", "--no-print-directory", "-n", "test-pins"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60,
                         check=True).stdout.splitlines()[-1]
    assert dry.startswith("ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=AVX2 ")
    assert " -m pins_result" in dry
    marked = [p for p in (REPO_ROOT / "tests").rglob("test_*.py")
              if "@pytest.mark.pins_result" in p.read_text(encoding="utf-8")]
    assert marked, "no test carries the pins_result marker: make test-pins would collect none"
