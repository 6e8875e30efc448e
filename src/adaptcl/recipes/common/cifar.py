"""The CIFAR-10 ``.npz`` copies (uint8 ``images [N, 32, 32, 3]``, ``labels [N]``) and
class-stratified subsets of them, and CLIP's CIFAR-10 prompts: what ``images`` and ``clip``
read."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

#: CIFAR-10's class names, in label order (torchvision's ``CIFAR10.classes``)
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck")

#: CLIP's 18 prompt templates for CIFAR-10 (Radford et al. 2021; openai/CLIP, data/prompts.md)
CIFAR10_TEMPLATES = (
    "a photo of a {}.", "a blurry photo of a {}.", "a black and white photo of a {}.",
    "a low contrast photo of a {}.", "a high contrast photo of a {}.", "a bad photo of a {}.",
    "a good photo of a {}.", "a photo of a small {}.", "a photo of a big {}.",
    "a photo of the {}.", "a blurry photo of the {}.", "a black and white photo of the {}.",
    "a low contrast photo of the {}.", "a high contrast photo of the {}.",
    "a bad photo of the {}.", "a good photo of the {}.", "a photo of the small {}.",
    "a photo of the big {}.",
)

#: npz file groups, best first: the exact-pixel copies, then the larger JPEG-decoded copies.
NPZ_PATTERNS = {
    "lossless": {"train": "cifar10_train_lossless_*.npz", "test": "cifar10_test_lossless_*.npz"},
    "jpeg": {"train": "cifar10_train_jpeg_part*.npz", "test": "cifar10_test_jpeg_part*.npz"},
}

Arrays = tuple[np.ndarray, np.ndarray]


def load_npz_arrays(paths: Sequence[str | os.PathLike]) -> Arrays:
    """Concatenate ``images`` and ``labels`` of several ``.npz`` files (sorted by name)."""
    if not paths:
        raise FileNotFoundError("no .npz files given")
    images, labels = [], []
    for path in sorted(map(Path, paths)):
        with np.load(path) as data:
            if "images" not in data or "labels" not in data:
                raise ValueError(f"{path} must hold arrays 'images' and 'labels'")
            images.append(data["images"])
            labels.append(data["labels"])
    return np.concatenate(images), np.concatenate(labels)


def npz_dir_of(root: Path) -> Path | None:
    """``root`` or ``root/cifar10``, whichever holds ``cifar10_*.npz`` files first."""
    return next((d for d in (root, root / "cifar10")
                 if d.is_dir() and any(d.glob("cifar10_*.npz"))), None)


def npz_train_test(npz_dir: Path, npz_variant: str,
                   limits: tuple[int | None, int | None]) -> tuple[Arrays, Arrays, str]:
    """``(train, test, variant)`` arrays of the npz copy ``npz_variant`` in ``npz_dir``;
    ``auto``: the exact pixels if they cover both ``limits``, else the JPEG copy."""
    for variant in [npz_variant] if npz_variant != "auto" else ["lossless", "jpeg"]:
        files = {split: sorted(npz_dir.glob(pat)) for split, pat in NPZ_PATTERNS[variant].items()}
        if not files["train"] or not files["test"]:
            continue
        train, test = load_npz_arrays(files["train"]), load_npz_arrays(files["test"])
        big_enough = all(limit is not None and limit <= len(part[0])
                         for limit, part in zip(limits, (train, test), strict=True))
        if npz_variant == "auto" and variant == "lossless" and not big_enough:
            continue
        return train, test, variant
    raise FileNotFoundError(f"no {npz_variant} CIFAR-10 npz train/test pair in {npz_dir}")


def stratified_indices(labels: np.ndarray, limit: int | None, seed: int) -> np.ndarray | None:
    """``limit`` indices drawn round-robin over the classes (class-balanced), sorted; ``None``
    (every item) when ``limit`` is ``None`` or not below the number of items."""
    if limit is None or limit >= len(labels):
        return None
    if limit <= 0:
        raise ValueError(f"subset size must be positive, got {limit}")
    rng = np.random.default_rng(seed)
    per_class = [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]
    order = [idx[i] for i in range(max(len(p) for p in per_class)) for idx in per_class
             if i < len(idx)]
    return np.sort(np.asarray(order[:limit]))
