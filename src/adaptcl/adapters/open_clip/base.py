"""What every open_clip drop-in shares: ``ClipLoss``'s constructor, call and distributed
semantics around a core loss of :mod:`adaptcl.plugins`.

Each loss subclasses open_clip's own ``ClipLoss`` (as open_clip's ``CoCaLoss`` and
``DistillClipLoss`` do), so ``isinstance(loss, ClipLoss)`` holds and ``get_ground_truth`` with
``cache_labels`` is open_clip's; only ``forward`` differs: the similarity step of
:mod:`adaptcl.adapters.open_clip.candidates`, then the core's kernel (materialised, or tiled
with ``tile_size``).
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import Tensor

from adaptcl.adapters import require
from adaptcl.plugins import ContrastiveLoss
from adaptcl.plugins.base import Stats
from adaptcl.plugins.validation import (
    TileSize,
    check_all_finite,
    check_bool,
    check_embedding_tensor,
    check_int,
    check_labels,
    check_positive,
)

open_clip_loss = require("open_clip.loss", "clip")

from .candidates import clip_candidates  # noqa: E402

__all__ = ["AdaptiveClipLoss"]


def _check_distributed(local_loss, gather_with_grad, cache_labels, rank, world_size,
                       use_horovod) -> None:
    for name, value in (("local_loss", local_loss), ("gather_with_grad", gather_with_grad),
                        ("cache_labels", cache_labels), ("use_horovod", use_horovod)):
        check_bool(name, value)
    check_int("world_size", world_size, 1)
    check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size = {world_size}, got {rank}")
    if use_horovod and open_clip_loss.hvd is None:
        raise ImportError("use_horovod=True needs horovod (`import horovod.torch` failed); "
                          "install it or use torch.distributed (use_horovod=False)")


def _scalar(name: str, value: Tensor | float, device: torch.device) -> Tensor | float:
    """A positive-or-any scalar given as a number or a one-element tensor, as a 0-d tensor."""
    if isinstance(value, Tensor):
        if value.numel() != 1 or not value.is_floating_point():
            raise ValueError(f"{name} must be a scalar (a one-element floating-point tensor or "
                             f"a number), got a {value.dtype} tensor of shape "
                             f"{tuple(value.shape)}")
        if value.device != device and value.device.type != "cpu":  # a CPU scalar mixes in
            raise ValueError(f"{name} is on {value.device} but the features are on {device}")
        return value.reshape(())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a tensor or a number, got {type(value).__name__}")
    return float(value)


def check_logit_scale(logit_scale: Tensor | float, device: torch.device) -> Tensor | float:
    """open_clip's ``logit_scale`` (``model.logit_scale.exp()``: the inverse temperature), a
    finite number > 0: a ``ValueError`` on the CPU. On an accelerator the check never stalls
    the step: NaN or inf is let through and told later, as the features' ``check_finite``
    (:func:`~adaptcl.plugins.validation.check_all_finite`: the loss is NaN, which a
    ``GradScaler`` skips, as with ``ClipLoss``); a finite value <= 0 (the log passed for its
    exponential) is a device-side assertion, as torch's own checks of an index."""
    scale = _scalar("logit_scale", logit_scale, device)
    if not isinstance(scale, Tensor):
        return check_positive("logit_scale", scale)
    finite = torch.isfinite(scale)
    if scale.device.type == "cpu" and not torch.compiler.is_compiling():
        if not bool(finite & (scale > 0)):
            raise ValueError(f"logit_scale must be a finite number > 0 (the model's "
                             f"logit_scale.exp()), got {float(scale)}")
    elif scale.device.type != "meta":
        check_all_finite("logit_scale", scale)
        torch._assert_async(~finite | (scale > 0), "logit_scale must be a finite number > 0")
    return scale


