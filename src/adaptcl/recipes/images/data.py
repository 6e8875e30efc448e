"""The images of ``adaptcl images`` (:func:`load_image_splits`): torchvision's CIFAR-10 files,
``.npz`` arrays (uint8 ``images [N, 32, 32, 3]`` and ``labels [N]``) or an ``ImageFolder``
layout; nothing is downloaded unless asked.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from adaptcl.recipes.common.cifar import (
    load_npz_arrays,
    npz_dir_of,
    npz_train_test,
    stratified_indices,
)
from adaptcl.recipes.images.config import ImagesConfig

__all__ = ["ArrayImageDataset", "ImageSplits", "TransformedDataset", "check_batch",
           "load_image_splits", "load_npz_arrays", "load_splits"]


class ArrayImageDataset(Dataset):
    """``(transform(PIL image), label)`` of uint8 arrays ``[N, H, W, 3]`` and labels ``[N]`` (a
    multi-view transform gives the list of views Lightly's loops expect)."""

    def __init__(self, images: np.ndarray, labels: Sequence[int] | np.ndarray,
                 transform: Callable[[Any], Any] | None = None) -> None:
        images = np.asarray(images)
        labels = np.asarray(labels)
        if images.ndim != 4 or images.shape[-1] != 3:
            raise ValueError(f"images must have shape [N, H, W, 3], got {tuple(images.shape)}")
        if images.dtype != np.uint8:
            raise ValueError(f"images must be uint8, got {images.dtype}")
        if labels.ndim != 1 or len(labels) != len(images):
            raise ValueError(f"labels must have shape [{len(images)}], got {tuple(labels.shape)}")
        self.images, self.labels, self.transform = images, labels.astype(np.int64), transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        from PIL import Image

        image = Image.fromarray(self.images[index])
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[index])

    def with_transform(self, transform: Callable[[Any], Any] | None) -> ArrayImageDataset:
        """The same arrays (not copied) under another transform."""
        return ArrayImageDataset(self.images, self.labels, transform)


class TransformedDataset(Dataset):
    """A ``(image, label)`` dataset with ``transform`` applied to the image."""

    def __init__(self, base: Dataset, transform: Callable[[Any], Any] | None) -> None:
        self.base, self.transform = base, transform

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int):
        image, label = self.base[index]
        if self.transform is not None:
            image = self.transform(image)
        return image, int(label)

    def with_transform(self, transform: Callable[[Any], Any] | None) -> TransformedDataset:
        return TransformedDataset(self.base, transform)


@dataclass
class ImageSplits:
    """Train and test splits without transforms, where they came from, and the data's name."""

    train: Any  # ArrayImageDataset | TransformedDataset
    test: Any
    num_classes: int
    source: str
    name: str = "cifar10"

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "train_size": len(self.train), "test_size": len(self.test),
                "num_classes": self.num_classes}

    @functools.cached_property
    def fingerprint(self) -> dict[str, Any]:
        """SHA-256 of exactly the images and labels used (their content, not where they live)."""
        digest = hashlib.sha256()
        for part in (self.train, self.test):
            base = part.base if isinstance(part, TransformedDataset) else part
            if isinstance(base, ArrayImageDataset):
                digest.update(base.images.tobytes())
                digest.update(base.labels.tobytes())
                continue
            indices = getattr(base, "indices", None)
            folder = getattr(base, "dataset", base)
            samples = folder.samples if indices is None else [folder.samples[i] for i in indices]
            for path, label in samples:  # an ImageFolder (or a Subset of one): the files used
                digest.update(f"{Path(path).name}\0{label}\0".encode())
                digest.update(Path(path).read_bytes())
        return {"sha256": digest.hexdigest(), "train_size": len(self.train),
                "test_size": len(self.test)}


def _cifar_splits(train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                  limits: tuple[int | None, int | None], seed: int, source: str) -> ImageSplits:
    """CIFAR-10 from (images, labels) arrays, each split cut to its class-stratified limit."""
    parts = []
    for (images, labels), limit in zip((train, test), limits, strict=True):
        chosen = stratified_indices(labels, limit, seed)
        parts.append(ArrayImageDataset(images, labels) if chosen is None
                     else ArrayImageDataset(images[chosen], labels[chosen]))
    return ImageSplits(*parts, 10, source)


def _npz_splits(npz_dir: Path, npz_variant: str, limits: tuple[int | None, int | None],
                seed: int) -> ImageSplits:
    """The npz copy of ``npz_variant``; ``auto``: the exact pixels if they cover both limits."""
    train, test, variant = npz_train_test(npz_dir, npz_variant, limits)
    return _cifar_splits(train, test, limits, seed, f"npz ({variant}) at {npz_dir}")


