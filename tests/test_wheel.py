"""Release hygiene: what the built wheel carries (licence, type marker, version, true floors)."""

from __future__ import annotations

import email.parser
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    # No build isolation: the venv already has setuptools, and CI has no index to fetch it from.
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                    "--no-build-isolation", "--quiet", "--wheel-dir", str(out)],
                   check=True, capture_output=True, text=True, timeout=300)
    (path,) = out.glob("adaptcl-*.whl")
    with zipfile.ZipFile(path) as zf:
        yield zf


def _metadata(wheel: zipfile.ZipFile):
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return email.parser.Parser().parsestr(wheel.read(name).decode())


def test_wheel_ships_the_mit_licence_file_and_declares_it(wheel):
    (licence,) = [n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    text = wheel.read(licence).decode()
    assert text.startswith("MIT License")
    assert text == (ROOT / "LICENSE").read_text()
    assert _metadata(wheel)["License-Expression"] == "MIT"


def test_wheel_ships_py_typed_marker(wheel):
    assert "adaptcl/py.typed" in wheel.namelist()
    assert "Typing :: Typed" in _metadata(wheel).get_all("Classifier")


def test_wheel_needs_only_torch_and_states_true_extra_floors(wheel):
    requires = _metadata(wheel).get_all("Requires-Dist")
    core = [r for r in requires if "extra ==" not in r]
    # 2.4: torch.library.custom_op, torch.amp.is_autocast_available, torch.get_autocast_dtype
    # (device) and torch.Event, which the loss core calls (docs/install.md)
    assert core == ["torch>=2.4"]
    # the floors `make floors` (.ci/check_floors.sh) found to pass the adapters' tests:
    # sentence-transformers 6.2 (6.0-6.1 replay cached gradients in float32 only), lightly 1.5.21
    # (DCLLoss's negative term, Lightly #1827), pytorch-lightning 2.4 (imports without pkg_resources)
    for floor in ('sentence-transformers>=6.2; extra == "text"',
                  'transformers>=5.0; extra == "text"',
                  'lightly>=1.5.21; extra == "vision"',
                  'pytorch-lightning>=2.4; extra == "vision"',
                  'torch-geometric>=2.4; extra == "graph"',
                  'open_clip_torch>=3.3; extra == "clip"'):
        assert floor in requires
