"""ASCL's views as Lightly transforms: a strong query view and a weak key view."""

from __future__ import annotations

from typing import Any

from lightly.transforms.simclr_transform import SimCLRViewTransform
from lightly.transforms.torchvision_v2_compatibility import torchvision_transforms as T
from lightly.transforms.utils import IMAGENET_NORMALIZE
from torch import Tensor

__all__ = ["ASCLTransform", "WeakViewTransform", "CIFAR10_NORMALIZE"]

#: CIFAR-10 channel statistics, for Lightly transforms' ``normalize=`` argument.
CIFAR10_NORMALIZE = {"mean": [0.4914, 0.4822, 0.4465], "std": [0.2470, 0.2435, 0.2616]}


class WeakViewTransform:
    """ASCL's weak augmentation: random resized crop and horizontal flip only (Sec. III-D).

    Examples:
        >>> weak = WeakViewTransform(input_size=32, normalize=CIFAR10_NORMALIZE)
        >>> tensor = weak(pil_image)
    """

    def __init__(self, input_size: int = 224, min_scale: float = 0.2, hf_prob: float = 0.5,
                 normalize: dict[str, list[float]] | None = None) -> None:
        normalize = IMAGENET_NORMALIZE if normalize is None else normalize
        self.transform = T.Compose([
            T.RandomResizedCrop(size=input_size, scale=(min_scale, 1.0)),
            T.RandomHorizontalFlip(p=hf_prob),
            T.ToTensor(),
            T.Normalize(mean=normalize["mean"], std=normalize["std"]),
        ])

    def __call__(self, image: Any) -> Tensor:
        return self.transform(image)


class ASCLTransform:
    """Two views for ASCL: ``[strong (query), weak (key)]`` (ASCL Sec. IV-A2).

    The strong view is Lightly's SimCLR view with MoCo v2's colour jitter: crop 0.2-1, flip,
    colour jitter (0.4, 0.4, 0.4, 0.1) = SimCLR's (0.8, 0.8, 0.8, 0.2) x ``cj_strength`` 0.5,
    applied with probability ``cj_prob`` 0.8, grayscale 0.2, Gaussian blur ``gaussian_blur``;
    the weak view keeps only the crop and the flip. Blur is usually off for 32x32 images.

    Examples:
        >>> transform = ASCLTransform(input_size=32, gaussian_blur=0.0,
        ...                           normalize=CIFAR10_NORMALIZE)
        >>> x_strong, x_weak = transform(pil_image)
    """

    def __init__(self, input_size: int = 224, cj_prob: float = 0.8, cj_strength: float = 0.5,
                 min_scale: float = 0.2,
                 gaussian_blur: float = 0.5, random_gray_scale: float = 0.2,
                 normalize: dict[str, list[float]] | None = None) -> None:
        normalize = IMAGENET_NORMALIZE if normalize is None else normalize
        self.strong = SimCLRViewTransform(
            input_size=input_size, cj_prob=cj_prob, cj_strength=cj_strength, min_scale=min_scale,
            random_gray_scale=random_gray_scale, gaussian_blur=gaussian_blur, normalize=normalize,
        )
        self.weak = WeakViewTransform(input_size=input_size, min_scale=min_scale,
                                      normalize=normalize)

    def __call__(self, image: Any) -> list[Tensor]:
        return [self.strong(image), self.weak(image)]
