"""The image-caption pairs of ``adaptcl clip``: CIFAR-10 images (the ``.npz`` copies) with a
caption per image made from one of CLIP's CIFAR-10 prompt templates ("a photo of a {label}."),
the template drawn per image from a seeded generator; open_clip's tokenizer (its BPE vocabulary
ships inside the package: nothing is downloaded).

Every batch holds many images of one class whose captions are the same string or an equivalent
one: under CLIP's targets each is a negative of the others, the false negatives of
open_clip#1027.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from adaptcl.recipes.clip.config import ClipConfig
from adaptcl.recipes.common.cifar import (
    CIFAR10_CLASSES,
    CIFAR10_TEMPLATES,
    npz_dir_of,
    npz_train_test,
    stratified_indices,
)

#: CIFAR-10's per-channel mean and std (of the training images, in [0, 1])
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def draw_templates(count: int, num_templates: int, seed: int) -> np.ndarray:
    """A template index in ``[0, num_templates)`` for each of ``count`` images, drawn uniformly
    from a generator seeded with ``seed`` (the same indices for the same arguments)."""
    if num_templates < 1:
        raise ValueError(f"num_templates must be >= 1, got {num_templates}")
    generator = torch.Generator().manual_seed(int(seed))
    return torch.randint(num_templates, (count,), generator=generator).numpy()


def captions(labels: np.ndarray, template_ids: np.ndarray, classnames: tuple[str, ...],
             templates: tuple[str, ...]) -> list[str]:
    """The caption of each image: its template filled with its class name."""
    return [templates[t].format(classnames[c]) for c, t in zip(labels, template_ids, strict=True)]


class CaptionTokens:
    """open_clip's ``SimpleTokenizer`` tokens of every (class, template) caption, tokenized once.

    Raises ``ValueError`` when a caption does not fit ``context_length`` tokens (the tokenizer
    would cut it and its end-of-text token, which the text tower pools, would be lost).
    """

    def __init__(self, classnames: tuple[str, ...], templates: tuple[str, ...],
                 context_length: int) -> None:
        from open_clip.tokenizer import SimpleTokenizer

        self.tokenizer = SimpleTokenizer(context_length=context_length)
        texts = [t.format(c) for c in classnames for t in templates]
        longest = max(len(self.tokenizer.encode(text)) + 2 for text in texts)  # + start, end
        if longest > context_length:
            raise ValueError(f"context_length ({context_length}) is shorter than the longest "
                             f"caption ({longest} tokens with start and end)")
        self.table = self.tokenizer(texts).view(len(classnames), len(templates), -1)

    def __call__(self, labels: Any, template_ids: Any) -> torch.Tensor:
        """The tokens ``[N, context_length]`` of the captions (class, template) of N images."""
        return self.table[torch.as_tensor(labels).long(), torch.as_tensor(template_ids).long()]


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 ``[N, 32, 32, 3]`` -> float ``[N, 3, 32, 32]`` normalised with CIFAR-10's mean/std."""
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float() / 255
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (CIFAR10_MEAN, CIFAR10_STD))
    return (x - mean) / std


class PairDataset(Dataset):
    """``(image [3, 32, 32], caption tokens [L], class id)`` of fixed image-caption pairs."""

    def __init__(self, images: torch.Tensor, tokens: torch.Tensor, labels: torch.Tensor) -> None:
        if not len(images) == len(tokens) == len(labels):
            raise ValueError(f"images ({len(images)}), tokens ({len(tokens)}) and labels "
                             f"({len(labels)}) must have the same length")
        self.images, self.tokens, self.labels = images, tokens, labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.images[index], self.tokens[index], self.labels[index]


@dataclass
class ClipData:
    """The train and test images (uint8 ``[N, 32, 32, 3]``) and labels, where they came from."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str
    classnames: tuple[str, ...] = CIFAR10_CLASSES
    name: str = "cifar10"

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "train_size": len(self.train_labels),
                "test_size": len(self.test_labels), "num_classes": len(self.classnames)}

    @functools.cached_property
    def fingerprint(self) -> dict[str, Any]:
        """SHA-256 of exactly the images and labels used."""
        digest = hashlib.sha256()
        for part in (self.train_images, self.train_labels, self.test_images, self.test_labels):
            digest.update(np.ascontiguousarray(part).tobytes())
        return {"sha256": digest.hexdigest(), "train_size": len(self.train_labels),
                "test_size": len(self.test_labels)}


def load_clip_data(data_root: str | os.PathLike, cfg: ClipConfig) -> ClipData:
    """The CIFAR-10 npz copy ``cfg`` asks for, each split cut to its class-stratified limit
    (drawn with seed 0, as the ``images`` recipe's)."""
    root = Path(data_root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"data root {str(root)!r} is not a directory")
    npz_dir = npz_dir_of(root)
    if npz_dir is None:
        raise FileNotFoundError(f"no cifar10_*.npz files in {root} or {root / 'cifar10'}")
    limits = (cfg.train_limit, cfg.test_limit)
    train, test, variant = npz_train_test(npz_dir, cfg.npz_variant, limits)
    parts = []
    for (images, labels), limit in zip((train, test), limits, strict=True):
        chosen = stratified_indices(labels, limit, 0)
        parts += [images, labels] if chosen is None else [images[chosen], labels[chosen]]
    for labels in parts[1::2]:
        if labels.min() < 0 or labels.max() >= len(CIFAR10_CLASSES):
            raise ValueError(f"labels of {npz_dir} must be CIFAR-10 class ids in [0, 10)")
    return ClipData(*parts, source=f"npz ({variant}) at {npz_dir}")


def check_batch(data: ClipData, cfg: ClipConfig) -> None:
    """Refuse a batch the training images cannot fill (an incomplete batch is dropped)."""
    if len(data.train_labels) < cfg.batch_size:
        raise ValueError(f"the training set ({len(data.train_labels)} images) is smaller than "
                         f"one batch ({cfg.batch_size}); lower --batch-size")


def pair_datasets(data: ClipData, tokens: CaptionTokens, cfg: ClipConfig
                  ) -> tuple[PairDataset, PairDataset]:
    """(training pairs, retrieval pairs: the first ``retrieval_limit`` test images) with
    captions drawn from ``cfg.caption_seed`` (the test captions from the next seed)."""
    train_t = draw_templates(len(data.train_labels), cfg.templates, cfg.caption_seed)
    count = min(cfg.retrieval_limit, len(data.test_labels))
    test_t = draw_templates(count, cfg.templates, cfg.caption_seed + 1)
    train = PairDataset(to_tensor(data.train_images), tokens(data.train_labels, train_t),
                        torch.as_tensor(data.train_labels).long())
    test_labels = data.test_labels[:count]
    test = PairDataset(to_tensor(data.test_images[:count]), tokens(test_labels, test_t),
                       torch.as_tensor(test_labels).long())
    return train, test


def templates_of(cfg: ClipConfig) -> tuple[str, ...]:
    """The first ``cfg.templates`` of CLIP's CIFAR-10 templates."""
    return CIFAR10_TEMPLATES[:cfg.templates]
