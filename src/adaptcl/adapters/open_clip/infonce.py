"""CLIP's own loss and DCL as drop-ins for open_clip's ``ClipLoss``, on the core's kernel.

References:
    - Radford et al., "Learning Transferable Visual Models From Natural Language Supervision"
      (CLIP), ICML 2021; open_clip (github.com/mlfoundations/open_clip), ``open_clip.loss``.
    - Yeh et al., "Decoupled Contrastive Learning", ECCV 2022.
    - Khosla et al., "Supervised Contrastive Learning", NeurIPS 2020 (``labels``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from adaptcl import plugins
from adaptcl.plugins.base import Stats
from adaptcl.plugins.validation import TileSize

from .base import AdaptiveClipLoss

__all__ = ["InfoNCEClipLoss", "DCLClipLoss"]


def _temperature(logit_scale: Tensor | float, cands: list) -> Tensor | float:
    """``1 / logit_scale``, in the computation's dtype, keeping its gradient."""
    if isinstance(logit_scale, Tensor):
        return 1.0 / logit_scale.to(cands[0].anchors.dtype)
    return 1.0 / logit_scale


class InfoNCEClipLoss(AdaptiveClipLoss):
    """CLIP's symmetric InfoNCE, a drop-in for open_clip's ``ClipLoss`` that adds the tiled
    path (``tile_size``) and multi-positive targets (``labels``).

    How it uses ``logit_scale``: the temperature is ``tau = 1 / logit_scale``, exactly as
    ``ClipLoss`` (logits ``logit_scale * image @ text.T``), so the model's learned temperature
    gets the same gradient; open_clip's training loop keeps clamping it to ``[0, ln 100]``.
    ``logit_bias`` cancels in the softmax (see :meth:`forward`). The value and the gradients
    (features and ``logit_scale``) equal ``ClipLoss``'s in every ``local_loss`` x
    ``gather_with_grad`` combination.

    Args:
        local_loss, gather_with_grad, cache_labels, rank, world_size, use_horovod: as in
            ``ClipLoss``.
        tile_size: an int streams the ``[N, N]`` logits in ``tile_size`` blocks with an exact
            recomputing backward (memory linear in the batch; Inf-CL, Cheng et al. 2024);
            ``None`` materialises them as ``ClipLoss`` does; ``"auto"`` (default) takes the
            fastest exact path that fits (:class:`adaptcl.plugins.InfoNCELoss`; on the CPU
            without a budget, the materialised one). What computes the tiles and the budget:
            :class:`adaptcl.plugins.tiling`.
        check_finite: NaN/inf features are a ``ValueError`` on the CPU; on a GPU a NaN loss
            (which a ``GradScaler`` skips, as with ``ClipLoss``) and a ``NonFiniteWarning``,
            never a wait (:func:`~adaptcl.plugins.validation.check_all_finite`).

    ``forward(image_features, text_features, logit_scale, logit_bias=None, output_dict=False,
    *, labels=None)``: with ``labels`` every image (text) of the anchor's class is a positive
    of its text (image); all-distinct labels give ``ClipLoss``. ``last_stats`` holds ``loss``,
    ``plain_loss``, ``alignment``, ``temperature`` (``1 / logit_scale``), ``mean_w`` and
    ``positive_probability``.

    Examples:
        >>> loss_fn = InfoNCEClipLoss()            # was: open_clip.loss.ClipLoss()
        >>> image, text = torch.randn(8, 32), torch.randn(8, 32)
        >>> loss = loss_fn(image, text, torch.tensor(14.3))
        >>> out = loss_fn(image, text, torch.tensor(14.3), output_dict=True)
        >>> sorted(out)
        ['contrastive_loss']
        >>> supcon = loss_fn(image, text, torch.tensor(14.3),
        ...                  labels=torch.tensor([0, 1, 0, 2, 1, 0, 3, 3]))
    """

    def __init__(self, local_loss: bool = False, gather_with_grad: bool = False,
                 cache_labels: bool = False, rank: int = 0, world_size: int = 1,
                 use_horovod: bool = False, *, tile_size: TileSize = "auto",
                 check_finite: bool = True) -> None:
        core = self._core(tile_size=tile_size, check_finite=check_finite)
        super().__init__(local_loss, gather_with_grad, cache_labels, rank, world_size,
                         use_horovod, criterion=core)

    @staticmethod
    def _core(**shared: Any) -> plugins.InfoNCELoss:
        # the temperature of the core is replaced at every call by 1 / logit_scale
        return plugins.InfoNCELoss(1.0, form="cross_view_symmetric", **shared)

    def compute(self, cands: list, logit_scale: Tensor | float) -> tuple[Tensor, Stats]:
        return self.criterion.compute_from_candidates(
            cands, temperature=_temperature(logit_scale, cands))


class DCLClipLoss(InfoNCEClipLoss):
    """Decoupled contrastive loss (Yeh et al., ECCV 2022) in CLIP's symmetric form: each
    direction's positive leaves its denominator.

    How it uses ``logit_scale``: ``tau = 1 / logit_scale`` as :class:`InfoNCEClipLoss` (the
    learned temperature keeps learning). It takes no ``labels`` (a decoupled multi-positive
    loss is not defined here). Arguments as :class:`InfoNCEClipLoss`.

    Examples:
        >>> loss_fn = DCLClipLoss()
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32), torch.tensor(14.3))
    """

    takes_labels = False

    @staticmethod
    def _core(**shared: Any) -> plugins.DCLLoss:
        return plugins.DCLLoss(1.0, form="cross_view_symmetric", **shared)
