"""MoCo with the ASCL loss: momentum key encoder on weak views, strong views for the query."""

from __future__ import annotations

import copy

import torch
from lightly.models import utils as lightly_utils
from lightly.models.modules.heads import MoCoProjectionHead
from lightly.utils import dist as lightly_dist
from torch import Tensor, nn

from adaptcl.plugins.ascl import ASCLMode
from adaptcl.plugins.validation import TileSize, check_int

from .loss import ASCLLoss

__all__ = ["ASCLMoCo"]


class ASCLMoCo(nn.Module):
    """MoCo with the ASCL loss [0]: query from a strong view, key from a weak view.

    The key encoder is a momentum copy (Lightly's ``update_momentum``, momentum 0.99 in the
    paper) of the backbone and MoCo v2 projection head; keys are gathered over ranks (no
    gradient) before they enter the queue; negatives and soft targets come from the queue
    (4096 entries for CIFAR in the paper). The queue is a persistent Lightly memory bank
    (:class:`~adaptcl.adapters.lightly.PersistentMemoryBankModule`): it is saved and restored
    with ``state_dict``, so a resumed run continues with the same queue.

    - [0] Feng & Patras, Adaptive Soft Contrastive Learning, ICPR 2022,
      https://arxiv.org/abs/2207.11163

    Args:
        backbone: module mapping images to ``[B, feature_dim]`` (or ``[B, feature_dim, 1, 1]``).
        feature_dim: backbone output dimension.
        hidden_dim, output_dim: MoCo v2 projection head sizes.
        queue_size: number of keys in the queue.
        momentum: momentum of the key encoder (``m`` in ``update_momentum``).
        temperature, sharpen_temperature, num_neighbors, mode: ASCL's tau, tau', K and variant.
        gather_distributed: gather keys from every rank before they enter the queue.
        tile_size: how the loss computes its logits (:class:`~adaptcl.plugins.ASCLLoss`).

    Examples:
        >>> model = ASCLMoCo(backbone, feature_dim=512, queue_size=4096)
        >>> x_strong, x_weak = batch[0]           # from ASCLTransform
        >>> model.update_momentum()               # once per step, before the key forward
        >>> loss = model.training_loss(x_strong, x_weak)
        >>> model.criterion.last_stats["confidence"]
    """

    def __init__(self, backbone: nn.Module, feature_dim: int, hidden_dim: int = 2048,
                 output_dim: int = 128, queue_size: int = 4096, momentum: float = 0.99,
                 temperature: float = 0.1, sharpen_temperature: float = 0.05,
                 num_neighbors: int = 1, mode: ASCLMode = "ascl",
                 gather_distributed: bool = False, tile_size: TileSize = "auto") -> None:
        super().__init__()
        check_int("feature_dim", feature_dim, 1)
        check_int("queue_size", queue_size, 1)
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must be in [0, 1], got {momentum}")
        self.momentum = float(momentum)
        self.backbone = backbone
        self.projection_head = MoCoProjectionHead(feature_dim, hidden_dim, output_dim)
        self.backbone_momentum = copy.deepcopy(backbone)
        self.projection_head_momentum = copy.deepcopy(self.projection_head)
        lightly_utils.deactivate_requires_grad(self.backbone_momentum)
        lightly_utils.deactivate_requires_grad(self.projection_head_momentum)
        self.criterion = ASCLLoss(temperature=temperature,
                                  sharpen_temperature=sharpen_temperature,
                                  num_neighbors=num_neighbors, mode=mode,
                                  memory_bank_size=(queue_size, output_dim),
                                  gather_distributed=gather_distributed,
                                  persistent_memory_bank=True, tile_size=tile_size)

    @property
    def queue(self) -> Tensor:
        """The ``[queue_size, output_dim]`` queue of keys (a persistent buffer)."""
        return self.criterion.memory_bank.bank

    def forward(self, x: Tensor) -> Tensor:
        """Backbone features ``[B, feature_dim]`` (what kNN and linear probes use)."""
        return self.backbone(x).flatten(start_dim=1)

    def forward_query(self, x: Tensor) -> Tensor:
        return self.projection_head(self.forward(x))

    @torch.no_grad()
    def forward_key(self, x: Tensor) -> Tensor:
        world = lightly_dist.world_size()
        if world > 1:  # shuffle BN across GPUs, as in MoCo
            x, shuffle = lightly_utils.batch_shuffle_distributed(x)
        features = self.backbone_momentum(x).flatten(start_dim=1)
        key = self.projection_head_momentum(features).detach()
        if world > 1:
            key = lightly_utils.batch_unshuffle_distributed(key, shuffle)
        return key

    @torch.no_grad()
    def update_momentum(self, momentum: float | None = None) -> None:
        """EMA update of the key encoder (call once per step before :meth:`forward_key`)."""
        m = self.momentum if momentum is None else momentum
        lightly_utils.update_momentum(self.backbone, self.backbone_momentum, m=m)
        lightly_utils.update_momentum(self.projection_head, self.projection_head_momentum, m=m)

    def training_loss(self, x_query: Tensor, x_key: Tensor) -> Tensor:
        """ASCL loss of a strong-view batch against the weak-view keys and the queue."""
        query = self.forward_query(x_query)
        key = self.forward_key(x_key)
        return self.criterion(query, key)