class AdaptiveClipLoss(open_clip_loss.ClipLoss):
    """Base of the drop-ins for open_clip's ``ClipLoss`` (:mod:`adaptcl.adapters.open_clip`).

    Args:
        local_loss, gather_with_grad, cache_labels, rank, world_size, use_horovod: exactly
            ``ClipLoss``'s (``use_horovod=True`` needs horovod installed).
        criterion: the core loss that computes the per-anchor losses of both directions from
            the candidates (its ``tile_size`` says how the similarity matrix is computed,
            :mod:`adaptcl.plugins.execution`).

    Subclasses implement :meth:`compute` (the core call, with the temperature rule) and set
    :attr:`takes_labels` and :attr:`uses_logit_scale`.
    """

    #: ``forward`` takes ``labels`` (multi-positive targets)
    takes_labels: bool = True
    #: the loss's temperature comes from ``logit_scale``; False: ``logit_scale`` is ignored
    #: (with a warning on the first call) and gets a zero gradient
    uses_logit_scale: bool = True
    #: why ``logit_scale`` is ignored (the warning's text), for losses that ignore it
    ignored_scale: str = ""

    def __init__(self, local_loss: bool = False, gather_with_grad: bool = False,
                 cache_labels: bool = False, rank: int = 0, world_size: int = 1,
                 use_horovod: bool = False, *, criterion: ContrastiveLoss) -> None:
        _check_distributed(local_loss, gather_with_grad, cache_labels, rank, world_size,
                           use_horovod)
        super().__init__(local_loss=local_loss, gather_with_grad=gather_with_grad,
                         cache_labels=cache_labels, rank=rank, world_size=world_size,
                         use_horovod=use_horovod)
        self.criterion = criterion
        self.last_stats: Stats = {}
        self._warned = False

    @property
    def tile_size(self) -> TileSize:
        """The core's tile size (``None``: the similarity matrix is materialised; ``"auto"``:
        :mod:`adaptcl.plugins.execution` chooses)."""
        return self.criterion.tile_size

    def compute(self, cands: list, logit_scale: Tensor | float) -> tuple[Tensor, Stats]:
        raise NotImplementedError  # pragma: no cover - abstract

    def _check_call(self, image_features: Tensor, text_features: Tensor,
                    labels: Tensor | None) -> Tensor | None:
        check = self.criterion.check_finite
        check_embedding_tensor("image_features", image_features, check_finite=check)
        check_embedding_tensor("text_features", text_features, check_finite=check)
        if image_features.shape != text_features.shape:
            raise ValueError(f"image_features and text_features must have the same shape, got "
                             f"{tuple(image_features.shape)} and {tuple(text_features.shape)}")
        if image_features.device != text_features.device:
            raise ValueError(f"image_features and text_features are on different devices: "
                             f"{image_features.device} and {text_features.device}")
        if image_features.shape[0] == 0:
            raise ValueError("image_features and text_features are empty: the batch needs at "
                             "least one pair")
        if self.world_size > 1 and not self.use_horovod:
            if not (dist.is_available() and dist.is_initialized()):
                raise ValueError(f"world_size={self.world_size} needs an initialised "
                                 f"torch.distributed process group (or use_horovod=True)")
            if (dist.get_world_size(), dist.get_rank()) != (self.world_size, self.rank):
                raise ValueError(f"world_size={self.world_size}, rank={self.rank} disagree with "
                                 f"the process group's {dist.get_world_size()}, "
                                 f"{dist.get_rank()}")
        if labels is None:
            return None
        if not self.takes_labels:
            raise TypeError(f"{type(self).__name__} takes no labels: multi-positive targets are "
                            f"for InfoNCEClipLoss, MACLClipLoss (reweight=False) and "
                            f"DySTreSSClipLoss")
        return check_labels("labels", labels, image_features.shape[0], image_features.device)

    def forward(self, image_features: Tensor, text_features: Tensor,
                logit_scale: Tensor | float, logit_bias: Tensor | float | None = None,
                output_dict: bool = False, *,
                labels: Tensor | None = None) -> Tensor | dict[str, Tensor]:
        """CLIP's symmetric loss, called as ``ClipLoss``.

        Args:
            image_features, text_features: ``[N, D]`` features of this rank (open_clip's
                models return them normalised; they are normalised again, a no-op).
            logit_scale: the model's ``logit_scale.exp()``, the inverse temperature (how each
                loss uses it: its docstring).
            logit_bias: a scalar added to every logit by ``ClipLoss``; it cancels in each
                row's softmax, so it changes neither the value nor any gradient (its own
                gradient is exactly 0 here, about 1e-8 in ``ClipLoss``).
            output_dict: return ``{"contrastive_loss": loss}`` as ``ClipLoss`` does.
            labels: optional ``[N]`` class of each pair: every image (text) of the anchor's
                class, on any rank, is a positive of its text (image) (SupCon's ``L_out``;
                :mod:`adaptcl.plugins.targets`). All-distinct labels give the plain loss.
        """
        labels = self._check_call(image_features, text_features, labels)
        device = image_features.device
        scale = check_logit_scale(logit_scale, device)
        bias = None if logit_bias is None else _scalar("logit_bias", logit_bias, device)
        check_bool("output_dict", output_dict)
        rows = image_features.shape[0] * (1 if self.local_loss else self.world_size)
        cands = clip_candidates(
            image_features, text_features, self.get_ground_truth(device, rows), labels,
            local_loss=self.local_loss, gather_with_grad=self.gather_with_grad, rank=self.rank,
            world_size=self.world_size, use_horovod=self.use_horovod)
        if not self.uses_logit_scale and not self._warned:
            self._warned = True
            warnings.warn(f"{type(self).__name__} ignores logit_scale: {self.ignored_scale}; "
                          f"the model's logit_scale gets a zero gradient", UserWarning,
                          stacklevel=4)  # the caller of loss(...)
        per_anchor, stats = self.compute(cands, scale)
        loss = per_anchor.mean()
        # parameters the value does not depend on get an exact zero gradient, so that DDP
        # (which expects a gradient for every parameter used in forward) is satisfied
        for unused in (bias, None if self.uses_logit_scale else scale):
            if isinstance(unused, Tensor) and unused.requires_grad:
                loss = loss + 0.0 * unused.to(loss.dtype)
        self.last_stats = stats
        return {"contrastive_loss": loss} if output_dict else loss

    def extra_repr(self) -> str:
        parts = [f"local_loss={self.local_loss}", f"gather_with_grad={self.gather_with_grad}"]
        if self.world_size > 1:
            parts += [f"rank={self.rank}", f"world_size={self.world_size}"]
        if self.use_horovod:
            parts.append("use_horovod=True")
        return ", ".join(parts)
