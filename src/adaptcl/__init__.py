"""adaptcl: adaptive contrastive losses (MACL, AMCL, ASCL) for the frameworks you already use.

``adaptcl.plugins`` is the loss core and needs only torch. ``adaptcl.adapters`` wires it into
Lightly, sentence-transformers and torch-geometric; ``adaptcl.recipes`` reproduces the papers'
evaluations.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    # One source for the version: ``[project] version`` in pyproject.toml, read back from the
    # installed distribution's metadata.
    __version__ = version("adaptcl")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"
