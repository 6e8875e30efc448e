"""The features of a frozen encoder and Lightly's weighted kNN on them: what the online kNN
monitor of :class:`~adaptcl.adapters.lightning.base.SSLModule` and the ``images`` recipe's
evaluation (:mod:`adaptcl.evaluation.images`) share.

Example:
    >>> bank, bank_targets = extract_features(backbone, bank_loader, "cpu")
    >>> test, test_targets = extract_features(backbone, test_loader, "cpu")
    >>> bank = F.normalize(bank, dim=1).t().contiguous()
    >>> correct = knn_correct(F.normalize(test, dim=1), bank, bank_targets, test_targets, 10)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from adaptcl.adapters import require

require("lightly", "vision")

from lightly.utils.benchmarking import knn_predict  # noqa: E402

__all__ = ["extract_features", "knn_correct"]


@torch.no_grad()
def extract_features(model: nn.Module, loader: Any, device: torch.device | str, *,
                     keep_on_device: bool = False, progress: bool = False,
                     desc: str = "features") -> tuple[Tensor, Tensor]:
    """Flattened float features and targets of every ``(images, targets, ...)`` batch.

    ``model`` runs in eval mode without gradients (its mode is restored afterwards), on
    ``device``; the features are gathered on the CPU unless ``keep_on_device``.
    """
    from tqdm.auto import tqdm

    was_training = model.training
    model.eval()
    features, targets = [], []
    for batch in tqdm(loader, desc=desc, disable=not progress, leave=False):
        out = model(batch[0].to(device)).flatten(start_dim=1).float()
        target = torch.as_tensor(batch[1])
        features.append(out if keep_on_device else out.cpu())
        targets.append(target.to(device) if keep_on_device else target)
    model.train(was_training)
    return torch.cat(features), torch.cat(targets).long()


def knn_correct(features: Tensor, bank: Tensor, bank_targets: Tensor, targets: Tensor,
                num_classes: int, knn_k: int = 200, knn_t: float = 0.1) -> int:
    """How many ``targets`` Lightly's weighted kNN (``knn_predict``) classifies right.

    ``features`` ``[B, D]`` and the ``bank`` ``[D, N]`` are L2-normalised; ``k`` is capped at N.
    """
    predicted = knn_predict(features, bank, bank_targets, num_classes,
                            knn_k=min(knn_k, bank.shape[1]), knn_t=knn_t)
    return int((predicted[:, 0] == targets).sum())
