"""Framework adapters, one package per framework: :mod:`.lightly`, :mod:`.lightning`,
:mod:`.sentence_transformers` and :mod:`.graphcl` (torch-geometric). Each imports its framework
when it is used and names the extra to install when the framework is missing."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def require(module: str, extra: str):
    """Import ``module`` or raise an ImportError telling the user which adaptcl extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            f"{module!r} is required here; install it with `pip install 'adaptcl[{extra}]'`"
        ) from err


def lazy_exports(package: str, exports: Mapping[str, str],
                 namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` (PEP 562) for a package whose public names live in
    submodules that import a framework.

    ``exports`` maps each public name to the submodule (relative to ``package``) defining it;
    the submodule is imported on first access, so ``from package import Name`` loads only what
    ``Name`` needs, and the package's framework-free submodules (the names a command line lists
    in ``--help``) import without the framework. A missing framework raises the submodule's
    ``ImportError`` naming the extra.
    """

    def __getattr__(name: str) -> Any:
        submodule = exports.get(name)
        if submodule is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{submodule}"), name)
        namespace[name] = value  # later look-ups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
