"""The self-supervised image methods and the losses each accepts, by name.

Imports no framework, so a command line can list them (``--help``) without loading Lightly;
:func:`adaptcl.adapters.lightning.factory.build_ssl_module` builds the modules they name.

>>> METHOD_LOSSES["simsiam"]
('negcos', 'amcl')
"""

from __future__ import annotations

__all__ = ["METHODS", "METHOD_LOSSES", "check_method_loss"]

METHODS = ("simclr", "moco", "simsiam", "barlowtwins", "ascl-moco")
#: losses each method accepts (first = the method's own baseline)
METHOD_LOSSES: dict[str, tuple[str, ...]] = {
    "simclr": ("nt_xent", "macl", "dcl", "flatnce", "dual", "amcl"),
    "moco": ("nt_xent", "macl", "dcl", "ascl", "amcl"),
    "simsiam": ("negcos", "amcl"),
    "barlowtwins": ("barlow", "amcl"),
    "ascl-moco": ("ascl", "ahcl", "hard", "moco"),
}


def check_method_loss(method: str, loss: str) -> None:
    """Raise ``ValueError`` naming the argument unless ``loss`` applies to ``method``."""
    if method not in METHOD_LOSSES:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if loss not in METHOD_LOSSES[method]:
        raise ValueError(f"loss {loss!r} does not apply to {method}; choose from "
                         f"{METHOD_LOSSES[method]}")
