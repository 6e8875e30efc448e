"""Gradient caching in a ``LightningModule``: :class:`GradientCaching`, a mixin whose
:meth:`~GradientCaching.embed` runs an encoder through
:func:`adaptcl.plugins.cached_forward` when ``mini_batch_size`` is below the batch.

Why neither manual optimisation nor a custom ``backward``: the cached embeddings are an
ordinary autograd node, so Lightning's automatic optimisation drives the replay from its own
``backward``. Its precision plugins (``bf16-mixed``; ``16-mixed`` scales the loss with its
``GradScaler``, and the replayed gradients carry the scale), ``gradient_clip_val``,
``accumulate_grad_batches``, DDP's gradient reduction and checkpoints stay Lightning's, with
no code here.

Imports no framework: it reads the attached trainer's ``progress_bar_callback``, if any.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from torch import Tensor

from adaptcl.plugins.gradient_cache import BATCH_NORM_MODES, BatchNormMode, cached_forward
from adaptcl.plugins.validation import check_choice, check_int

__all__ = ["GradientCaching", "check_mini_batch_size"]


def check_mini_batch_size(value: int | None) -> int | None:
    """``None`` (no caching) or an int >= 1, else a ``TypeError``/``ValueError`` naming it."""
    return None if value is None else check_int("mini_batch_size", value, 1)


class GradientCaching:
    """Mixin of a ``LightningModule``: ``self.embed(encoder, x)`` is ``encoder(x)``, computed
    ``mini_batch_size`` rows at a time with gradient caching when the batch is larger.

    ``mini_batch_size``: ``None`` (default) never caches. ``cache_batch_norm``: what BatchNorm
    computes in a cached step (``"chunk"``: statistics per chunk; ``"frozen"``: eval mode; see
    :mod:`adaptcl.plugins.gradient_cache`). A cached step shows one bar per pass and encoder
    while the trainer has a progress bar and stderr is a terminal.
    """

    mini_batch_size: int | None = None
    cache_batch_norm: BatchNormMode = "chunk"

    def set_gradient_cache(self, mini_batch_size: int | None,
                           batch_norm: BatchNormMode = "chunk") -> None:
        """Cache gradients ``mini_batch_size`` rows at a time (``None``: never)."""
        self.mini_batch_size = check_mini_batch_size(mini_batch_size)
        self.cache_batch_norm = check_choice("cache_batch_norm", batch_norm, BATCH_NORM_MODES)

    def embed(self, encoder: Callable[[Tensor], Any], x: Tensor, out_dims: int = 0) -> Any:
        """``encoder(x)``; through :func:`~adaptcl.plugins.cached_forward` (``module`` this
        module, ``out_dims`` the rows' dimension of the output) where ``mini_batch_size`` is
        below the batch. Without a graph (a momentum encoder) it is chunked all the same, so
        its BatchNorm sees the chunks the cached encoder sees."""
        if self.mini_batch_size is None or x.shape[0] <= self.mini_batch_size:
            return encoder(x)
        return cached_forward(encoder, x, self.mini_batch_size, module=self,  # type: ignore[arg-type]
                              out_dims=out_dims, batch_norm=self.cache_batch_norm,
                              progress=self._chunk_progress())

    def _chunk_progress(self) -> Any:
        trainer = getattr(self, "_trainer", None)
        if trainer is None or trainer.progress_bar_callback is None or not sys.stderr.isatty():
            return None
        from tqdm.auto import tqdm

        return functools.partial(tqdm, leave=False, dynamic_ncols=True)
