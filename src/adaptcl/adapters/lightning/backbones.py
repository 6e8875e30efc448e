"""The image encoders of the self-supervised modules: Lightly's CIFAR ResNet and a small CNN.

Each returns ``(backbone, feature_dim)``: a module mapping ``[B, 3, H, W]`` images to features
``[B, feature_dim]``, what :class:`~adaptcl.adapters.lightning.base.SSLModule` and the method
modules of :mod:`~adaptcl.adapters.lightning.modules` take. The depths of the CIFAR ResNet are
:data:`~adaptcl.adapters.lightning.methods.BACKBONES` (framework-free, for a command line).

Examples:
    >>> backbone, dim = cifar_resnet("resnet-18", width=0.25)   # dim == 128
    >>> cnn, dim = small_cnn(width=8)                           # dim == 32
"""

from __future__ import annotations

from torch import nn

from adaptcl.adapters import require
from adaptcl.adapters.lightning.methods import BACKBONES

require("lightly", "vision")

from lightly.models import ResNetGenerator  # noqa: E402

__all__ = ["cifar_resnet", "small_cnn"]


def cifar_resnet(name: str = "resnet-18", width: float = 1.0) -> tuple[nn.Module, int]:
    """Lightly's CIFAR ResNet (3x3 first conv, stride 1, no max-pool) without its classifier.

    ``cifar_resnet("resnet-18")`` is the encoder of MACL's CIFAR-10 experiments (App. B.3);
    ``width`` < 1 gives narrow variants for CPU runs. Returns ``(backbone, feature_dim)``.

    Examples:
        >>> backbone, dim = cifar_resnet("resnet-18", width=0.25)   # dim == 128
    """
    if name not in BACKBONES:
        raise ValueError(f"backbone must be one of {', '.join(BACKBONES)}, got {name!r}")
    if width <= 0:
        raise ValueError(f"width must be > 0, got {width}")
    resnet = ResNetGenerator(name, width=width)
    feature_dim = resnet.linear.in_features
    resnet.linear = nn.Identity()
    return resnet, feature_dim


def small_cnn(width: int = 32) -> tuple[nn.Module, int]:
    """A 4-block CNN (conv-BN-ReLU, pooling) for quick CPU experiments and tests.

    Returns ``(backbone, feature_dim)`` with ``feature_dim = 4 * width``.
    """
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")

    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    layers = [*block(3, width), nn.MaxPool2d(2), *block(width, 2 * width), nn.MaxPool2d(2),
              *block(2 * width, 4 * width), nn.MaxPool2d(2), *block(4 * width, 4 * width),
              nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    return nn.Sequential(*layers), 4 * width
