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

Usage::

    adaptcl demo --output-dir results/demo
    adaptcl demo --epochs 5 --batch-size 128 --seed 1 --output-dir /tmp/demo

    from adaptcl.recipes.demo import DemoConfig, run_demo
    result = run_demo(DemoConfig(epochs=30, output_dir="results/demo"))
    result["rows"]  # one dict per table row (loss, knn_accuracy, alignment, uniformity, ...)

Outputs in ``output_dir``: ``demo_results.json`` (atomic write, with the per-step history),
``demo_results.md`` (the table) and ``demo_training.png`` (temperature, alignment magnitude A
and the InfoNCE value over the training steps of both losses).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from adaptcl.plugins import InfoNCELoss, MACLLoss, alignment, uniformity
from adaptcl.recipes._common import (
    markdown_table,
    save_figure_atomic,
    seed_everything,
    write_json_atomic,
    write_text_atomic,
)

TABLE_COLUMNS = ("loss", "kNN acc", "alignment", "uniformity", "final temperature",
                 "kNN acc, augmented queries")
RESULT_FILE = "demo_results.json"
TABLE_FILE = "demo_results.md"
PLOT_FILE = "demo_training.png"
NUM_CLASSES = 10


@dataclass
class DemoConfig:
    """Configuration of the ``demo`` recipe (see the module docstring).

    Example:
        >>> config = DemoConfig(epochs=2, output_dir="/tmp/demo", progress=False)
    """

    epochs: int = 30
    batch_size: int = 256
    seed: int = 0
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
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "knn_k", "width", "feature_dim", "projection_dim"):
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
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")


# ----------------------------------------------------------------------------------- data


