"""Run inside a fresh virtualenv holding only torch and the adaptcl wheel (see .ci/check_wheel.sh).

Checks what a user of `pip install adaptcl` gets: the core imports and trains with torch alone,
the licence and the type marker are installed, the version is the package's, and each adapter
says which extra to install instead of failing obscurely. Exits non-zero on the first failure.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

EXPECTED_VERSION = sys.argv[1]
FRAMEWORKS = ("lightly", "sentence_transformers", "transformers", "torch_geometric", "ogb",
              "rdkit", "pytorch_lightning", "sklearn", "matplotlib")
# What a user imports -> the extra it needs; "module:name" for a package whose names import their
# framework on first use (PEP 562), as the GraphCL package's do.
ADAPTERS = {
    "adaptcl.adapters.lightly": "vision",
    "adaptcl.adapters.lightning.modules": "vision",
    "adaptcl.adapters.lightning.backbones": "vision",
    "adaptcl.adapters.lightning.features": "vision",
    "adaptcl.adapters.lightning.factory": "vision",
    "adaptcl.adapters.sentence_transformers.losses": "text",
    "adaptcl.adapters.sentence_transformers.simcse": "text",
    "adaptcl.adapters.graphcl.model": "graph",
    "adaptcl.adapters.graphcl:GraphCL": "graph",
    "adaptcl.adapters.open_clip.base": "clip",
    "adaptcl.adapters.open_clip:MACLClipLoss": "clip",
}


def main() -> int:
    import torch

    import adaptcl
    import adaptcl.plugins as plugins

    package_dir = Path(adaptcl.__file__).resolve().parent
    assert "site-packages" in package_dir.parts, f"adaptcl imported from {package_dir}, not the wheel"
    assert adaptcl.__version__ == EXPECTED_VERSION, (adaptcl.__version__, EXPECTED_VERSION)
    assert (package_dir / "py.typed").is_file(), "py.typed is not installed"
    dist = importlib.metadata.distribution("adaptcl")
    licence = [f for f in dist.files or [] if f.name == "LICENSE"]
    assert licence and dist.locate_file(licence[0]).read_text().startswith("MIT License"), licence
    present = [m for m in FRAMEWORKS if importlib.util.find_spec(m) is not None]
    assert not present, f"the fresh venv should hold torch only, found {present}"

    torch.manual_seed(0)
    z0 = torch.randn(16, 32, requires_grad=True)
    z1 = torch.randn(16, 32, requires_grad=True)
    loss_fn = plugins.MACLLoss(temperature=0.1, alpha=0.5, reweight=True)
    loss = loss_fn(z0, z1)
    loss.backward()
    assert torch.isfinite(loss) and z0.grad is not None and z0.grad.abs().sum() > 0
    assert {"temperature", "alignment", "mean_w"} <= set(loss_fn.last_stats)

    for target, extra in ADAPTERS.items():
        module, _, name = target.partition(":")
        try:
            imported = importlib.import_module(module)
            if name:
                getattr(imported, name)
        except ImportError as err:
            assert f"pip install 'adaptcl[{extra}]'" in str(err), (target, str(err))
        else:
            raise AssertionError(f"{target} imported without its extra")

    cli = Path(sys.executable).with_name("adaptcl")
    out = subprocess.run([str(cli), "--help"], capture_output=True, text=True, check=True)
    assert "demo" in out.stdout

    print(f"wheel check passed: adaptcl {adaptcl.__version__} with torch {torch.__version__} alone; "
          f"MACL step loss {loss.item():.4f}; {len(ADAPTERS)} adapters name their extra")
    return 0


if __name__ == "__main__":
    sys.exit(main())
