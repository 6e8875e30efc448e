"""The loss registry: one name per loss method, for every factory, command line and page of the docs.

Each method has one canonical name (:data:`LOSSES`), a display label, a one-line summary and its
paper. Spellings used before this registry are still accepted: :func:`canonical_loss_name`
maps them to the canonical name with a one-line ``FutureWarning``. A recipe whose paper has its
own name for a loss passes it as an *alias* (GraphCL's ``graphcl`` is DCL's cross-view loss),
which resolves silently and is shown in help texts as ``graphcl (= dcl)``.

Imports nothing beyond the standard library, so a command line builds its ``--help`` from it
without loading torch.

>>> canonical_loss_name("InfoNCE")
'infonce'
>>> canonical_loss_name("graphcl", allowed=("dcl", "infonce", "macl"), aliases={"graphcl": "dcl"})
'dcl'
>>> loss_help(("infonce", "macl", "dcl"), aliases={"graphcl": "dcl"})
'infonce, macl, dcl, graphcl (= dcl)'
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["LOSSES", "LossInfo", "canonical_loss_name", "loss_help"]


@dataclass(frozen=True)
class LossInfo:
    """One loss method: its canonical ``name``, display ``label``, one-line ``summary``, the
    ``paper`` that defines it, and the ``deprecated`` spellings still accepted for it."""

    name: str
    label: str
    summary: str
    paper: str
    deprecated: tuple[str, ...] = ()


LOSSES: dict[str, LossInfo] = {info.name: info for info in (
    LossInfo("infonce", "InfoNCE / NT-Xent",
             "softmax cross-entropy of the positive against the negatives at a fixed temperature "
             "(SimCLR's NT-Xent, MoCo's loss on its queue, SimCSE's loss)",
             "van den Oord et al., arXiv 1807.03748 (2018); Chen et al., SimCLR, ICML 2020",
             ("nt_xent", "ntxent", "moco")),
    LossInfo("dcl", "DCL",
             "decoupled contrastive loss: InfoNCE without the positive in the denominator "
             "(GraphCL's loss)",
             "Yeh et al., Decoupled Contrastive Learning, ECCV 2022"),
    LossInfo("flatnce", "FlatNCE",
             "InfoNCE's log-sum-exp replaced by exp(r - sg(r)), so small batches keep a gradient",
             "Chen et al., Simpler, Faster, Stronger: Breaking The log-K Curse On Contrastive "
             "Learners With FlatNCE, arXiv 2107.01152 (2021)",
             ("flat_nce",)),
    LossInfo("dual_temperature", "Dual temperature",
             "InfoNCE at one temperature reweighted by the ratio of the softmax weights at two",
             "Zhang et al., Dual Temperature Helps Contrastive Learning Without Many Negative "
             "Samples, CVPR 2022",
             ("dual",)),
    LossInfo("macl", "MACL",
             "InfoNCE whose temperature adapts to the alignment of the positives, optionally "
             "reweighted",
             "Huang et al., Model-Aware Contrastive Learning: Towards Escaping the Dilemmas, "
             "ICML 2023"),
    LossInfo("dystress", "DySTreSS",
             "InfoNCE with a temperature per pair from its cosine similarity: low for the bulk "
             "of the negatives, high for the positives and the hardest negatives",
             "Manna et al., Dynamically Scaled Temperature in Self-Supervised Contrastive "
             "Learning, IEEE TAI 2025"),
    LossInfo("temperature_schedule", "Temperature schedule",
             "InfoNCE whose temperature follows a cosine of the training step between tau_min and "
             "tau_max",
             "Kukleva et al., Temperature Schedules for self-supervised contrastive methods on "
             "long-tail data, ICLR 2023"),
    LossInfo("learnable_temperature", "Learnable temperature",
             "InfoNCE whose temperature exp(-s) is a trained parameter, clamped as CLIP's logit "
             "scale",
             "Radford et al., Learning Transferable Visual Models From Natural Language "
             "Supervision (CLIP), ICML 2021"),
    LossInfo("ascl", "ASCL",
             "soft targets: the nearest neighbours of the positive get sharpened similarity mass",
             "Feng & Patras, Adaptive Soft Contrastive Learning, ICPR 2022"),
    LossInfo("ahcl", "AHCL",
             "ASCL's adaptive hard form: the top-K neighbours are positives weighted by the "
             "confidence of the sharpened distribution",
             "Feng & Patras, Adaptive Soft Contrastive Learning, ICPR 2022"),
    LossInfo("hard", "Hard neighbours",
             "ASCL's hard form: the top-K neighbours are positives with weight one",
             "Feng & Patras, Adaptive Soft Contrastive Learning, ICPR 2022"),
    LossInfo("amcl", "AMCL",
             "several projection heads, each pair with a learned temperature and a bound on "
             "its spread",
             "Wang et al., Adaptive Multi-head Contrastive Learning, ECCV 2024"),
    LossInfo("negcos", "Negative cosine",
             "SimSiam's symmetric negative cosine between prediction and stopped target",
             "Chen & He, Exploring Simple Siamese Representation Learning, CVPR 2021"),
    LossInfo("barlow", "Barlow Twins",
             "the cross-correlation of the two views driven to the identity",
             "Zbontar et al., Barlow Twins: Self-Supervised Learning via Redundancy Reduction, "
             "ICML 2021"),
)}

# deprecated spelling -> canonical name
_DEPRECATED: dict[str, str] = {old: info.name for info in LOSSES.values()
                               for old in info.deprecated}


def _choices(allowed: Sequence[str], aliases: Mapping[str, str]) -> str:
    return loss_help(allowed, aliases)


def canonical_loss_name(name: str, *, allowed: Sequence[str] | None = None,
                        aliases: Mapping[str, str] | None = None) -> str:
    """The canonical name of the loss ``name`` (case-insensitive).

    Args:
        name: a canonical name, a deprecated spelling (resolved with one ``FutureWarning``:
            ``loss 'nt_xent' is deprecated; use 'infonce'``) or one of ``aliases``.
        allowed: the canonical names the caller accepts (default: every name in
            :data:`LOSSES`).
        aliases: a caller's own names for losses, each mapped to a canonical name (GraphCL's
            ``{"graphcl": "dcl"}``); resolved silently.

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: ``name`` is unknown or not in ``allowed``; the message names it and lists
            the accepted names (and aliases).
    """
    if not isinstance(name, str):
        raise TypeError(f"loss must be a loss name (str), got {type(name).__name__} {name!r}")
    aliases = {str(k).lower(): v for k, v in (aliases or {}).items()}
    allowed = tuple(LOSSES) if allowed is None else tuple(allowed)
    for target in (*allowed, *aliases.values()):
        if target not in LOSSES:
            raise ValueError(f"{target!r} is not a canonical loss name; those are "
                             f"{', '.join(LOSSES)}")
    key = name.strip().lower()
    if key in aliases:
        canonical = aliases[key]
    elif key in LOSSES:
        canonical = key
    elif key in _DEPRECATED:
        canonical = _DEPRECATED[key]
        if canonical in allowed:
            warnings.warn(f"loss {name!r} is deprecated; use {canonical!r}", FutureWarning,
                          stacklevel=2)
    else:
        raise ValueError(f"unknown loss {name!r}; choose from {_choices(allowed, aliases)}")
    if canonical not in allowed:
        raise ValueError(f"loss {name!r} is not available here; choose from "
                         f"{_choices(allowed, aliases)}")
    return canonical


def loss_help(names: Sequence[str], aliases: Mapping[str, str] | None = None) -> str:
    """The names an option accepts, for its help text: ``"infonce, macl, dcl, graphcl (= dcl)"``.

    Raises ``ValueError`` for a name (or an alias target) that is not canonical.
    """
    for name in (*names, *(aliases or {}).values()):
        if name not in LOSSES:
            raise ValueError(f"{name!r} is not a canonical loss name; those are "
                             f"{', '.join(LOSSES)}")
    shown = list(names) + [f"{alias} (= {target})" for alias, target in (aliases or {}).items()]
    return ", ".join(shown)
