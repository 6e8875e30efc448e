"""``adaptcl demo``: a short real run comparing NT-Xent and MACL on scikit-learn's digits.

The data ships with scikit-learn (``sklearn.datasets.load_digits``: 1797 grey 8x8 images of
the digits 0-9, no download). A stratified 75/25 split gives 1347 training and 450 test
images. The same small CNN encoder with an MLP projection head is trained SimCLR-style from
the same seed, on the same augmented views in the same order, once with NT-Xent
(:class:`~adaptcl.plugins.InfoNCELoss`, tau = 0.1) and once with MACL
(:class:`~adaptcl.plugins.MACLLoss`, the vision setting tau0 = 0.1, alpha = 0.5, A0 = 0,
reweighting on), both in Lightly's symmetric NT-Xent form (2N - 2 negatives per anchor).

Each view is a random affine warp (rotation up to 15 degrees, zoom 0.85-1.15, shift up to one
pixel), a brightness/contrast jitter, Gaussian noise and random pixel dropout. After training,
the frozen encoder (the 128-d features before the projection head) is evaluated on the test
images:

* kNN accuracy: cosine kNN (k = 15, majority vote) with the training images as the memory;
  also with one augmented view of each test image as the query ("augmented queries"), which
  shows the invariance the contrastive training bought;
* alignment (Wang & Isola: mean squared distance of two augmented views of each test image,
  lower is better) and uniformity (log mean Gaussian potential, t = 2, lower is better) on the
  L2-normalised features, with :func:`adaptcl.plugins.alignment` / ``uniformity``;
* the final temperature (MACL's last adaptive tau; NT-Xent's fixed tau).

Two reference rows use no training: raw pixels (64-d vectors, the same cosine kNN) and the
randomly initialised encoder. On clean, centred 8x8 digits plain kNN is nearly saturated
(raw pixels already reach about 97%), so the clean kNN column cannot show much; the
augmented-query column, alignment and uniformity show what the training itself added.

Several ``--seeds`` give mean +- std over seeds and the paired difference MACL - NT-Xent with a
95% t-interval; each (loss, seed) is stored by :mod:`adaptcl.recipes.template.store` and reused while
its identity (settings, data fingerprint, code) matches. ``--device``, ``--precision`` and
``--logger`` work as in every recipe.

Usage::

    adaptcl demo --output-dir results/demo
    adaptcl demo --epochs 5 --batch-size 128 --seeds 0 1 2 --output-dir /tmp/demo

    from adaptcl.recipes.demo import DemoConfig, run_demo
    result = run_demo(DemoConfig(epochs=30, output_dir="results/demo"))
    result["rows"]  # one dict per table row (loss, knn_accuracy, alignment, uniformity, ...)

Outputs in ``output_dir``: ``demo_results.json`` (atomic write, with the per-step history),
``demo_results.md`` (the table) and ``demo_training.png`` (temperature, alignment magnitude A
and the InfoNCE value over the training steps of both losses).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaptcl.recipes.template.config import result_settings
from adaptcl.recipes.template.errors import NonResultError, check_embeddings, user_errors
from adaptcl.recipes.template.files import markdown_table
from adaptcl.recipes.template.loggers import LOGGERS, metric_logger
from adaptcl.recipes.template.options import (
    add_common_arguments,
    add_config_arguments,
    config_kwargs,
)
from adaptcl.recipes.template.plots import save_plot
from adaptcl.recipes.template.progress import progress
from adaptcl.recipes.template.provenance import code_version, environment
from adaptcl.recipes.template.report import format_difference, summarize, write_results
from adaptcl.recipes.template.store import Cell, GridRun, run_grid
from adaptcl.recipes.template.torch_env import (
    apply_thread_policy,
    autocast,
    check_precision,
    grad_scaler,
    resolve_device,
    seed_everything,
)

if TYPE_CHECKING:  # torch is imported where it is used, so ``adaptcl demo --help`` is instant
    import torch
    from torch import Tensor, nn

EXAMPLE = """adaptcl demo --output-dir results/demo
adaptcl demo --epochs 5 --seeds 0 1 2 --logger tensorboard --output-dir /tmp/demo"""
TABLE_COLUMNS = ("loss", "kNN acc", "alignment", "uniformity", "final temperature",
                 "kNN acc, augmented queries")
RESULT_FILE = "demo_results.json"
TABLE_FILE = "demo_results.md"
PLOT_FILE = "demo_training.png"
NUM_CLASSES = 10
LOSSES = ("nt_xent", "macl")
CODE = ("adaptcl.recipes.demo", "adaptcl.plugins")


@dataclass
class DemoConfig:
    """Configuration of the ``demo`` recipe (see the module docstring).

    Example:
        >>> config = DemoConfig(epochs=2, output_dir="/tmp/demo", progress=False)
    """

    epochs: int = 30
    batch_size: int = 256
    seeds: list[int] = field(default_factory=lambda: [0])
    output_dir: str = "results/demo"
    lr: float = 2e-3
    weight_decay: float = 1e-5
    temperature: float = 0.1  # tau (NT-Xent) and tau0 (MACL)
    macl_alpha: float = 0.5
    macl_a0: float = 0.0
    test_fraction: float = 0.25
    knn_k: int = 15
    width: int = 16  # channels of the first conv layer
    feature_dim: int = 128  # encoder output, the representation that is evaluated
    projection_dim: int = 64
    # torch intra-op threads. The model is tiny (about 0.3 GFLOP per step), so one thread beats
    # two: OpenMP's per-op synchronisation costs more than it saves, badly so on a busy machine.
    threads: int = 1
    device: str = "auto"
    precision: str = "32"
    logger: str = "none"
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "knn_k", "width", "feature_dim", "projection_dim",
                     "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.batch_size < 2:
            raise ValueError("batch_size must be >= 2: contrastive losses need negatives")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {self.test_fraction}")
        for name in ("lr", "temperature"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.seeds:
            raise ValueError("seeds must hold at least one seed")
        check_precision(self.precision)
        if self.logger not in LOGGERS:
            raise ValueError(f"logger must be one of {LOGGERS}, got {self.logger!r}")


# ----------------------------------------------------------------------------------- data


def load_digits_split(test_fraction: float, seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """scikit-learn's bundled digits as ``[N, 1, 8, 8]`` floats in [0, 1], stratified split."""
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = torch.as_tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.as_tensor(digits.target, dtype=torch.long)
    idx_train, idx_test = train_test_split(
        torch.arange(len(labels)).numpy(), test_size=test_fraction, random_state=seed,
        stratify=labels.numpy(),
    )
    idx_train, idx_test = torch.as_tensor(idx_train), torch.as_tensor(idx_test)
    return images[idx_train], labels[idx_train], images[idx_test], labels[idx_test]


