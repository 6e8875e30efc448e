"""A tiny deterministic sentence encoder for recipe tests: hashed bag of words (+ bigrams)."""

from __future__ import annotations

import zlib

import numpy as np

DIM = 256


def hashed_bow(sentences: list[str], dim: int = DIM) -> np.ndarray:
    """L2-normalised counts of hashed lower-cased unigrams and bigrams."""
    out = np.zeros((len(sentences), dim), dtype=np.float32)
    for row, sentence in enumerate(sentences):
        tokens = sentence.lower().split()
        for feature in tokens + [a + " " + b for a, b in zip(tokens, tokens[1:], strict=False)]:
            out[row, zlib.crc32(feature.encode("utf-8")) % dim] += 1.0
        norm = np.linalg.norm(out[row])
        if norm > 0:
            out[row] /= norm
    return out


class CountingEncoder:
    """Callable wrapper that counts how many sentences it was asked to encode."""

    def __init__(self, dim: int = DIM) -> None:
        self.dim = dim
        self.calls = 0
        self.sentences = 0
        self.model_id = f"hashed-bow-{dim}"

    def __call__(self, sentences: list[str]) -> np.ndarray:
        self.calls += 1
        self.sentences += len(sentences)
        return hashed_bow(sentences, self.dim)


class SwitchableEncoder(CountingEncoder):
    """Hashed bag of words that can be broken (NaN, zeros or a constant vector)."""

    def __init__(self, mode: str = "ok") -> None:
        super().__init__()
        self.mode = mode
        self.model_id = "switchable"

    def __call__(self, sentences):
        out = super().__call__(sentences)
        if self.mode == "nan":
            out[::3] = np.nan
        elif self.mode == "zero":
            out[:] = 0.0
        elif self.mode == "constant":
            out[:] = 0.5
        return out


def nan_bow(sentences: list[str]) -> np.ndarray:
    """A broken encoder: the hashed bag of words with NaN in every third row."""
    out = hashed_bow(sentences)
    out[::3] = np.nan
    return out
