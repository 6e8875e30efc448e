"""sentence-transformers' ``directions`` / ``partition_mode`` (``MultipleNegativesRankingLoss``,
6.2) on the core losses (private to this package).

The peer's terms, for the pair ``(q_i, d_i)`` with hard negatives ``d_i^k``: ``query_to_doc``
(``q_i`` against every document, hard negatives included), ``query_to_query`` (``q_i`` against
the other queries), ``doc_to_query`` (``d_i`` against every query) and ``doc_to_doc`` (``d_i``
against every document but those of pair ``i``). ``partition_mode="per_direction"`` averages one
cross-entropy per term (only ``query_to_doc`` and ``doc_to_query`` have the positive: that is
``symmetric=True``); ``"joint"`` puts all the terms of row ``i`` in one softmax, the positive
``s(q_i, d_i)`` its target.

A joint row mixes two anchors, ``q_i`` and ``d_i``. The core contrasts one anchor with shared
keys, so the row is written as one: the anchor ``[q_i, d_i]`` (both unit vectors, side by side)
against keys that are zero in the other half (``[d_j, 0]``, ``[q_j, 0]``, ``[0, q_j]``,
``[0, d_j]``), whose dot products are exactly the peer's cosines. The columns the peer drops
(``q_i`` itself; the documents of pair ``i`` in ``doc_to_doc``) are excluded per row, and the
hardness term touches the ``query_to_doc`` block only, as the peer's does. Any temperature rule
of the core (MACL's from the alignment, DySTreSS's per pair) then applies to the whole row.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from adaptcl.adapters import require
from adaptcl.plugins.base import reduce
from adaptcl.plugins.candidates import Candidates, compute_dtype, normalize
from adaptcl.plugins.validation import check_bool, check_embedding_tensor

require("sentence_transformers", "text")

from sentence_transformers.util import get_rank  # noqa: E402

#: ``MultipleNegativesRankingLoss``'s interaction terms, in its order
Direction = Literal["query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc"]
DIRECTIONS: tuple[Direction, ...] = get_args(Direction)
#: one softmax over all the selected terms (``"joint"``), or one per term, averaged
PartitionMode = Literal["joint", "per_direction"]
PARTITION_MODES: tuple[PartitionMode, ...] = get_args(PartitionMode)
SYMMETRIC: tuple[Direction, ...] = ("query_to_doc", "doc_to_query")


def resolve_directions(directions: Sequence[Direction] | None,
                       partition_mode: PartitionMode | None,
                       symmetric: bool) -> tuple[tuple[Direction, ...], PartitionMode]:
    """``(directions, partition_mode)`` checked as the peer checks them, with the peer's
    defaults (``("query_to_doc",)``, ``"joint"``); ``symmetric=True`` is ``SYMMETRIC`` with
    ``"per_direction"``. The directions come back in the peer's order, each once."""
    symmetric = check_bool("symmetric", symmetric)
    if directions is None and partition_mode is None:
        return (SYMMETRIC, "per_direction") if symmetric else (("query_to_doc",), "joint")
    if isinstance(directions, str) or not hasattr(directions, "__iter__") and directions is not None:
        raise TypeError(f"directions must be a sequence of direction names such as "
                        f"('query_to_doc',), got {type(directions).__name__} {directions!r}")
    chosen = ("query_to_doc",) if directions is None else tuple(directions)
    if not chosen:
        raise ValueError("directions=(): at least one direction must be specified, as in "
                         "MultipleNegativesRankingLoss")
    unknown = [d for d in chosen if d not in DIRECTIONS]
    if unknown:
        raise ValueError(f"directions: invalid {unknown}, valid: {DIRECTIONS}")
    if "query_to_doc" not in chosen:
        raise ValueError(f"directions={chosen}: 'query_to_doc' is required (it contains the "
                         "positive pair), as in MultipleNegativesRankingLoss")
    mode = "joint" if partition_mode is None else partition_mode
    if mode not in PARTITION_MODES:
        raise ValueError(f"partition_mode must be one of {PARTITION_MODES}, got {partition_mode!r}")
    ordered = tuple(d for d in DIRECTIONS if d in chosen)
    if mode == "per_direction" and {"query_to_query", "doc_to_doc"} & set(ordered):
        raise ValueError("partition_mode='per_direction' needs the positive pair among every "
                         "direction's candidates; 'query_to_query' and 'doc_to_doc' never hold "
                         "it (MultipleNegativesRankingLoss refuses them too): use "
                         "partition_mode='joint'")
    if symmetric and (ordered, mode) != (SYMMETRIC, "per_direction"):
        raise ValueError(f"symmetric=True is directions={SYMMETRIC}, partition_mode="
                         f"'per_direction', but directions={chosen}, partition_mode={mode!r} "
                         "were given: pass one or the other")
    return ordered, mode


