"""Embedding-space metrics the papers use to explain what a loss does.

* alignment and uniformity (Wang & Isola, ICML 2020);
* tolerance (Wang & Liu, CVPR 2021) and semantic sensitivity S (MACL, earlier version, Eq. 7);
* MACL's alignment magnitude A (ICML 2023, Eq. 6) and gradient scaling factor W (Eq. 8).

All inputs are ``[N, D]`` embeddings, L2-normalised here; results are detached scalars or
per-anchor tensors in float32.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .candidates import Form, build_candidates, normalize
from .kernel import negative_lse
from .validation import check_embedding_tensor, check_pair, check_positive


def _labels(labels: Tensor, n: int) -> Tensor:
    labels = torch.as_tensor(labels)
    if labels.ndim != 1 or labels.shape[0] != n:
        raise ValueError(f"labels must have shape [{n}], got {tuple(labels.shape)}")
    return labels


@torch.no_grad()
def alignment(z0: Tensor, z1: Tensor, alpha: float = 2.0) -> Tensor:
    """``E ||f(x) - f(x+)||^alpha`` over positive pairs (lower is better aligned)."""
    check_pair(z0, z1)
    check_positive("alpha", alpha)
    return (normalize(z0) - normalize(z1)).norm(dim=1).pow(alpha).mean()


@torch.no_grad()
def uniformity(z: Tensor, t: float = 2.0) -> Tensor:
    """``log E exp(-t ||f(x) - f(y)||^2)`` over distinct pairs (lower is more uniform)."""
    check_embedding_tensor("z", z)
    check_positive("t", t)
    if z.shape[0] < 2:
        raise ValueError("uniformity needs at least 2 embeddings")
    sq = torch.pdist(normalize(z), p=2).pow(2)
    return torch.logsumexp(-t * sq, dim=0) - torch.log(torch.tensor(float(sq.numel())))


@torch.no_grad()
def alignment_magnitude(z0: Tensor, z1: Tensor) -> Tensor:
    """MACL's A: the mean cosine of positive pairs, ``1 - alignment(alpha=2) / 2``."""
    check_pair(z0, z1)
    return (normalize(z0) * normalize(z1)).sum(dim=1).mean()


@torch.no_grad()
def tolerance(z: Tensor, labels: Tensor) -> Tensor:
    """Wang & Liu's tolerance ``E_{x,y} [cos(x, y) * 1(l(x) = l(y))]`` over distinct pairs."""
    check_embedding_tensor("z", z)
    labels = _labels(labels, z.shape[0]).to(z.device)
    if z.shape[0] < 2:
        raise ValueError("tolerance needs at least 2 embeddings")
    a = normalize(z)
    same = labels[:, None] == labels[None, :]
    off = ~torch.eye(z.shape[0], dtype=torch.bool, device=z.device)
    return ((a @ a.T) * same)[off].mean()


@torch.no_grad()
def semantic_sensitivity(z0: Tensor, z1: Tensor, labels: Tensor) -> Tensor:
    """Semantic sensitivity ``S = E_{x,y} exp(-(H_xy - f(x).g(y))^2)``, ``H = +1`` for the same
    class and ``-1`` otherwise (MACL, earlier version, Eq. 7). In ``(e^-4, 1]``; higher is better.
    """
    check_pair(z0, z1)
    labels = _labels(labels, z0.shape[0]).to(z0.device)
    h = (labels[:, None] == labels[None, :]).to(torch.float32) * 2 - 1
    cos = normalize(z0) @ normalize(z1).T
    return torch.exp(-(h - cos).pow(2)).mean()


@torch.no_grad()
def gradient_scaling_factor(z0: Tensor, z1: Tensor, temperature: float = 0.1, *,
                            form: Form = "cross_view", negatives: Tensor | None = None) -> Tensor:
    """Per-anchor ``W_i = 1 - P_pos`` (MACL Eq. 8), computed as ``sigmoid(lse_neg - pos)``."""
    check_positive("temperature", temperature)
    out = []
    for c in build_candidates(z0, z1, form, negatives):
        lse, pos = negative_lse(c, temperature)
        out.append(torch.sigmoid(lse - pos))
    return torch.cat(out)


def w_statistics(w: Tensor) -> dict[str, float]:
    """Summary of W for logging: mean, std, min, max and the fraction below 0.5."""
    w = w.detach().float()
    return {"mean": w.mean().item(), "std": w.std().item() if w.numel() > 1 else 0.0,
            "min": w.min().item(), "max": w.max().item(),
            "frac_below_half": (w < 0.5).float().mean().item()}


__all__ = ["alignment", "uniformity", "alignment_magnitude", "tolerance",
           "semantic_sensitivity", "gradient_scaling_factor", "w_statistics"]
