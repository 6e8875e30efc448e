"""The self-supervised image methods and the losses each accepts, by name.

Imports no framework, so a command line can list them (``--help``) without loading Lightly;
:func:`adaptcl.adapters.lightning.factory.build_ssl_module` builds the modules they name. The
loss names are the canonical names of :mod:`adaptcl.registry`; the spellings used
before it (``nt_xent``, ``flat_nce``, ``dual``, ASCL-MoCo's ``moco``) are accepted with a
``FutureWarning``.

>>> METHOD_LOSSES["simsiam"]
('negcos', 'amcl')
>>> check_method_loss("ascl-moco", "infonce")
'infonce'
"""

from __future__ import annotations

from typing import Literal, get_args

from adaptcl.registry import canonical_loss_name

__all__ = ["Backbone", "BACKBONES", "Method", "METHODS", "METHOD_LOSSES", "check_method_loss"]

#: the depths of Lightly's ``ResNetGenerator`` (the CIFAR ResNet of ``cifar_resnet``)
Backbone = Literal["resnet-9", "resnet-18", "resnet-34", "resnet-50", "resnet-101",
                   "resnet-152"]
BACKBONES: tuple[Backbone, ...] = get_args(Backbone)
#: the self-supervised methods :func:`~adaptcl.adapters.lightning.build_ssl_module` builds
Method = Literal["simclr", "moco", "simsiam", "barlowtwins", "ascl-moco"]
METHODS: tuple[Method, ...] = get_args(Method)
#: losses each method accepts (first = the method's own baseline); for ``ascl-moco`` the loss
#: names ASCL's mode, ``infonce`` being plain MoCo (ASCL without neighbours)
METHOD_LOSSES: dict[str, tuple[str, ...]] = {
    "simclr": ("infonce", "macl", "dcl", "flatnce", "dual_temperature", "amcl", "dystress",
               "temperature_schedule", "learnable_temperature"),
    "moco": ("infonce", "macl", "dcl", "ascl", "amcl", "dystress", "temperature_schedule",
             "learnable_temperature"),
    "simsiam": ("negcos", "amcl"),
    "barlowtwins": ("barlow", "amcl"),
    "ascl-moco": ("ascl", "ahcl", "hard", "infonce"),
}


def check_method_loss(method: Method, loss: str) -> str:
    """The canonical name of ``loss`` (:func:`~adaptcl.registry.canonical_loss_name`);
    raises ``ValueError`` naming the argument unless it applies to ``method``."""
    if method not in METHOD_LOSSES:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    try:
        return canonical_loss_name(loss, allowed=METHOD_LOSSES[method])
    except ValueError as err:
        raise ValueError(f"loss {loss!r} does not apply to {method}: {err}") from None