def _folder_splits(root: Path, test_dir: Path, limits: tuple[int | None, int | None],
                   seed: int) -> ImageSplits:
    from torchvision.datasets import ImageFolder

    train, test = ImageFolder(str(root / "train")), ImageFolder(str(test_dir))
    if train.classes != test.classes:
        raise ValueError(f"train and {test_dir.name} class folders differ: "
                         f"{train.classes} vs {test.classes}")
    parts = []
    for folder, limit in zip((train, test), limits, strict=True):
        chosen = stratified_indices(np.asarray(folder.targets), limit, seed)
        parts.append(TransformedDataset(folder if chosen is None else torch.utils.data.Subset(
            folder, chosen.tolist()), None))
    return ImageSplits(*parts, len(train.classes), f"image folder at {root}", name=root.name)


def load_image_splits(data_root: str | os.PathLike, source: str = "auto",
                      npz_variant: str = "auto", train_limit: int | None = None,
                      test_limit: int | None = None, seed: int = 0,
                      download: bool = False) -> ImageSplits:
    """Train/test splits from ``data_root``: ``cifar-10-batches-py``, CIFAR ``.npz`` files (here
    or in ``cifar10/``; ``npz_variant`` ``lossless``, ``jpeg``, or ``auto``: lossless if it
    covers the limits) or ``train/`` and ``test/`` (or ``val/``) class folders, tried in this
    order (``source="auto"``). The limits are class-stratified subset sizes drawn with ``seed``
    (``None``: everything). ``download``: torchvision fetches CIFAR-10 if no local source exists.
    """
    root = Path(data_root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"image data root {str(root)!r} is not a directory")
    if source not in ("auto", "torchvision", "npz", "folder"):
        raise ValueError(f"source must be auto, torchvision, npz or folder, got {source!r}")
    if npz_variant not in ("auto", "lossless", "jpeg"):
        raise ValueError(f"npz_variant must be auto, lossless or jpeg, got {npz_variant!r}")
    limits = (train_limit, test_limit)
    tv_dir = next((d for d in (root, root / "cifar10") if (d / "cifar-10-batches-py").is_dir()),
                  None)
    npz_dir = npz_dir_of(root)
    test_dir = next((root / d for d in ("test", "val") if (root / d).is_dir()), None)
    if source in ("auto", "torchvision") and (tv_dir is not None or download and npz_dir is None
                                              and not (root / "train").is_dir()):
        from torchvision.datasets import CIFAR10

        fetch = tv_dir is None  # nothing local and --download: torchvision fetches it to root
        tv_dir = tv_dir or root
        train, test = (CIFAR10(str(tv_dir), train=part, download=fetch) for part in (True, False))
        return _cifar_splits((np.asarray(train.data), np.asarray(train.targets)),
                             (np.asarray(test.data), np.asarray(test.targets)), limits, seed,
                             f"torchvision CIFAR10 at {tv_dir}")
    if source == "torchvision":
        raise FileNotFoundError(f"no cifar-10-batches-py under {root} (nothing is downloaded)")
    if source in ("auto", "npz") and npz_dir is not None:
        return _npz_splits(npz_dir, npz_variant, limits, seed)
    if source == "npz":
        raise FileNotFoundError(f"no cifar10_*.npz files in {root} or {root / 'cifar10'}")
    if (root / "train").is_dir() and test_dir is not None:
        return _folder_splits(root, test_dir, limits, seed)
    raise FileNotFoundError(f"no image data under {root}: expected cifar-10-batches-py, "
                            "cifar10_*.npz (here or in cifar10/), or train/ and test/ (or val/) "
                            "class folders")


def load_splits(data_root: Path, cfg: ImagesConfig) -> ImageSplits:
    """The images ``cfg`` asks for (class-stratified subsets drawn with seed 0)."""
    return load_image_splits(data_root, cfg.source, cfg.npz_variant, cfg.train_limit,
                             cfg.test_limit, seed=0, download=cfg.download)


def check_batch(splits: ImageSplits, cfg: ImagesConfig) -> None:
    """Refuse a batch the training images cannot fill on every device (each takes its share;
    an incomplete batch is dropped)."""
    per_rank = len(splits.train) // cfg.devices
    if per_rank < cfg.batch_size:
        ranks = f", {per_rank} per device over {cfg.devices}" if cfg.devices > 1 else ""
        raise ValueError(f"the training set ({len(splits.train)} images{ranks}) is smaller than "
                         f"one batch ({cfg.batch_size}); lower --batch-size")