def digits_fingerprint() -> dict[str, Any]:
    """SHA-256 of the bundled digits (the data a stored run was computed on)."""
    import hashlib

    from sklearn.datasets import load_digits

    digits = load_digits()
    digest = hashlib.sha256(digits.images.tobytes() + digits.target.tobytes())
    return {"sha256": digest.hexdigest(), "images": int(len(digits.target))}


def augment(x: Tensor, generator: torch.Generator) -> Tensor:
    """One random SimCLR-style view of a batch of ``[B, 1, 8, 8]`` digits in [0, 1].

    Random affine warp (rotation <= 15 deg, zoom 0.85-1.15, shift <= 1 px), brightness and
    contrast jitter, Gaussian noise (sigma 0.1) and pixel dropout (p = 0.1), clamped to [0, 1].
    """
    import torch
    import torch.nn.functional as F

    b = x.shape[0]

    def uniform(*shape: int) -> Tensor:
        return torch.rand(*shape, generator=generator) * 2 - 1  # U(-1, 1)

    angle = uniform(b) * math.radians(15)
    zoom = 1 + 0.15 * uniform(b)
    shift = uniform(b, 2) * (2 / x.shape[-1])  # one pixel in normalised [-1, 1] coordinates
    cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1),
                         torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    contrast = 1 + 0.3 * uniform(b, 1, 1, 1)
    brightness = 0.1 * uniform(b, 1, 1, 1)
    out = out * contrast + brightness
    out = out + 0.1 * torch.randn(out.shape, generator=generator)
    keep = torch.rand(out.shape, generator=generator) >= 0.1
    return (out * keep).clamp(0.0, 1.0)