def load_digits_split(test_fraction: float, seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """scikit-learn's bundled digits as ``[N, 1, 8, 8]`` floats in [0, 1], stratified split."""
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


def augment(x: Tensor, generator: torch.Generator) -> Tensor:
    """One random SimCLR-style view of a batch of ``[B, 1, 8, 8]`` digits in [0, 1].

    Random affine warp (rotation <= 15 deg, zoom 0.85-1.15, shift <= 1 px), brightness and
    contrast jitter, Gaussian noise (sigma 0.1) and pixel dropout (p = 0.1), clamped to [0, 1].
    """
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


class DigitsEncoder(nn.Module):
    """A small CNN for 8x8 digits: three 3x3 conv blocks and a linear layer to ``feature_dim``."""

    def __init__(self, width: int = 32, feature_dim: int = 128) -> None:
        super().__init__()

        def block(c_in: int, c_out: int) -> list[nn.Module]:
            return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                    nn.ReLU(inplace=True)]

        self.features = nn.Sequential(
            *block(1, width), *block(width, 2 * width), nn.MaxPool2d(2),  # 8x8 -> 4x4
            *block(2 * width, 2 * width), nn.Flatten(),
            nn.Linear(2 * width * 16, feature_dim),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.features(x)


class SimCLRModel(nn.Module):
    """Encoder plus the SimCLR projection head (Linear-BN-ReLU-Linear); the loss sees the head."""

    def __init__(self, width: int, feature_dim: int, projection_dim: int) -> None:
        super().__init__()
        self.encoder = DigitsEncoder(width, feature_dim)
        self.head = nn.Sequential(
            nn.Linear(feature_dim, feature_dim, bias=False), nn.BatchNorm1d(feature_dim),
            nn.ReLU(inplace=True), nn.Linear(feature_dim, projection_dim),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(x))


def build_model(config: DemoConfig) -> SimCLRModel:
    """The model both losses start from: seeded, so every call returns the same weights."""
    seed_everything(config.seed)
    return SimCLRModel(config.width, config.feature_dim, config.projection_dim)


def build_losses(config: DemoConfig) -> dict[str, tuple[str, nn.Module]]:
    """key -> (table name, loss module) of the two losses compared."""
    return {
        "nt_xent": (f"NT-Xent (tau={config.temperature:g})", InfoNCELoss(config.temperature)),
        "macl": (f"MACL (tau0={config.temperature:g}, alpha={config.macl_alpha:g}, "
                 f"A0={config.macl_a0:g})",
                 MACLLoss(config.temperature, config.macl_alpha, config.macl_a0, reweight=True)),
    }


# ------------------------------------------------------------------------------- training


def train(model: SimCLRModel, loss_fn: nn.Module, images: Tensor, config: DemoConfig,
          desc: str) -> dict[str, list[float]]:
    """SimCLR training; returns the per-step history of the loss's ``last_stats``.

    The batch order and the augmentations come from generators seeded with ``config.seed`` so
    that every loss sees exactly the same views in the same order.
    """
    from tqdm.auto import tqdm

    order_gen = torch.Generator().manual_seed(config.seed)
    aug_gen = torch.Generator().manual_seed(config.seed + 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr,
                                 weight_decay=config.weight_decay)
    n = images.shape[0]
    # drop the last incomplete batch (as SimCLR loaders do) unless it is the only one
    steps_per_epoch = max(1, n // config.batch_size)
    total = steps_per_epoch * config.epochs
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
    keys = ("loss", "plain_loss", "alignment", "temperature", "mean_w", "positive_probability")
    history: dict[str, list[float]] = {"step": [], **{k: [] for k in keys}}
    model.train()
    with tqdm(total=total, desc=desc, unit="step", disable=not config.progress,
              leave=False) as bar:
        for _ in range(config.epochs):
            perm = torch.randperm(n, generator=order_gen)
            for s in range(steps_per_epoch):
                batch = images[perm[s * config.batch_size:(s + 1) * config.batch_size]]
                views = torch.cat([augment(batch, aug_gen), augment(batch, aug_gen)])
                z0, z1 = model(views).chunk(2)
                loss = loss_fn(z0, z1)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step()
                stats = loss_fn.last_stats
                history["step"].append(len(history["step"]))
                for k in keys:
                    history[k].append(float(stats[k]))
                bar.set_postfix(loss=f"{history['plain_loss'][-1]:.3f}",
                                tau=f"{history['temperature'][-1]:.4f}")
                bar.update()
    model.eval()
    return history


# ----------------------------------------------------------------------------- evaluation


@torch.no_grad()
def embed(encoder: nn.Module, images: Tensor, batch_size: int = 512) -> Tensor:
    """Frozen-encoder features of ``images`` (eval mode), in batches."""
    encoder.eval()
    return torch.cat([encoder(images[i:i + batch_size]) for i in range(0, len(images), batch_size)])


def knn_accuracy(train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, k: int) -> float:
    """Cosine kNN (majority vote over the ``k`` nearest training points) test accuracy."""
    from sklearn.neighbors import KNeighborsClassifier

    clf = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute")
    clf.fit(train_x.numpy(), train_y.numpy())
    return float((clf.predict(test_x.numpy()) == test_y.numpy()).mean())


def evaluate(features: Any, data: tuple[Tensor, Tensor, Tensor, Tensor],
             views: tuple[Tensor, Tensor], k: int) -> dict[str, float]:
    """kNN accuracy, alignment and uniformity of a feature map ``features(images) -> [N, D]``."""
    x_train, y_train, x_test, y_test = data
    train_f, test_f = features(x_train), features(x_test)
    view0, view1 = features(views[0]), features(views[1])
    return {
        "knn_accuracy": knn_accuracy(train_f, y_train, test_f, y_test, k),
        "knn_accuracy_augmented": knn_accuracy(train_f, y_train, view0, y_test, k),
        "alignment": float(alignment(view0, view1)),
        "uniformity": float(uniformity(test_f)),
    }


# ----------------------------------------------------------------------------------- plot


def plot_history(histories: dict[str, dict[str, list[float]]], names: dict[str, str],
                 path: Path, min_temperature: float) -> Path:
    """Temperature, alignment magnitude A and InfoNCE over steps for every loss; PNG, atomic."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
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
    axes[0].legend(fontsize=8)
    fig.suptitle("adaptcl demo: NT-Xent vs MACL on sklearn digits (same seed, same views)",
                 fontsize=11)
    fig.tight_layout()
    save_figure_atomic(fig, path)
    return path


# ------------------------------------------------------------------------------------ run


def run_demo(config: DemoConfig) -> dict[str, Any]:
    """Train with NT-Xent and MACL, evaluate, write JSON / markdown / PNG; return the result.

    Example:
        >>> result = run_demo(DemoConfig(epochs=2, output_dir="/tmp/demo", progress=False))
        >>> [row["key"] for row in result["rows"]]
        ['raw_pixels', 'random_encoder', 'nt_xent', 'macl']
    """
    start = time.perf_counter()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        result = _run(config)
    finally:
        torch.set_num_threads(previous_threads)
    result["wall_clock_seconds"] = time.perf_counter() - start
    out = Path(config.output_dir)
    write_json_atomic(out / RESULT_FILE, result)
    return result


def _run(config: DemoConfig) -> dict[str, Any]:
    out = Path(config.output_dir)
    data = load_digits_split(config.test_fraction, config.seed)
    x_train, _, x_test, _ = data
    # two fixed augmented views of every test image, for the alignment metric
    eval_gen = torch.Generator().manual_seed(config.seed + 2)
    views = (augment(x_test, eval_gen), augment(x_test, eval_gen))

    rows: list[dict[str, Any]] = []
    pixels = evaluate(lambda x: x.flatten(1), data, views, config.knn_k)
    rows.append({"key": "raw_pixels", "loss": "raw pixels (no training)", **pixels,
                 "final_temperature": None})
    untrained = build_model(config)
    rows.append({"key": "random_encoder", "loss": "random-init encoder (no training)",
                 **evaluate(lambda x: embed(untrained.encoder, x), data, views, config.knn_k),
                 "final_temperature": None})

    histories: dict[str, dict[str, list[float]]] = {}
    names: dict[str, str] = {}
    min_temperature = None
    for key, (name, loss_fn) in build_losses(config).items():
        model = build_model(config)
        t0 = time.perf_counter()
        histories[key] = train(model, loss_fn, x_train, config, desc=key)
        train_seconds = time.perf_counter() - t0
        metrics = evaluate(lambda x, m=model: embed(m.encoder, x), data, views, config.knn_k)
        rows.append({"key": key, "loss": name, **metrics,
                     "final_temperature": histories[key]["temperature"][-1],
                     "train_seconds": train_seconds})
        names[key] = name
        if isinstance(loss_fn, MACLLoss):
            min_temperature = loss_fn.min_temperature

    by_key = {row["key"]: row for row in rows}
    macl_temps = histories["macl"]["temperature"]
    result: dict[str, Any] = {
        "recipe": "demo",
        "config": asdict(config),
        "data": {"source": "sklearn.datasets.load_digits", "n_train": int(x_train.shape[0]),
                 "n_test": int(x_test.shape[0]), "classes": NUM_CLASSES, "image_shape": [8, 8]},
        "evaluation": {"features": f"encoder output ({config.feature_dim}-d, before the head)",
                       "knn": f"cosine, k={config.knn_k}, majority vote",
                       "alignment": "Wang & Isola, alpha=2, two augmented views of each test image",
                       "uniformity": "Wang & Isola, t=2, clean test images"},
        "chance_accuracy": 1.0 / NUM_CLASSES,
        "rows": rows,
        "history": histories,
        "macl_min_temperature": min_temperature,
        "macl_temperature_range": [min(macl_temps), max(macl_temps)],
        "macl_minus_ntxent_knn": by_key["macl"]["knn_accuracy"] - by_key["nt_xent"]["knn_accuracy"],
        "files": {"json": str(out / RESULT_FILE), "table": str(out / TABLE_FILE),
                  "plot": str(out / PLOT_FILE)},
    }
    plot_history(histories, names, out / PLOT_FILE, min_temperature)
    write_text_atomic(out / TABLE_FILE, render_markdown(result))
    return result


def render_markdown(result: dict[str, Any]) -> str:
    """The demo's table (loss | kNN acc | alignment | uniformity | final temperature | kNN acc
    on augmented queries) and a one-line verdict on MACL vs NT-Xent."""
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
    data = result["data"]
    lo, hi = result["macl_temperature_range"]
    diff = 100 * result["macl_minus_ntxent_knn"]
    verdict = ("MACL beats NT-Xent" if diff > 0 else
               "MACL ties NT-Xent" if diff == 0 else "MACL does not beat NT-Xent")
    config = result["config"]
    return (
        f"adaptcl demo: sklearn digits ({data['n_train']} train / {data['n_test']} test), "
        f"{config['epochs']} epochs, batch {config['batch_size']}, seed {config['seed']}\n\n"
        + markdown_table(table_rows, TABLE_COLUMNS)
        + f"\nkNN: {result['evaluation']['knn']} on the {result['evaluation']['features']}; "
        f"chance is {100 * result['chance_accuracy']:.0f}%. "
        f"{verdict} on kNN accuracy here ({diff:+.1f} points, one seed). "
        f"MACL's temperature ranged over [{lo:.4f}, {hi:.4f}] "
        f"(floor {result['macl_min_temperature']:g}).\n"
    )


# ------------------------------------------------------------------------------------ CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = DemoConfig()
    parser.add_argument("--epochs", type=int, default=defaults.epochs,
                        help=f"training epochs per loss (default {defaults.epochs})")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size,
                        help=f"pairs per step (default {defaults.batch_size})")
    parser.add_argument("--seed", type=int, default=defaults.seed,
                        help="seed of the split, the weights, the batch order and the views")
    parser.add_argument("--output-dir", default=defaults.output_dir,
                        help=f"where the JSON, table and PNG go (default {defaults.output_dir})")
    parser.add_argument("--lr", type=float, default=defaults.lr, help="Adam learning rate")
    parser.add_argument("--threads", type=int, default=defaults.threads,
                        help=f"torch intra-op threads (default {defaults.threads}: the model is tiny)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def main(args: argparse.Namespace) -> int:
    config = DemoConfig(epochs=args.epochs, batch_size=args.batch_size, seed=args.seed,
                        output_dir=args.output_dir, lr=args.lr, threads=args.threads,
                        progress=not args.no_progress)
    result = run_demo(config)
    print(render_markdown(result))
    print(f"wrote {result['files']['json']}, {result['files']['table']} and "
          f"{result['files']['plot']} ({result['wall_clock_seconds']:.1f} s)")
    return 0
