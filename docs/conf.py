"""Sphinx configuration: `make docs` builds docs/_build/html with warnings as errors."""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# Document the source tree next to this file, not whatever adaptcl is installed elsewhere.
sys.path.insert(0, str(ROOT / "src"))
# Adapter docstrings mention hub models; nothing may be fetched while the docs build.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import adaptcl  # noqa: E402

project = "adaptcl"
author = "adaptcl developers"
copyright = "2026, adaptcl developers"
release = adaptcl.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "_generated/README.md"]
root_doc = "index"

# Markdown pages: `{py:class}` roles, heading anchors for links such as concepts.md#forms.
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3

# The docstrings are Google style (Args:, Returns:, Examples:) with Sphinx roles inside.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}
# Keep private helpers and torch's own nn.Module API out of the reference.
autodoc_inherit_docstrings = False

html_theme = "furo"
html_title = f"adaptcl {release}"
html_static_path = ["_static"]


def _write_cli_help() -> None:
    """`adaptcl <recipe> --help` for every recipe, so the recipe pages list the real options."""
    import contextlib
    import io

    from adaptcl import cli

    out = DOCS / "_generated"
    out.mkdir(exist_ok=True)
    os.environ["COLUMNS"] = "100"  # help wraps at the terminal width: fix it for the build
    for name in cli.RECIPES:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.suppress(SystemExit):
            cli.main([name, "--help"])
        text = printed.getvalue()
        target = out / f"cli_{name}.txt"
        if not target.exists() or target.read_text() != text:
            target.write_text(text)


_write_cli_help()