# ---------------------------------------------------------------------------------- model


def build_model(config: DemoConfig, seed: int) -> nn.ModuleDict:
    """``encoder`` (three 3x3 conv blocks and a linear layer to ``feature_dim``) and the SimCLR
    ``head`` (Linear-BN-ReLU-Linear; the loss sees its output); seeded, so both losses start
    from the same weights."""
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


def build_losses(config: DemoConfig) -> dict[str, tuple[str, nn.Module]]:
    """key -> (table name, loss module) of the two losses compared."""
    from adaptcl.plugins import InfoNCELoss, MACLLoss

    return {
        "nt_xent": (f"NT-Xent (tau={config.temperature:g})", InfoNCELoss(config.temperature)),
        "macl": (f"MACL (tau0={config.temperature:g}, alpha={config.macl_alpha:g}, "
                 f"A0={config.macl_a0:g})",
                 MACLLoss(config.temperature, config.macl_alpha, config.macl_a0, reweight=True)),
    }


# ------------------------------------------------------------------------------- training


def train(model: nn.ModuleDict, loss_fn: nn.Module, images: Tensor, config: DemoConfig,
          seed: int, logger: Any = None, desc: str = "") -> dict[str, list[float]]:
    """SimCLR training; returns the per-step history of the loss's ``last_stats``.

    The batch order and the augmentations come from generators seeded with ``seed`` so that
    every loss sees exactly the same views in the same order.
    """
    import torch

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
    keys = ("loss", "plain_loss", "alignment", "temperature", "mean_w", "positive_probability")
    history: dict[str, list[float]] = {"step": [], **{k: [] for k in keys}}
    model.train()
    bar = progress(total=total, desc=desc, enabled=config.progress)
    for _ in range(config.epochs):
        perm = torch.randperm(n, generator=order_gen)
        for s in range(steps_per_epoch):
            batch = images[perm[s * config.batch_size:(s + 1) * config.batch_size]]
            views = torch.cat([augment(batch, aug_gen), augment(batch, aug_gen)]).to(device)
            with autocast(device, config.precision):
                z0, z1 = model.head(model.encoder(views)).chunk(2)
                loss = loss_fn(z0, z1)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            point = {k: float(loss_fn.last_stats[k]) for k in keys}
            if not math.isfinite(point["loss"]):
                raise NonResultError(f"{desc}: non-finite loss at step {len(history['step'])}")
            history["step"].append(len(history["step"]))
            for k in keys:
                history[k].append(point[k])
            if logger is not None:
                logger.log({f"train/{k}": v for k, v in point.items()}, len(history["step"]))
            bar.set_postfix(loss=f"{point['plain_loss']:.3f}", tau=f"{point['temperature']:.4f}")
            bar.update()
    bar.close()
    model.eval()
    return history


# ----------------------------------------------------------------------------- evaluation


def embed(encoder: nn.Module, images: Tensor, batch_size: int = 512) -> Tensor:
    """Frozen-encoder features of ``images`` (eval mode, no gradient), in batches, on the CPU."""
    import torch

    encoder.eval()
    device = next(encoder.parameters()).device
    with torch.no_grad():
        features = torch.cat([encoder(images[i:i + batch_size].to(device)).float().cpu()
                              for i in range(0, len(images), batch_size)])
    check_embeddings(features, "demo encoder features")
    return features


def knn_accuracy(train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, k: int) -> float:
    """Cosine kNN (majority vote over the ``k`` nearest training points) test accuracy."""
    from sklearn.neighbors import KNeighborsClassifier

    clf = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute")
    clf.fit(train_x.numpy(), train_y.numpy())
    return float((clf.predict(test_x.numpy()) == test_y.numpy()).mean())


def evaluate(features: Any, data: tuple[Tensor, Tensor, Tensor, Tensor],
             views: tuple[Tensor, Tensor], k: int) -> dict[str, float]:
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


def _data_and_views(config: DemoConfig, seed: int):
    import torch

    data = load_digits_split(config.test_fraction, seed)
    # two fixed augmented views of every test image, for the alignment metric
    eval_gen = torch.Generator().manual_seed(seed + 2)
    return data, (augment(data[2], eval_gen), augment(data[2], eval_gen))


