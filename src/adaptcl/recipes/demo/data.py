"""The data of ``adaptcl demo``: scikit-learn's bundled digits, split, and their augmented views."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it is used, so ``adaptcl demo --help`` is instant
    import torch
    from torch import Tensor

NUM_CLASSES = 10


def load_digits_split(test_fraction: float, seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """scikit-learn's bundled digits as ``[N, 1, 8, 8]`` floats in [0, 1], stratified split."""
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = torch.as_tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.as_tensor(digits.target, dtype=torch.long)
    idx_train, idx_test = train_test_split(
        torch.arange(len(labels)).numpy(), test_size=test_fraction, random_state=seed,
        stratify=labels.numpy(),
    )
    idx_train, idx_test = torch.as_tensor(idx_train), torch.as_tensor(idx_test)
    return images[idx_train], labels[idx_train], images[idx_test], labels[idx_test]


def digits_fingerprint() -> dict[str, Any]:
    """SHA-256 of the bundled digits (the data a stored run was computed on)."""
    import hashlib

    from sklearn.datasets import load_digits

    digits = load_digits()
    digest = hashlib.sha256(digits.images.tobytes() + digits.target.tobytes())
    return {"sha256": digest.hexdigest(), "images": int(len(digits.target))}


def augment(x: Tensor, generator: torch.Generator) -> Tensor:
    """One random SimCLR-style view of a batch of ``[B, 1, 8, 8]`` digits in [0, 1].

    Random affine warp (rotation <= 15 deg, zoom 0.85-1.15, shift <= 1 px), brightness and
    contrast jitter, Gaussian noise (sigma 0.1) and pixel dropout (p = 0.1), clamped to [0, 1].
    """
    import torch
    import torch.nn.functional as F

    b = x.shape[0]

    def uniform(*shape: int) -> Tensor:
        return torch.rand(*shape, generator=generator) * 2 - 1  # U(-1, 1)

    angle = uniform(b) * math.radians(15)
    zoom = 1 + 0.15 * uniform(b)
    shift = uniform(b, 2) * (2 / x.shape[-1])  # one pixel in normalised [-1, 1] coordinates
    cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1),
                         torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    contrast = 1 + 0.3 * uniform(b, 1, 1, 1)
    brightness = 0.1 * uniform(b, 1, 1, 1)
    out = out * contrast + brightness
    out = out + 0.1 * torch.randn(out.shape, generator=generator)
    keep = torch.rand(out.shape, generator=generator) >= 0.1
    return (out * keep).clamp(0.0, 1.0)


def split_and_views(test_fraction: float, seed: int
                    ) -> tuple[tuple[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]:
    """The split of ``seed`` and two augmented views of every test image (seed ``seed + 2``)."""
    import torch

    data = load_digits_split(test_fraction, seed)
    eval_gen = torch.Generator().manual_seed(seed + 2)
    return data, (augment(data[2], eval_gen), augment(data[2], eval_gen))
