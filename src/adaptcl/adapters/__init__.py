"""Framework adapters. Each submodule imports its framework lazily and names the extra to install."""

import importlib


def require(module: str, extra: str):
    """Import ``module`` or raise an ImportError telling the user which adaptcl extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            f"{module!r} is required here; install it with `pip install 'adaptcl[{extra}]'`"
        ) from err
