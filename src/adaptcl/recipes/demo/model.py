"""The model of ``adaptcl demo``: the small CNN with its SimCLR head, the training loop and the
frozen encoder's evaluation."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from adaptcl.precision import autocast
from adaptcl.recipes.demo.config import DemoConfig
from adaptcl.recipes.demo.data import augment
from adaptcl.recipes.engine.errors import DivergedError, trained_embeddings
from adaptcl.recipes.engine.progress import progress
from adaptcl.recipes.engine.torch_env import grad_scaler, resolve_device, seed_everything

if TYPE_CHECKING:  # torch is imported where it is used, so ``adaptcl demo --help`` is instant
    from torch import Tensor, nn

STEP_KEYS = ("loss", "plain_loss", "alignment", "temperature", "mean_w", "positive_probability")


def build_model(config: DemoConfig, seed: int) -> nn.ModuleDict:
    """``encoder`` (three 3x3 conv blocks, a linear layer to ``feature_dim``) and the SimCLR
    ``head`` (Linear-BN-ReLU-Linear), seeded: both losses start from the same weights."""
    from torch import nn

    def block(c_in: int, c_out: int) -> list[nn.Module]:
        return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                nn.ReLU(inplace=True)]

    seed_everything(seed)
    w, d = config.width, config.feature_dim
    encoder = nn.Sequential(*block(1, w), *block(w, 2 * w), nn.MaxPool2d(2),  # 8x8 -> 4x4
                            *block(2 * w, 2 * w), nn.Flatten(), nn.Linear(2 * w * 16, d))
    head = nn.Sequential(nn.Linear(d, d, bias=False), nn.BatchNorm1d(d), nn.ReLU(inplace=True),
                         nn.Linear(d, config.projection_dim))
    return nn.ModuleDict({"encoder": encoder, "head": head})


def train(model: nn.ModuleDict, loss_fn: nn.Module, images: Tensor, config: DemoConfig,
          seed: int, logger: Any = None, desc: str = "") -> dict[str, list[float]]:
    """SimCLR training (Adam, cosine schedule), the batch order and the views drawn from
    ``seed`` (the same for every loss); returns the per-step history of ``last_stats``."""
    import torch

    from adaptcl.plugins.validation import NonFiniteError

    device = resolve_device(config.device)
    model.to(device)
    order_gen = torch.Generator().manual_seed(seed)
    aug_gen = torch.Generator().manual_seed(seed + 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr,
                                 weight_decay=config.weight_decay)
    scaler = grad_scaler(device, config.precision)
    n = images.shape[0]
    # drop the last incomplete batch (as SimCLR loaders do) unless it is the only one
    steps_per_epoch = max(1, n // config.batch_size)
    total = steps_per_epoch * config.epochs
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
    history: dict[str, list[float]] = {"step": [], **{k: [] for k in STEP_KEYS}}
    model.train()
    bar = progress(total=total, desc=desc, enabled=config.progress)
    for _ in range(config.epochs):
        perm = torch.randperm(n, generator=order_gen)
        for s in range(steps_per_epoch):
            batch = images[perm[s * config.batch_size:(s + 1) * config.batch_size]]
            views = torch.cat([augment(batch, aug_gen), augment(batch, aug_gen)]).to(device)
            step = len(history["step"]) + 1
            try:
                with autocast(device, config.precision):
                    z0, z1 = model.head(model.encoder(views)).chunk(2)
                    loss = loss_fn(z0, z1)
            except NonFiniteError as err:  # the previous step's update blew the weights up
                raise DivergedError(f"{desc}: {err} at step {step}", step=step,
                                    loss=float("nan")) from None
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            point = {k: float(loss_fn.last_stats[k]) for k in STEP_KEYS}
            if not math.isfinite(point["loss"]):
                raise DivergedError(f"{desc}: non-finite loss at step {step}", step=step,
                                    loss=point["loss"])
            for k, v in {"step": len(history["step"]), **point}.items():
                history[k].append(v)
            if logger is not None:
                logger.log({f"train/{k}": v for k, v in point.items()}, len(history["step"]))
            bar.set_postfix(loss=f"{point['plain_loss']:.3f}", tau=f"{point['temperature']:.4f}")
            bar.update()
    bar.close()
    model.eval()
    return history


def embed(encoder: nn.Module, images: Tensor, batch_size: int = 512) -> Tensor:
    """Frozen-encoder features of ``images`` (eval mode, no gradient), in batches, on the CPU."""
    import torch

    encoder.eval()
    device = next(encoder.parameters()).device
    with torch.no_grad():
        features = torch.cat([encoder(images[i:i + batch_size].to(device)).float().cpu()
                              for i in range(0, len(images), batch_size)])
    trained_embeddings(features, "demo encoder features")
    return features


def knn_accuracy(train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, k: int) -> float:
    """Cosine kNN (majority vote over the ``k`` nearest training points) test accuracy."""
    from sklearn.neighbors import KNeighborsClassifier

    clf = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute")
    clf.fit(train_x.numpy(), train_y.numpy())
    return float((clf.predict(test_x.numpy()) == test_y.numpy()).mean())


def evaluate(features: Any, data: tuple[Tensor, ...], views: tuple[Tensor, Tensor],
             k: int) -> dict[str, float]:
    """kNN accuracy, alignment and uniformity of a feature map ``features(images) -> [N, D]``."""
    from adaptcl.plugins import alignment, uniformity

    x_train, y_train, x_test, y_test = data
    train_f, test_f = features(x_train), features(x_test)
    view0, view1 = features(views[0]), features(views[1])
    return {
        "knn_accuracy": knn_accuracy(train_f, y_train, test_f, y_test, k),
        "knn_accuracy_augmented": knn_accuracy(train_f, y_train, view0, y_test, k),
        "alignment": float(alignment(view0, view1)),
        "uniformity": float(uniformity(test_f)),
    }