# ------------------------------------------------------------------------------------ run


def run_demo(config: DemoConfig) -> dict[str, Any]:
    """Train with NT-Xent and MACL for every seed, evaluate, write JSON / markdown / PNG.

    Example:
        >>> result = run_demo(DemoConfig(epochs=2, output_dir="/tmp/demo", progress=False))
        >>> [row["key"] for row in result["rows"]]
        ['raw_pixels', 'random_encoder', 'nt_xent', 'macl']
    """
    import torch

    start = time.perf_counter()
    with user_errors():
        device = resolve_device(config.device)
    previous_threads = torch.get_num_threads()
    apply_thread_policy(config.threads)
    out = Path(config.output_dir)
    losses = build_losses(config)
    ident = {"settings": result_settings(dataclasses.replace(config, device=device)),
             "data": digits_fingerprint(), "code": code_version(*CODE)}

    def compute(cell: Cell) -> dict[str, Any]:
        data, views = _data_and_views(config, cell.seed)
        model = build_model(config, cell.seed)
        log_dir = out / "logs" / cell.method / f"seed{cell.seed}"
        t0 = time.perf_counter()
        with metric_logger(config.logger, log_dir) as logger:
            history = train(model, losses[cell.method][1], data[0], config, cell.seed, logger,
                            desc=cell.label())
        seconds = time.perf_counter() - t0
        metrics = evaluate(lambda x: embed(model.encoder, x), data, views, config.knn_k)
        return {"metrics": metrics, "optimisation_steps": len(history["step"]),
                "losses": history["loss"], "history": history, "train_seconds": seconds,
                "final_temperature": history["temperature"][-1]}

    try:
        grid = run_grid("demo", out, [Cell("digits", m, s) for s in config.seeds
                                             for m in LOSSES],
                               identity=lambda cell: ident, compute=compute,
                               progress_bar=config.progress)
        result = _result(config, grid, losses, device)
    finally:
        torch.set_num_threads(previous_threads)
    result["wall_clock_seconds"] = time.perf_counter() - start
    result["files"] = write_results(out, RESULT_FILE[:-5], result, render_markdown(result))
    min_temperature = losses["macl"][1].min_temperature
    result["files"]["plot"] = save_plot(
        out / PLOT_FILE, lambda axes: _draw(result["history"], result["names"], min_temperature,
                                            axes), ncols=3, figsize=(13, 3.6),
        title="adaptcl demo: NT-Xent vs MACL on sklearn digits (same seed, same views)")
    return result


def _result(config: DemoConfig, grid: GridRun, losses: dict, device: str) -> dict[str, Any]:
    seed = config.seeds[0]
    data, views = _data_and_views(config, seed)
    untrained = build_model(config, seed)
    rows = [{"key": "raw_pixels", "loss": "raw pixels (no training)", "final_temperature": None,
             **evaluate(lambda x: x.flatten(1), data, views, config.knn_k)},
            {"key": "random_encoder", "loss": "random-init encoder (no training)",
             "final_temperature": None,
             **evaluate(lambda x: embed(untrained.encoder, x), data, views, config.knn_k)}]
    for key, (name, _) in losses.items():  # each metric's mean over seeds
        records = [grid.records[Cell("digits", key, s)] for s in config.seeds]
        row = {m: sum(r["metrics"][m] for r in records) / len(records)
               for m in records[0]["metrics"]}
        rows.append({"key": key, "loss": name, **row, "n_seeds": len(records),
                     "final_temperature": records[0]["final_temperature"],
                     "train_seconds": sum(r["train_seconds"] for r in records)})
    summary = summarize(grid.records, "knn_accuracy", datasets=["digits"],
                               methods=list(losses), baseline="nt_xent", scale=100.0)
    history = {key: grid.records[Cell("digits", key, seed)]["history"] for key in losses}
    macl_temps = history["macl"]["temperature"]
    by_key = {row["key"]: row for row in rows}
    return {
        "recipe": "demo", "config": asdict(config),
        "environment": environment(device=device, data_fingerprint=digits_fingerprint(),
                                          frameworks=["scikit-learn"]),
        **grid.bookkeeping(),
        "data": {"source": "sklearn.datasets.load_digits", "n_train": int(data[0].shape[0]),
                 "n_test": int(data[2].shape[0]), "classes": NUM_CLASSES, "image_shape": [8, 8]},
        "evaluation": {"features": f"encoder output ({config.feature_dim}-d, before the head)",
                       "knn": f"cosine, k={config.knn_k}, majority vote",
                       "alignment": "Wang & Isola, alpha=2, two augmented views of each test image",
                       "uniformity": "Wang & Isola, t=2, clean test images"},
        "chance_accuracy": 1.0 / NUM_CLASSES, "rows": rows, "summary": summary,
        "history": history, "names": {key: name for key, (name, _) in losses.items()},
        "macl_min_temperature": losses["macl"][1].min_temperature,
        "macl_temperature_range": [min(macl_temps), max(macl_temps)],
        "macl_minus_ntxent_knn": by_key["macl"]["knn_accuracy"] - by_key["nt_xent"]["knn_accuracy"],
    }


