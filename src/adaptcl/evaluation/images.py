"""Evaluation of a frozen image backbone: weighted kNN and a linear probe (the ``images`` recipe's).

:func:`evaluate_backbone` extracts the features of the un-augmented training and test images
once, on the device it is given, and scores them there with Lightly's weighted kNN
(:func:`knn_accuracy`) and, if asked, a linear classifier (:func:`linear_probe`, MACL App. B.3).
"""

from __future__ import annotations

from typing import Any

from adaptcl.evaluation.checks import check_embeddings


def knn_accuracy(train_x, train_y, test_x, test_y, num_classes: int, k: int = 200,
                 t: float = 0.1, chunk: int = 1024) -> float:
    """Top-1 accuracy of Lightly's weighted kNN (``knn_predict``) on normalised features."""
    import torch.nn.functional as F

    from adaptcl.adapters.lightning.features import knn_correct

    if not len(test_x):
        return float("nan")
    bank = F.normalize(train_x, dim=1).t().contiguous()
    correct = sum(knn_correct(F.normalize(test_x[i:i + chunk], dim=1), bank, train_y,
                              test_y[i:i + chunk], num_classes, k, t)
                  for i in range(0, len(test_x), chunk))
    return correct / len(test_x)


def linear_probe(train_x, train_y, test_x, test_y, num_classes: int, epochs: int = 100,
                 batch_size: int = 128, lr: float = 0.02, momentum: float = 0.9,
                 seed: int = 0, progress: bool = False) -> float:
    """Top-1 test accuracy of a linear classifier on frozen, standardised features.

    MACL App. B.3: 100 epochs, batch 128, SGD lr 0.02, momentum 0.9, no weight decay, with a
    cosine schedule; features are pre-extracted from un-augmented images and standardised
    with the training mean and standard deviation.
    """
    import torch
    from tqdm.auto import tqdm

    if epochs == 0:
        return float("nan")
    mean, std = train_x.mean(0, keepdim=True), train_x.std(0, keepdim=True).clamp(min=1e-6)
    xtr, xte = (train_x - mean) / std, (test_x - mean) / std
    generator = torch.Generator().manual_seed(seed)  # on the CPU: one order on every device
    torch.manual_seed(seed)
    head = torch.nn.Linear(xtr.shape[1], num_classes).to(xtr.device)
    opt = torch.optim.SGD(head.parameters(), lr=lr, momentum=momentum, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    for _ in tqdm(range(epochs), desc="linear probe", disable=not progress, leave=False):
        order = torch.randperm(len(xtr), generator=generator)
        for start in range(0, len(xtr), batch_size):
            idx = order[start:start + batch_size].to(xtr.device)
            loss = torch.nn.functional.cross_entropy(head(xtr[idx]), train_y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
    with torch.no_grad():
        return float((head(xte).argmax(1) == test_y).float().mean())


def backbone_features(backbone: Any, bank_loader: Any, test_loader: Any, device: Any, *,
                      progress: bool = False) -> tuple[Any, Any, Any, Any]:
    """``(train_x, train_y, test_x, test_y)`` of the frozen ``backbone`` moved to ``device``,
    computed and kept there.

    ``device`` is the run's, given by the caller: a module's own device says nothing of where it
    trained once Lightning's ``Strategy.teardown()`` has moved it back to the CPU after ``fit``.
    """
    from adaptcl.adapters.lightning.features import extract_features

    backbone.to(device)
    return (*extract_features(backbone, bank_loader, device, keep_on_device=True,
                              progress=progress, desc="train features"),
            *extract_features(backbone, test_loader, device, keep_on_device=True,
                              progress=progress, desc="test features"))


def evaluate_backbone(backbone: Any, bank_loader: Any, test_loader: Any, num_classes: int, *,
                      device: Any, cfg: Any, seed: int, where: str) -> dict[str, float]:
    """``knn_top1`` (and ``linear_top1`` when ``cfg.linear_epochs``) of ``backbone`` on ``device``
    (the features, the kNN and the probe: :func:`backbone_features`).

    ``cfg`` supplies ``knn_k``, ``knn_t``, ``linear_epochs``, ``linear_batch_size``,
    ``linear_lr`` and ``progress``; ``seed`` seeds the probe; constant or non-finite features
    are refused (named by ``where``; :func:`adaptcl.evaluation.checks.check_embeddings`).
    """
    train_x, train_y, test_x, test_y = backbone_features(backbone, bank_loader, test_loader,
                                                         device, progress=cfg.progress)
    check_embeddings(train_x, f"{where} backbone features")
    metrics = {"knn_top1": knn_accuracy(train_x, train_y, test_x, test_y, num_classes,
                                        cfg.knn_k, cfg.knn_t)}
    if cfg.linear_epochs:
        metrics["linear_top1"] = linear_probe(train_x, train_y, test_x, test_y, num_classes,
                                              cfg.linear_epochs, cfg.linear_batch_size,
                                              cfg.linear_lr, seed=seed, progress=cfg.progress)
    return metrics