def check_joint(directions: tuple[Direction, ...], core: nn.Module, *, use_labels: bool) -> None:
    """What a joint softmax over several terms cannot be combined with."""
    if not hasattr(core, "compute_from_candidates"):
        raise ValueError(f"directions={directions}: {type(core).__name__} cannot take the joint "
                         "rows (it builds its own candidates)")
    if use_labels:
        raise ValueError(f"use_labels=True with directions={directions}: a joint row holds the "
                         "query's and the document's candidates, which have no one class to be "
                         "positives of; use partition_mode='per_direction'")


def joint_candidates(queries: Tensor, docs: Tensor, negatives: Tensor | None,
                     directions: tuple[Direction, ...], *, gather: Any,
                     negative_owners: Tensor | None, check_finite: bool) -> Candidates:
    """The peer's joint rows as one direction of the core (module docstring).

    ``gather`` is ``None`` on one process, else the gradient-carrying all-gather (the rows
    stay this rank's, the columns are every rank's); ``negatives`` are gathered already and
    ``negative_owners`` (the pair each belongs to, over the gathered batch) say whose they are.
    """
    for name, x in (("queries", queries), ("docs", docs), ("negatives", negatives)):
        if x is not None:
            check_embedding_tensor(name, x, dim=queries.shape[1], check_finite=check_finite)
    n = queries.shape[0]
    dtype = compute_dtype(queries, docs, negatives)
    q, d = normalize(queries, dtype), normalize(docs, dtype)
    all_q, all_d = (q, d) if gather is None else (gather(q), gather(d))
    rank = 0 if gather is None else get_rank()
    own = rank * n + torch.arange(n, device=q.device)  # this rank's pairs in the gathered batch
    all_docs = all_d if negatives is None else torch.cat([all_d, normalize(negatives, dtype)])
    q_zero, doc_zero = torch.zeros_like(all_q), torch.zeros_like(all_docs)
    blocks = {"query_to_doc": torch.cat([all_docs, doc_zero], 1),
              "query_to_query": torch.cat([all_q, q_zero], 1),
              "doc_to_query": torch.cat([q_zero, all_q], 1),
              "doc_to_doc": torch.cat([doc_zero, all_docs], 1)}
    start, self_index, excluded = {}, None, []
    columns = 0
    for direction in directions:
        start[direction] = columns
        columns += blocks[direction].shape[0]
    if "query_to_query" in start:
        self_index = start["query_to_query"] + own
    if "doc_to_doc" in start:
        excluded.append(start["doc_to_doc"] + own)  # d_i itself
        if negatives is not None:  # and the hard negatives of pair i
            per_pair = torch.argsort(negative_owners, stable=True).view(all_q.shape[0], -1)
            start_negatives = start["doc_to_doc"] + all_d.shape[0]
            excluded += list((start_negatives + per_pair[own]).T)
    return Candidates(anchors=torch.cat([q, d], 1),
                      keys=torch.cat([blocks[direction] for direction in directions]),
                      positive_sim=(q * d).sum(dim=1), positive_index=own, self_index=self_index,
                      positive_keys=torch.cat([d, torch.zeros_like(d)], 1),
                      sample_index=None if negative_owners is None else own,
                      num_batch_keys=all_d.shape[0], negative_owners=negative_owners,
                      extra_excluded=tuple(excluded), hardness_columns=all_docs.shape[0],
                      input_dtype=torch.promote_types(queries.dtype, docs.dtype))


def joint_loss(core: nn.Module, cands: Candidates) -> Tensor:
    """The core's loss on the joint rows, its ``last_stats`` set as its ``forward`` sets them."""
    per_anchor, core.last_stats = core.compute_from_candidates([cands])
    return reduce(per_anchor, core.reduction)


def hard_negative_owners(rows: int, columns: int, device: torch.device, world: int) -> Tensor:
    """The pair each hard-negative row belongs to, counted over the gathered batch: the local
    negatives are ``columns`` blocks of ``rows`` (block ``k`` row ``i`` is anchor ``i``'s), and
    ``all_gather_with_grad`` concatenates the ranks' blocks, rank ``r``'s anchors being
    ``r * rows + i``."""
    local = torch.arange(rows, device=device).repeat(columns)
    return torch.cat([r * rows + local for r in range(world)])


@contextmanager
def without_hardness(core: nn.Module) -> Iterator[None]:
    """The core with its hardness term off for one call (the reverse direction)."""
    mode = getattr(core, "hardness_mode", None)
    if mode is None:
        yield
        return
    core.hardness_mode = None
    try:
        yield
    finally:
        core.hardness_mode = mode
