"""Shared fixtures: the benchmark data folder and a default dtype guard.

The real benchmark data lives outside the repository. Tests find it through ``$ADAPTCL_DATA``
or, failing that, ``../shared/data`` next to the checkout. Off CI a missing folder skips the
data tests with a reason; on CI (``CI`` set) a missing folder is an error, never a skip.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# torch.compile's kernel cache is not keyed on ATEN_CPU_CAPABILITY: C++ generated for this CPU's
# vector ISA and read back under `ATEN_CPU_CAPABILITY=default` fails to build ("'at::vec' has
# not been declared"; torch 2.14). A run on another capability gets a cache of its own, as it
# would on another machine.
if os.environ.get("ATEN_CPU_CAPABILITY") and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(), f"torchinductor-adaptcl-{os.environ['ATEN_CPU_CAPABILITY']}")


def _shared_data() -> Path | None:
    env = os.environ.get("ADAPTCL_DATA")
    if env:
        return Path(env)
    candidate = REPO_ROOT.parent / "shared" / "data"
    return candidate if candidate.is_dir() else None


@pytest.fixture(scope="module")
def tiny_roberta(tmp_path_factory):
    """A tiny RoBERTa checkpoint (a folder) for the sentence-transformers tests, one per module."""
    from tests.adapters._tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-roberta"), "roberta")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A tiny BERT checkpoint (a folder) for the sentence-transformers tests, one per module."""
    from tests.adapters._tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-bert"), "bert")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = _shared_data()
    if path is None or not path.is_dir():
        message = "benchmark data not found: set $ADAPTCL_DATA or place it at ../shared/data"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def _available_devices() -> list:
    import torch

    devices = [pytest.param("cpu", id="cpu")]
    if torch.cuda.is_available():
        devices.append(pytest.param("cuda", id="cuda", marks=pytest.mark.gpu))
    return devices


@pytest.fixture(params=_available_devices())
def device(request):
    """Every device there is: ``cpu`` always, ``cuda`` (marked ``gpu``) when CUDA is available.

    Tests that take this fixture run unchanged on a GPU machine; ``pytest -m gpu`` selects
    their CUDA cases there and nothing here.
    """
    import torch

    return torch.device(request.param)


@pytest.fixture
def one_thread():
    """Run the test on one torch thread (restored afterwards): on a shared 2-core machine
    intra-op threads contending with other processes slow small ops and MiniLM many times over.
    Modules that want it everywhere set ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
