"""The similarity step: which candidates each anchor is contrasted against.

Every loss in :mod:`adaptcl.plugins` is InfoNCE with one part changed; this module fixes the
first part, the candidate set. It returns a :class:`Candidates` description (normalised anchors
and keys, the column of each anchor's positive, the column to exclude as the anchor itself and
the anchor-positive cosine computed row-wise) without materialising anything N x N until a loss
asks for it, and then only once: masked columns are overwritten in place with the most negative
float instead of being copied out with ``masked_select``.

Forms
-----
``"nt_xent"``
    SimCLR / Lightly ``NTXentLoss``: both views are anchors (2N), each contrasted with the other
    2N - 1 embeddings: its positive plus 2N - 2 negatives. Symmetric in the two views.
``"cross_view"``
    SimCSE, GraphCL, the MACL authors, sentence-transformers' ``MultipleNegativesRankingLoss``:
    anchors ``z0`` against candidates ``z1`` (N - 1 cross-view negatives), one direction.
``"cross_view_symmetric"``
    the mean of ``z0 -> z1`` and ``z1 -> z0`` (CLIP style).
``"queue"``
    MoCo: each anchor against its own positive ``z1[i]`` plus the explicit ``negatives`` only.

Extra ``negatives`` ([K, D]) are appended to the candidates of every form.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Literal, get_args

import torch
from torch import Tensor

from . import distributed
from ._products import ProductPrecision, logits_product, product_precision
from .distributed import GatherFn
from .validation import check_choice, check_embedding_tensor, check_labels, check_pair

#: the candidate sets (the forms above)
Form = Literal["nt_xent", "cross_view", "cross_view_symmetric", "queue"]
FORMS: tuple[Form, ...] = get_args(Form)

# Masked logits are set to the most negative float32: exp() of it is exactly 0, and unlike -inf
# it stays NaN-free when multiplied by a zero soft target.
MASKED = torch.finfo(torch.float32).min


def autocast_off(x: Tensor):
    """A region where autocast is off on ``x``'s device, so the loss computes in float32 (a
    no-op on devices without autocast, e.g. ``meta``)."""
    device_type = x.device.type
    if not torch.amp.is_autocast_available(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, enabled=False)


def compute_dtype(*xs: Tensor | None) -> torch.dtype:
    """float32 for half/bfloat16/float32 inputs; float64 if any input is float64 (gradient
    checks). One dtype for all inputs, so float64/float32 mixes are accepted everywhere."""
    return torch.float64 if any(x is not None and x.dtype == torch.float64 for x in xs) else torch.float32


# Rows whose L2 norm is at most this are degenerate (no direction): they normalise to the zero
# vector with a zero gradient. Above it the gradient of x / |x| is exact, at most |g| / MIN_NORM.
MIN_NORM = 1e-6


def normalize(x: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """L2-normalise rows in float32 (or float64, or ``dtype``), outside autocast.

    Unlike ``F.normalize`` this neither overflows nor explodes: each row is first divided by
    the power of two nearest its largest entry (exact, so ordinary rows give the very same
    result), so norms up to the dtype's maximum are computed without ``x ** 2`` overflowing;
    rows with a norm of at most :data:`MIN_NORM` (zero or near-zero embeddings) give the zero
    vector and a zero gradient instead of ``F.normalize``'s ``1 / eps = 1e12`` amplification.
    """
    x = x.to(compute_dtype(x) if dtype is None else dtype)
    with torch.no_grad():
        peak = x.abs().amax(dim=1, keepdim=True)
        scale = torch.exp2(torch.floor(torch.log2(peak)))
        scale = torch.where((peak > 0) & torch.isfinite(scale), scale, torch.ones_like(peak))
    scaled = x / scale
    norm = torch.linalg.vector_norm(scaled, dim=1, keepdim=True)
    with torch.no_grad():
        # |x| = norm * scale <= MIN_NORM, compared without forming the (overflowing) product
        degenerate = norm <= MIN_NORM / scale
    unit = scaled / torch.where(degenerate, torch.ones_like(norm), norm)
    return unit.masked_fill(degenerate, 0.0)


@dataclass
class Candidates:
    """One direction of a contrastive problem.

    Attributes:
        anchors: ``[A, D]`` normalised anchors.
        keys: ``[C, D]`` normalised candidates shared by all anchors.
        positive_sim: ``[A]`` cosine of each anchor with its positive (row-wise, differentiable).
        positive_index: ``[A]`` column of each anchor's positive in ``keys``, or ``None`` when
            the positive is not among ``keys`` (queue form: it lives only in ``positive_sim``).
        self_index: ``[A]`` column to exclude (the anchor itself), or ``None``.
        positive_keys: ``[A, D]`` normalised positive of each anchor (for per-pair temperatures).
        unit_keys: ``keys`` are unit rows used as given (a memory bank, see
            ``build_candidates(unit_negatives=True)``): the positive logit is then rounded
            as the negatives' are (see :func:`scaled_anchors`).
        labels: ``[A]`` class of each anchor, or ``None`` (one positive per anchor). With
            labels every candidate of the anchor's class is a positive (multi-positive
            targets, :mod:`~adaptcl.plugins.targets`).
        key_labels: ``[C]`` class of each key column; ``-1`` for a key without a class (a
            negative of every anchor). Set together with ``labels``.
        sample_index: ``[A]`` the pair each anchor comes from, counted over the gathered batch
            (``rank * N + i``); an extra negative whose owner equals it is the anchor's own.
        num_batch_keys: ``keys[:num_batch_keys]`` are the batch's views (gathered across
            ranks); the columns after them are the extra ``negatives``.
        negative_owners: ``[C - num_batch_keys]`` the pair each extra negative belongs to
            (sentence-transformers' hard-negative columns; ``-1`` for none), or ``None``: no
            extra negative is any anchor's own (a queue). Read by the hardness term
            (:mod:`~adaptcl.plugins.hardness`).
        extra_excluded: more ``[A]`` columns to exclude per row (distinct in every row).
        hardness_columns: the hardness term touches ``keys[:hardness_columns]`` only.
        input_dtype: the dtype the embeddings came in (before they were normalised in float32),
            which sets the precision of the products (:mod:`~adaptcl.plugins._products`);
            ``None``: the anchors' own dtype.
    """

    anchors: Tensor
    keys: Tensor
    positive_sim: Tensor
    positive_index: Tensor | None = None
    self_index: Tensor | None = None
    positive_keys: Tensor | None = None
    unit_keys: bool = False
    labels: Tensor | None = None
    key_labels: Tensor | None = None
    sample_index: Tensor | None = None
    num_batch_keys: int = 0
    negative_owners: Tensor | None = None
    extra_excluded: tuple[Tensor, ...] = ()
    hardness_columns: int | None = None
    input_dtype: torch.dtype | None = None

    @property
    def num_anchors(self) -> int:
        return self.anchors.shape[0]

    @property
    def product_precision(self) -> ProductPrecision:
        """The precision of this direction's products ``anchors @ keys.T``
        (:func:`~adaptcl.plugins._products.product_precision` of :attr:`input_dtype` on the
        anchors' device)."""
        dtype = self.anchors.dtype if self.input_dtype is None else self.input_dtype
        return product_precision(dtype, self.anchors.device)

    @property
    def num_negatives(self) -> int:
        """Negatives per anchor (candidates that are neither the positive nor the anchor)."""
        n = self.keys.shape[0]
        n -= self.positive_index is not None
        n -= self.self_index is not None
        return n - len(self.extra_excluded)

    @property
    def excluded(self) -> tuple[Tensor | None, ...]:
        """The per-row columns that are not negatives (positive, self, extra)."""
        return self.positive_index, self.self_index, *self.extra_excluded

    def rows(self, r0: int, r1: int) -> Candidates:
        """The anchors ``r0:r1`` of this direction against the same keys (every per-row field
        cut, the rest shared)."""
        per_row = ("anchors", "positive_sim", "positive_index", "self_index", "positive_keys",
                   "labels", "sample_index")
        cut = {name: getattr(self, name) for name in per_row}
        return replace(self, **{k: None if v is None else v[r0:r1] for k, v in cut.items()},
                       extra_excluded=tuple(x[r0:r1] for x in self.extra_excluded))

    def mask_(self, matrix: Tensor) -> Tensor:
        """Overwrite the positive and self columns of an ``[A, C]`` matrix in place.

        Done outside autograd: an index_put recorded by autograd would copy the whole N x N
        gradient in backward just to zero these entries. Every consumer of masked matrices
        (row log-sum-exp, zero-weight soft targets, top-k that never picks them) already
        sends exactly zero gradient to a masked entry, since ``exp(MASKED - max) = 0``.
        """
        rows = torch.arange(matrix.shape[0], device=matrix.device)
        with torch.no_grad():
            for index in self.excluded:
                if index is not None:
                    matrix[rows, index] = MASKED
        return matrix

    def similarity(self) -> Tensor:
        """Fresh ``[A, C]`` cosine matrix (unmasked), in float32 even under autocast (its
        products at :attr:`product_precision`)."""
        with autocast_off(self.anchors):
            return logits_product(self.anchors, self.keys, self.product_precision)

    def positive_mask(self) -> Tensor:
        """Boolean ``[A, C]``: True where a column is a negative of the row's anchor."""
        mask = torch.ones(self.anchors.shape[0], self.keys.shape[0], dtype=torch.bool,
                          device=self.anchors.device)
        rows = torch.arange(mask.shape[0], device=mask.device)
        for index in self.excluded:
            if index is not None:
                mask[rows, index] = False
        return mask


def _gather(x: Tensor, gather_fn: GatherFn | None) -> tuple[Tensor, int, int]:
    """Concatenate ``x`` over ranks; return it with this rank and the world size."""
    if gather_fn is None:
        if not distributed.is_distributed():
            return x, 0, 1
        gather_fn = distributed.gather_with_grad
    parts = list(gather_fn(x))
    world = len(parts)
    if world == 1:
        return x, 0, 1
    rank = distributed.rank()
    parts[rank] = x  # the local slice keeps its own autograd graph
    return torch.cat(parts), rank, world


def build_candidates(
    z0: Tensor,
    z1: Tensor,
    form: Form = "nt_xent",
    negatives: Tensor | None = None,
    *,
    gather_distributed: bool = False,
    gather_fn: GatherFn | None = None,
    check_finite: bool = True,
    unit_negatives: bool = False,
    labels: Tensor | None = None,
    negative_labels: Tensor | None = None,
    negative_owners: Tensor | None = None,
) -> list[Candidates]:
    """Normalise two views and describe the contrastive problem of ``form``.

    Args:
        z0, z1: ``[N, D]`` embeddings of the two views; row ``i`` of each is a positive pair.
        form: one of :data:`FORMS`.
        negatives: optional ``[K, D]`` extra negatives (a queue or memory bank).
        gather_distributed: gather candidates from every rank (gradient-carrying) and offset
            the positive index by rank. Ignored for ``"queue"`` (gather keys before they enter
            the queue instead).
        gather_fn: the gather to use, e.g. ``lightly.utils.dist.gather``; defaults to
            :func:`adaptcl.plugins.distributed.gather_with_grad`.
        unit_negatives: ``True`` when ``negatives`` are unit rows already (a memory bank
            of normalised keys, as Lightly's): they are then used as given, only cast to the
            computation's dtype, as Lightly's ``NTXentLoss`` uses its bank. Normalising a unit
            row again moves about a third of them by one float32 ulp, so a bank entry would no
            longer equal the key it was made from (and a bank of one entry would not give
            Lightly's float32 accuracy).
        labels: optional ``[N]`` integer class of each pair (``>= 0``): every candidate of the
            anchor's class becomes a positive (see :mod:`~adaptcl.plugins.targets`). Gathered
            across ranks with the candidates.
        negative_labels: optional ``[K]`` class of each extra negative (``-1``: none, a negative
            of every anchor); needs ``labels``. Without it the extra negatives have no class.
        negative_owners: optional ``[K]`` the pair each extra negative belongs to, counted over
            the gathered batch (``rank * N + i``; ``-1``: none), for the hardness term's
            ``"hard_negatives"`` / ``"in_batch_negatives"`` (sentence-transformers' hard
            negative columns). Give them already gathered, as the negatives.

    Returns:
        One :class:`Candidates` per direction (two for ``"cross_view_symmetric"``). Every anchor
        of a direction has the same number of negatives (:attr:`Candidates.num_negatives`);
        it may be 0 (a batch of one pair, an empty queue): the losses then return 0 with a
        zero gradient, as Lightly's ``NTXentLoss`` and sentence-transformers'
        ``MultipleNegativesRankingLoss`` do for a batch of one.
    """
    check_choice("form", form, FORMS)
    check_pair(z0, z1, check_finite=check_finite)
    if negatives is not None:
        check_embedding_tensor("negatives", negatives, dim=z0.shape[1], check_finite=check_finite)
    if form == "queue" and negatives is None:
        raise ValueError("form='queue' needs a `negatives` tensor of shape [K, dim]")

    n = z0.shape[0]
    if n == 0:
        raise ValueError("z0 and z1 are empty: the batch needs at least one pair")
    labels, negative_labels, negative_owners = _check_pair_data(
        z0, negatives, labels, negative_labels, negative_owners)
    dtype = compute_dtype(z0, z1, negatives)
    a0, a1 = normalize(z0, dtype), normalize(z1, dtype)
    if negatives is None:
        neg = None
    else:
        neg = negatives.to(dtype) if unit_negatives else normalize(negatives, dtype)
    if form != "queue" and neg is not None and neg.shape[0] == 0:
        neg = negative_labels = negative_owners = None
    positive_sim = (a0 * a1).sum(dim=1)
    device = a0.device
    idx = torch.arange(n, device=device)
    gather = gather_distributed or gather_fn is not None

    def with_negatives(keys: Tensor) -> Tensor:
        return keys if neg is None else torch.cat([keys, neg])

    def key_labels(batch: Tensor | None) -> Tensor | None:
        """Labels of the batch's key columns followed by those of the extra negatives."""
        if labels is None:
            return None
        parts = [] if batch is None else [batch]
        if neg is not None:
            parts.append(negative_labels if negative_labels is not None
                         else torch.full((neg.shape[0],), -1, dtype=torch.long, device=device))
        return torch.cat(parts)

    big_labels = None
    if labels is not None and form != "queue":
        big_labels = _gather(labels, gather_fn)[0] if gather else labels
    # the batch's dtype (bf16 under autocast) sets the products' precision; a float32 bank does not
    extra = {"negative_owners": negative_owners,
             "input_dtype": torch.promote_types(z0.dtype, z1.dtype)}
    if form == "queue":
        out = [Candidates(anchors=a0, keys=neg, positive_sim=positive_sim, positive_keys=a1,
                          unit_keys=unit_negatives, labels=labels, key_labels=key_labels(None),
                          sample_index=idx if negative_owners is not None else None, **extra)]
    elif form == "nt_xent":
        big0, rank, world = _gather(a0, gather_fn) if gather else (a0, 0, 1)
        big1, _, _ = _gather(a1, gather_fn) if gather else (a1, 0, 1)
        offset = rank * n
        total = world * n
        keys = with_negatives(torch.cat([big0, big1]))
        positive_index = torch.cat([total + offset + idx, offset + idx])
        self_index = torch.cat([offset + idx, total + offset + idx])
        sample = None if negative_owners is None else torch.cat([offset + idx, offset + idx])
        out = [Candidates(anchors=torch.cat([a0, a1]), keys=keys,
                          positive_sim=torch.cat([positive_sim, positive_sim]),
                          positive_index=positive_index, self_index=self_index,
                          positive_keys=torch.cat([a1, a0]),
                          labels=None if labels is None else torch.cat([labels, labels]),
                          key_labels=key_labels(None if big_labels is None
                                                else torch.cat([big_labels, big_labels])),
                          sample_index=sample, num_batch_keys=2 * total, **extra)]
    else:
        big1, rank, _ = _gather(a1, gather_fn) if gather else (a1, 0, 1)
        positive_index = rank * n + idx
        sample = None if negative_owners is None else positive_index
        out = [Candidates(anchors=a0, keys=with_negatives(big1), positive_sim=positive_sim,
                          positive_index=positive_index, positive_keys=a1, labels=labels,
                          key_labels=key_labels(big_labels), sample_index=sample,
                          num_batch_keys=big1.shape[0], **extra)]
        if form == "cross_view_symmetric":
            big0, rank, _ = _gather(a0, gather_fn) if gather else (a0, 0, 1)
            out.append(Candidates(anchors=a1, keys=with_negatives(big0), positive_sim=positive_sim,
                                  positive_index=rank * n + idx, positive_keys=a0, labels=labels,
                                  key_labels=key_labels(big_labels), sample_index=sample,
                                  num_batch_keys=big0.shape[0], **extra))
    return out


def _check_pair_data(z0: Tensor, negatives: Tensor | None, labels: Tensor | None,
                     negative_labels: Tensor | None,
                     negative_owners: Tensor | None) -> tuple[Tensor | None, ...]:
    """``labels`` / ``negative_labels`` / ``negative_owners`` checked against the inputs."""
    rows = None if negatives is None else negatives.shape[0]
    if labels is not None:
        labels = check_labels("labels", labels, z0.shape[0], z0.device)
    if negative_labels is not None:
        negative_labels = check_labels("negative_labels", negative_labels, rows, z0.device,
                                       minimum=-1)
        if labels is None:
            raise ValueError("negative_labels need labels: the classes of the pairs they are "
                             "compared with")
    if negative_owners is not None:
        negative_owners = check_labels("negative_owners", negative_owners, rows, z0.device,
                                       minimum=-1)
    for name, value in (("negative_labels", negative_labels), ("negative_owners", negative_owners)):
        if value is not None and negatives is None:
            raise ValueError(f"{name} were given without negatives")
    return labels, negative_labels, negative_owners


def alignment_magnitude(cands: list[Candidates], *, all_reduce: bool = False) -> Tensor:
    """MACL's A: mean cosine of positive pairs (detached), optionally averaged over ranks."""
    a = cands[0].positive_sim.detach().mean()
    return distributed.all_reduce_mean(a) if all_reduce else a


def scaled_anchors(cands: Candidates, temperature: Tensor | float) -> tuple[Tensor, Tensor]:
    """Anchors with ``1 / temperature`` folded in, and the ``[A]`` positive logits, in float32.

    ``temperature`` may be a python float, a 0-d tensor or a per-anchor ``[A]`` tensor: it is
    folded into the anchors before any matrix product, so no N x N division happens. The one
    place the temperature enters the logits, for the materialised and the tiled paths.

    The positive logit is ``cos / t``. Against a memory bank of unit rows
    (:attr:`Candidates.unit_keys`, the Lightly drop-in case) it is the product of the same
    scaled anchor with the positive key (``sum(anchor / t * key)``), as Lightly computes it:
    every logit of a row then carries the same rounding of the scaled anchor, so equal cosines
    give equal logits (``cos / t`` rounds about one ulp of ``1 / t`` apart from the negatives,
    1e-6 at t = 0.1, which a bank of one entry shows). Elsewhere ``cos / t`` stays, so the
    in-batch paths compute bit for bit what the published runs computed.
    """
    if isinstance(temperature, Tensor):
        if temperature.ndim > 1:
            raise ValueError("temperature must be a scalar or have shape [anchors], got "
                             f"{tuple(temperature.shape)}")
        t = temperature.to(cands.anchors.dtype)
    else:
        t = float(temperature)  # a python number: no tensor, no host-to-device copy
    with autocast_off(cands.anchors):
        anchors = cands.anchors / (t[:, None] if isinstance(t, Tensor) and t.ndim == 1 else t)
        if cands.unit_keys and cands.positive_keys is not None:
            positive = (anchors * cands.positive_keys).sum(dim=1)
        else:
            positive = cands.positive_sim / t
    return anchors, positive


def rows_logits(cands: Candidates, temperature: Tensor | float) -> tuple[Tensor, Tensor]:
    """Masked ``[A, C]`` negative logits and ``[A]`` positive logits in float32 (the products
    at :attr:`Candidates.product_precision`)."""
    anchors, positive = scaled_anchors(cands, temperature)
    with autocast_off(cands.anchors):
        logits = cands.mask_(logits_product(anchors, cands.keys, cands.product_precision))
    return logits, positive