def render_markdown(result: dict[str, Any]) -> str:
    """The demo's table (loss | kNN acc | alignment | uniformity | final temperature | kNN acc
    on augmented queries), the paired difference over seeds and a one-line verdict."""
    table_rows = []
    for row in result["rows"]:
        tau = row["final_temperature"]
        table_rows.append({
            "loss": row["loss"],
            "kNN acc": f"{100 * row['knn_accuracy']:.1f}%",
            "alignment": f"{row['alignment']:.3f}",
            "uniformity": f"{row['uniformity']:.3f}",
            "final temperature": "-" if tau is None else f"{tau:.4f}",
            "kNN acc, augmented queries": f"{100 * row['knn_accuracy_augmented']:.1f}%",
        })
    data, config = result["data"], result["config"]
    lo, hi = result["macl_temperature_range"]
    diff = result["summary"]["digits"]["paired"]["macl"]
    verdict = ("MACL beats NT-Xent" if diff["mean"] > 0 else
               "MACL ties NT-Xent" if diff["mean"] == 0 else "MACL does not beat NT-Xent")
    return (
        f"adaptcl demo: sklearn digits ({data['n_train']} train / {data['n_test']} test), "
        f"{config['epochs']} epochs, batch {config['batch_size']}, seeds {config['seeds']}\n\n"
        + markdown_table(table_rows, TABLE_COLUMNS)
        + f"\nkNN: {result['evaluation']['knn']} on the {result['evaluation']['features']}; "
        f"chance is {100 * result['chance_accuracy']:.0f}%; trained rows average the seeds. "
        f"{verdict} on kNN accuracy here: MACL − NT-Xent = {format_difference(diff)} "
        f"points (paired over seeds, 95% t-interval). MACL's temperature ranged over "
        f"[{lo:.4f}, {hi:.4f}] (floor {result['macl_min_temperature']:g}).\n"
    )


def _draw(histories: dict, names: dict, min_temperature: float, axes) -> None:
    """Temperature, alignment magnitude A and InfoNCE over steps for every loss."""
    panels = (("temperature", "temperature tau"),
              ("alignment", "alignment magnitude A (mean positive cosine)"),
              ("plain_loss", "InfoNCE value (unweighted)"))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for loss_key, hist in histories.items():
            ax.plot(hist["step"], hist[key], label=names[loss_key], linewidth=1.4)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0].axhline(min_temperature, color="grey", linestyle=":", linewidth=1,
                    label=f"MACL floor {min_temperature:g}")


# ------------------------------------------------------------------------------------ CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, output_dir=DemoConfig.output_dir, seeds=[0],
                                data_root=False)
    add_config_arguments(parser, DemoConfig, helps={
        "epochs": "training epochs per loss", "batch_size": "pairs per step",
        "lr": "Adam learning rate", "temperature": "tau (NT-Xent) and tau0 (MACL)"})


def main(args: argparse.Namespace) -> int:
    with user_errors():
        config = DemoConfig(**config_kwargs(DemoConfig, args))
    result = run_demo(config)
    print(render_markdown(result))
    print(f"wrote {result['files']['json']}, {result['files']['markdown']} and "
          f"{result['files']['plot']} ({result['wall_clock_seconds']:.1f} s)")
    return 0
