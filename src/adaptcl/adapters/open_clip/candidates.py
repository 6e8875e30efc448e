"""The similarity step of CLIP's loss, gathered exactly as open_clip's ``ClipLoss`` gathers.

One :class:`~adaptcl.plugins.candidates.Candidates` per direction, image -> text and
text -> image, for the core's kernel. Features are normalised by the core (a no-op on the unit
rows an open_clip model returns) and gathered with open_clip's own ``gather_features``, so every
``local_loss`` x ``gather_with_grad`` combination (and horovod) behaves as in ``ClipLoss``:

* ``local_loss=False``: every rank builds the global ``[N_all, N_all]`` problem; without
  ``gather_with_grad`` the other ranks' features carry no gradient and the local ones are put
  back into the gathered tensor so that their gradient flows;
* ``local_loss=True``: the local rows (anchors) against every rank's columns, the positive of
  local row ``i`` at column ``rank * N + i``; without ``gather_with_grad`` no gathered column
  carries a gradient (the local ones included), as in open_clip;
* the positive logit is the anchor times the positive's column of the gathered keys (the
  diagonal of ``ClipLoss``'s logits, with the same autograd graph).

``labels`` are gathered with the features (no gradient) and every key of the anchor's class
becomes a positive (:mod:`adaptcl.plugins.targets`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from adaptcl.adapters import require
from adaptcl.plugins.candidates import Candidates, compute_dtype, normalize

open_clip_loss = require("open_clip.loss", "clip")

__all__ = ["clip_candidates", "gather_labels"]


def gather_labels(labels: Tensor, world_size: int, use_horovod: bool) -> Tensor:
    """``labels`` of every rank, concatenated in rank order (no gradient)."""
    if use_horovod:
        return open_clip_loss.hvd.allgather(labels)
    parts = [torch.empty_like(labels) for _ in range(world_size)]
    dist.all_gather(parts, labels.contiguous())
    return torch.cat(parts)


def _direction(anchors: Tensor, keys: Tensor, positive_index: Tensor, labels: Tensor | None,
               key_labels: Tensor | None, input_dtype: torch.dtype) -> Candidates:
    positive_keys = keys if anchors.shape[0] == keys.shape[0] else keys[positive_index]
    return Candidates(anchors=anchors, keys=keys, positive_sim=(anchors * positive_keys).sum(dim=1),
                      positive_index=positive_index, positive_keys=positive_keys, labels=labels,
                      key_labels=key_labels, num_batch_keys=keys.shape[0],
                      input_dtype=input_dtype)


def clip_candidates(image_features: Tensor, text_features: Tensor, positive_index: Tensor,
                    labels: Tensor | None = None, *, local_loss: bool = False,
                    gather_with_grad: bool = False, rank: int = 0, world_size: int = 1,
                    use_horovod: bool = False) -> list[Candidates]:
    """``[image -> text, text -> image]`` candidates of CLIP's loss (module docstring).

    ``positive_index`` is ``ClipLoss.get_ground_truth``'s: the column of each row's positive
    (``arange(rows)``, offset by ``rank * N`` with ``local_loss`` on several ranks). Inputs are
    checked by the caller.
    """
    dtype = compute_dtype(image_features, text_features)
    # the towers' dtype (bf16 under autocast) sets the precision of the products
    given = torch.promote_types(image_features.dtype, text_features.dtype)
    image, text = normalize(image_features, dtype), normalize(text_features, dtype)
    all_image, all_text, all_labels = image, text, labels
    if world_size > 1:
        all_image, all_text = open_clip_loss.gather_features(
            image, text, local_loss=local_loss, gather_with_grad=gather_with_grad, rank=rank,
            world_size=world_size, use_horovod=use_horovod)
        if labels is not None:
            all_labels = gather_labels(labels, world_size, use_horovod)
        if not local_loss:
            image, text, labels = all_image, all_text, all_labels
    return [_direction(image, all_text, positive_index, labels, all_labels, given),
            _direction(text, all_image, positive_index, labels, all_labels, given)]
