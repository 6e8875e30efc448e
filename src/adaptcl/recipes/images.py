"""``adaptcl images``: self-supervised pre-training on images via Lightly, kNN and linear probe.

Pre-trains SimCLR, MoCo v2, SimSiam, Barlow Twins or ASCL-MoCo (Lightning modules of
:mod:`adaptcl.adapters.lightning_modules`) with one or more losses on CIFAR-10 (torchvision's
files, or the ``.npz`` arrays of the shared data folder) or an image folder, then evaluates the
frozen backbone with a kNN classifier (Lightly's ``knn_predict``, k=200, t=0.1) and a linear
probe. Writes, under ``--output-dir``:

- ``images_<method>_<preset>.json`` (atomically): configuration, data, one record per
  (loss, seed) with accuracies, the per-step adaptive temperature / alignment and the per-epoch
  online kNN accuracy;
- ``images_<method>_<preset>.md``: the markdown table;
- ``images_<method>_<preset>_temperature.png``: temperature and alignment over training;
- ``runs/<method>_<loss>_seed<seed>_<config hash>/``: per (loss, seed) Lightning's
  ``last.ckpt`` (written every epoch, atomically) and, once evaluated, ``record.json``.

Runs resume: killing the recipe and starting it again with the same configuration skips every
(loss, seed) whose ``record.json`` exists, continues an unfinished one from its ``last.ckpt``
(weights, optimiser, scheduler, loss statistics so far and MoCo/ASCL queues) and writes the
final JSON, markdown and PNG (each atomically) only when every run is done. The config hash
covers every setting that changes training, so a changed configuration starts afresh. Not
restored: the data order and augmentation random state of the interrupted epoch.

Two presets, chosen with ``--preset``:

``cpu`` (default) minutes on a laptop CPU: CIFAR ResNet-18 at width 1/8 (64-d features), the
    4,000 exact-pixel training images, 15 epochs, batch 128, Adam 1e-3; kNN on 1,000 test images.
``paper`` MACL App. B.3 for a GPU: CIFAR ResNet-18 (3x3 first conv, no max-pool), the whole
    training set, 200 epochs, batch 512, Adam 1e-3 x batch/256 (weight decay 1e-6), temperature
    0.1, alpha 0.5, A0 0; linear probe 100 epochs, batch 128, SGD lr 0.02, momentum 0.9.

Every field of a preset can be overridden by its flag. Nothing is downloaded unless
``--download`` is given and no local data is found.

Examples:
    adaptcl images --data-root ../shared/data --losses nt_xent,macl
    adaptcl images --data-root ~/data/cifar10 --preset paper --devices 4 --strategy ddp
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptcl.recipes._common import (
    markdown_table,
    mean_std,
    read_json,
    resolve_data_root,
    save_figure_atomic,
    seed_everything,
    write_json_atomic,
    write_text_atomic,
)

METHODS = ("simclr", "moco", "simsiam", "barlowtwins", "ascl-moco")
#: losses each method accepts (first = the method's own baseline)
METHOD_LOSSES = {
    "simclr": ("nt_xent", "macl", "dcl", "flatnce", "dual", "amcl"),
    "moco": ("nt_xent", "macl", "dcl", "ascl", "amcl"),
    "simsiam": ("negcos", "amcl"),
    "barlowtwins": ("barlow", "amcl"),
    "ascl-moco": ("ascl", "ahcl", "hard", "moco"),
}

PRESETS: dict[str, dict[str, Any]] = {
    "cpu": dict(backbone="resnet-18", width=0.125, epochs=15, batch_size=128, lr=1e-3,
                optimizer="adam", weight_decay=1e-6, train_limit=4000, test_limit=1000,
                npz_variant="auto", hidden_dim=512, output_dim=128, queue_size=1024,
                linear_epochs=100, linear_batch_size=128, linear_lr=0.02, knn_every=5),
    "paper": dict(backbone="resnet-18", width=1.0, epochs=200, batch_size=512, lr=2e-3,
                  optimizer="adam", weight_decay=1e-6, train_limit=None, test_limit=None,
                  npz_variant="jpeg", hidden_dim=512, output_dim=128, queue_size=4096,
                  linear_epochs=100, linear_batch_size=128, linear_lr=0.02, knn_every=10),
}


@dataclass
class ImagesConfig:
    """Configuration of :func:`run_images`; ``None`` fields take the preset's value."""

    data_root: str | None = None
    output_dir: str = "results/images"
    preset: str = "cpu"
    method: str = "simclr"
    losses: tuple[str, ...] = ("nt_xent", "macl")
    seeds: tuple[int, ...] = (0,)
    source: str = "auto"
    npz_variant: str | None = None
    train_limit: int | None = None
    test_limit: int | None = None
    full_data: bool = False
    download: bool = False
    input_size: int = 32
    backbone: str | None = None
    width: float | None = None
    hidden_dim: int | None = None
    output_dim: int | None = None
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    optimizer: str | None = None
    weight_decay: float | None = None
    temperature: float | None = None
    macl_temperature: float | None = None
    alpha: float = 0.5
    a0: float | None = None
    num_heads: int = 2
    beta: float = 1e-3
    kappa: int = 1
    queue_size: int | None = None
    num_neighbors: int = 1
    sharpen_temperature: float = 0.05
    knn_k: int = 200
    knn_t: float = 0.1
    knn_every: int | None = None
    linear_epochs: int | None = None
    linear_batch_size: int | None = None
    linear_lr: float | None = None
    num_workers: int = 0
    accelerator: str = "auto"
    devices: int | str = 1
    strategy: str = "auto"
    precision: str | None = None
    num_threads: int | None = None
    progress: bool = True

    def resolved(self) -> ImagesConfig:
        """A copy with the preset's values filled in and everything validated."""
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {self.preset!r}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        out = dataclasses.replace(self)
        for key, value in PRESETS[self.preset].items():
            if getattr(out, key) is None and not (self.full_data and key in ("train_limit",
                                                                             "test_limit")):
                setattr(out, key, value)
        if self.full_data:
            out.train_limit = out.test_limit = None
            if self.npz_variant is None:
                out.npz_variant = "jpeg"
        if out.temperature is None:
            out.temperature = 0.2 if out.method == "moco" else 0.1
        if out.macl_temperature is None:  # MACL App. B.2.1: tau0 0.15 for MoCo v2
            out.macl_temperature = (0.15 if out.method == "moco" and self.temperature is None
                                    else out.temperature)
        if out.a0 is None:
            out.a0 = 0.2 if out.method == "moco" else 0.0
        out.losses = tuple(out.losses)
        if not out.losses:
            raise ValueError("losses must name at least one loss")
        allowed = METHOD_LOSSES[out.method]
        for loss in out.losses:
            if loss not in allowed:
                raise ValueError(f"loss {loss!r} does not apply to {out.method}; choose from {allowed}")
        if not out.seeds:
            raise ValueError("seeds must hold at least one seed")
        for name in ("epochs", "batch_size", "hidden_dim", "output_dim", "linear_batch_size",
                     "num_heads", "queue_size", "knn_k", "input_size"):
            value = getattr(out, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name in ("lr", "temperature", "macl_temperature", "knn_t", "linear_lr", "width",
                     "sharpen_temperature"):
            value = getattr(out, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if out.linear_epochs < 0 or out.knn_every < 0:
            raise ValueError("linear_epochs and knn_every must be >= 0")
        if out.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {out.num_workers}")
        return out


# ----------------------------------------------------------------------------------------------
# building blocks
# ----------------------------------------------------------------------------------------------


def _normalize_stats(source: str) -> dict[str, list[float]]:
    from adaptcl.adapters.lightly import CIFAR10_NORMALIZE

    if source.startswith("image folder"):
        from lightly.transforms.utils import IMAGENET_NORMALIZE

        return IMAGENET_NORMALIZE
    return CIFAR10_NORMALIZE


def _transforms(cfg: ImagesConfig, normalize: dict[str, list[float]]):
    """(two-view training transform, evaluation transform)."""
    from lightly.transforms import SimCLRTransform
    from lightly.transforms.torchvision_v2_compatibility import torchvision_transforms as T

    from adaptcl.adapters.lightly import ASCLTransform

    if cfg.method == "ascl-moco":
        train = ASCLTransform(input_size=cfg.input_size, gaussian_blur=0.0, normalize=normalize)
    else:
        # MACL App. B.3: crop-resize, colour jitter, flip, grayscale (no blur at 32x32)
        train = SimCLRTransform(input_size=cfg.input_size, cj_strength=0.5, gaussian_blur=0.0,
                                normalize=normalize)
    evaluation = T.Compose([T.Resize(cfg.input_size), T.CenterCrop(cfg.input_size), T.ToTensor(),
                            T.Normalize(mean=normalize["mean"], std=normalize["std"])])
    return train, evaluation


def build_module(cfg: ImagesConfig, loss: str, num_classes: int):
    """The Lightning module of ``cfg.method`` trained with ``loss``."""
    from lightly.models.modules.heads import (
        BarlowTwinsProjectionHead,
        MoCoProjectionHead,
        SimCLRProjectionHead,
        SimSiamPredictionHead,
        SimSiamProjectionHead,
    )

    from adaptcl.adapters import lightly as L
    from adaptcl.adapters import lightning_modules as M
    from adaptcl.plugins.amcl import AMCLBarlowTwinsLoss, AMCLSimSiamLoss, PairTemperature

    backbone, feature_dim = M.cifar_resnet(cfg.backbone, width=cfg.width)
    common = dict(optimizer=cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay,
                  num_classes=num_classes, knn_k=cfg.knn_k, knn_t=cfg.knn_t)
    tau, hid, out = cfg.temperature, cfg.hidden_dim, cfg.output_dim
    distributed = cfg.strategy.startswith("ddp")
    bank = (cfg.queue_size, out) if cfg.method == "moco" else 0
    # the MoCo queue is saved in checkpoints so that a resumed run keeps it
    qkw = dict(memory_bank_size=bank, gather_distributed=distributed,
               persistent_memory_bank=bool(bank))

    def contrastive(name: str):
        if name == "nt_xent":
            return L.NTXentLoss(tau, **qkw)
        if name == "macl":
            return L.MACLLoss(cfg.macl_temperature, cfg.alpha, cfg.a0, **qkw)
        if name == "dcl":
            return L.DCLLoss(tau, **qkw)
        if name == "flatnce":
            return L.FlatNCELoss(tau, **qkw)
        if name == "dual":
            return L.DualTemperatureLoss(tau, 1.0, **qkw)
        if name == "ascl":
            return L.ASCLLoss(tau, cfg.sharpen_temperature, cfg.num_neighbors, **qkw)
        raise ValueError(name)  # pragma: no cover - validated in resolved()

    if cfg.method == "simclr":
        if loss == "amcl":
            heads = L.AMCLProjectionHead.from_lightly(
                SimCLRProjectionHead, num_heads=cfg.num_heads, input_dim=feature_dim,
                hidden_dim=hid, output_dim=out)
            crit = L.AMCLLoss(out, cfg.beta, kappa=cfg.kappa, num_heads=cfg.num_heads,
                              gather_distributed=distributed)
            return M.SimCLRModule(backbone, feature_dim, crit, projection_head=heads, **common)
        return M.SimCLRModule(backbone, feature_dim, contrastive(loss), hidden_dim=hid,
                              output_dim=out, **common)
    if cfg.method == "moco":
        if loss == "amcl":
            heads = L.AMCLProjectionHead.from_lightly(
                MoCoProjectionHead, num_heads=cfg.num_heads, input_dim=feature_dim,
                hidden_dim=hid, output_dim=out)
            crit = L.AMCLLoss(out, cfg.beta, kappa=cfg.kappa, num_heads=cfg.num_heads, **qkw)
            return M.MoCoV2Module(backbone, feature_dim, crit, projection_head=heads, **common)
        return M.MoCoV2Module(backbone, feature_dim, contrastive(loss), hidden_dim=hid,
                              output_dim=out, **common)
    if cfg.method == "simsiam":
        if loss == "amcl":
            proj = L.AMCLProjectionHead.from_lightly(
                SimSiamProjectionHead, num_heads=cfg.num_heads, input_dim=feature_dim,
                hidden_dim=hid, output_dim=out)
            pred = L.AMCLProjectionHead.from_lightly(
                SimSiamPredictionHead, num_heads=cfg.num_heads, input_dim=out,
                hidden_dim=max(1, out // 4), output_dim=out)
            crit = AMCLSimSiamLoss(PairTemperature(out), cfg.beta)
            return M.SimSiamModule(backbone, feature_dim, crit, projection_head=proj,
                                   prediction_head=pred, output_dim=out, **common)
        return M.SimSiamModule(backbone, feature_dim, None, hidden_dim=hid, output_dim=out,
                               prediction_dim=max(1, out // 4), **common)
    if cfg.method == "barlowtwins":
        if loss == "amcl":
            heads = L.AMCLProjectionHead.from_lightly(
                BarlowTwinsProjectionHead, num_heads=cfg.num_heads, input_dim=feature_dim,
                hidden_dim=hid, output_dim=out)
            crit = AMCLBarlowTwinsLoss(PairTemperature(out), cfg.beta)
            return M.BarlowTwinsModule(backbone, feature_dim, crit, projection_head=heads,
                                       **common)
        return M.BarlowTwinsModule(backbone, feature_dim, None, hidden_dim=hid,
                                   output_dim=out, **common)
    mode, k = (loss, cfg.num_neighbors) if loss != "moco" else ("ascl", 0)
    return M.ASCLMoCoModule(backbone, feature_dim, hidden_dim=hid, output_dim=out,
                            queue_size=cfg.queue_size, temperature=tau,
                            sharpen_temperature=cfg.sharpen_temperature, num_neighbors=k,
                            mode=mode, gather_distributed=distributed, **common)


def extract_features(backbone, loader, device, progress: bool = False, desc: str = "features"):
    """Backbone features and targets of every batch of ``loader`` (eval mode, no grad)."""
    import torch
    from tqdm.auto import tqdm

    backbone = backbone.to(device)
    was_training = backbone.training
    backbone.eval()
    features, targets = [], []
    with torch.no_grad():
        for images, target in tqdm(loader, desc=desc, disable=not progress, leave=False):
            features.append(backbone(images.to(device)).flatten(start_dim=1).float().cpu())
            targets.append(torch.as_tensor(target))
    backbone.train(was_training)
    return torch.cat(features), torch.cat(targets).long()


def knn_accuracy(train_x, train_y, test_x, test_y, num_classes: int, k: int = 200,
                 t: float = 0.1, chunk: int = 1024) -> float:
    """Top-1 accuracy of Lightly's weighted kNN (``knn_predict``) on normalised features."""
    import torch.nn.functional as F
    from lightly.utils.benchmarking import knn_predict

    bank = F.normalize(train_x, dim=1).t().contiguous()
    correct = 0
    for start in range(0, len(test_x), chunk):
        feats = F.normalize(test_x[start:start + chunk], dim=1)
        pred = knn_predict(feats, bank, train_y, num_classes, knn_k=min(k, bank.shape[1]),
                           knn_t=t)
        correct += int((pred[:, 0] == test_y[start:start + chunk]).sum())
    return correct / max(1, len(test_x)) if len(test_x) else float("nan")


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
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    head = torch.nn.Linear(xtr.shape[1], num_classes)
    opt = torch.optim.SGD(head.parameters(), lr=lr, momentum=momentum, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    for _ in tqdm(range(epochs), desc="linear probe", disable=not progress, leave=False):
        order = torch.randperm(len(xtr), generator=generator)
        for start in range(0, len(xtr), batch_size):
            idx = order[start:start + batch_size]
            loss = torch.nn.functional.cross_entropy(head(xtr[idx]), train_y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
    with torch.no_grad():
        return float((head(xte).argmax(1) == test_y).float().mean())


#: configuration fields that do not change what a (loss, seed) run computes
_NOT_IN_RUN_KEY = frozenset({"output_dir", "losses", "seeds", "progress", "num_threads",
                             "num_workers", "data_root", "download"})


def run_key(cfg: ImagesConfig, loss: str, seed: int) -> str:
    """Name of the folder holding the checkpoint and record of one (loss, seed) run of ``cfg``.

    ``<method>_<loss>_seed<seed>_<hash>``, the hash covering every resolved setting that changes
    training or evaluation, so a rerun with another configuration never resumes a stale run.
    """
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _NOT_IN_RUN_KEY}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode())
    return f"{cfg.method}_{loss}_seed{seed}_{digest.hexdigest()[:10]}"


def _trainer(cfg: ImagesConfig, log_dir: Path, max_epochs: int, ckpt_dir: Path | None = None):
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.loggers import CSVLogger

    from adaptcl.adapters.lightning_modules import AtomicCheckpointIO

    callbacks, plugins = [], []
    if ckpt_dir is not None:
        # last.ckpt after every training epoch (Lightning also keeps the newest epoch=*.ckpt);
        # no version counter, so a rerun overwrites last.ckpt instead of writing last-v1.ckpt
        callbacks.append(ModelCheckpoint(dirpath=str(ckpt_dir), filename="{epoch}",
                                         save_last=True, every_n_epochs=1,
                                         save_on_train_epoch_end=True,
                                         enable_version_counter=False))
        plugins.append(AtomicCheckpointIO())
    kwargs: dict[str, Any] = dict(
        max_epochs=max_epochs, accelerator=cfg.accelerator, devices=cfg.devices,
        strategy=cfg.strategy, logger=CSVLogger(str(log_dir), name=""),
        enable_checkpointing=ckpt_dir is not None, callbacks=callbacks, plugins=plugins,
        enable_progress_bar=cfg.progress,
        enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=10,
        check_val_every_n_epoch=max(1, cfg.knn_every or 1),
        limit_val_batches=1.0 if cfg.knn_every else 0,
    )
    if cfg.precision:
        kwargs["precision"] = cfg.precision
    if cfg.strategy.startswith("ddp") and cfg.accelerator != "cpu":
        import torch

        # SyncBatchNorm needs GPU modules (torch raises on CPU); CPU DDP keeps per-rank BN
        kwargs["sync_batchnorm"] = torch.cuda.is_available()
    return pl.Trainer(**kwargs)


def _run_one(cfg: ImagesConfig, splits, loss: str, seed: int, out_dir: Path) -> dict[str, Any]:
    """Train and evaluate one (loss, seed), resuming from / skipping what an earlier run left."""
    import torch
    from torch.utils.data import DataLoader

    run_dir = out_dir / "runs" / run_key(cfg, loss, seed)
    record_path = run_dir / "record.json"
    if record_path.is_file():  # finished by an earlier invocation
        record = read_json(record_path)
        print(f"[images] {cfg.method}/{loss} seed {seed}: done earlier, reusing {record_path}",
              flush=True)
        return record
    last_ckpt = run_dir / "last.ckpt"
    for stale in run_dir.glob(".*.tmp"):  # temporary file of a write that was killed
        stale.unlink(missing_ok=True)
    resume = last_ckpt if last_ckpt.is_file() else None
    if resume is not None:
        print(f"[images] {cfg.method}/{loss} seed {seed}: resuming from {resume}", flush=True)

    seed_everything(seed)
    normalize = _normalize_stats(splits.source)
    train_tf, eval_tf = _transforms(cfg, normalize)
    ssl_data = splits.train.with_transform(train_tf)
    if len(ssl_data) < cfg.batch_size:
        raise ValueError(f"the training set ({len(ssl_data)} images) is smaller than one batch "
                         f"({cfg.batch_size}); lower --batch-size")
    loader_kw = dict(num_workers=cfg.num_workers, persistent_workers=cfg.num_workers > 0)
    ssl_loader = DataLoader(ssl_data, batch_size=cfg.batch_size, shuffle=True, drop_last=True,
                            generator=torch.Generator().manual_seed(seed), **loader_kw)
    eval_bs = max(cfg.batch_size, 256)
    bank_loader = DataLoader(splits.train.with_transform(eval_tf), batch_size=eval_bs,
                             shuffle=False, **loader_kw)
    test_loader = DataLoader(splits.test.with_transform(eval_tf), batch_size=eval_bs,
                             shuffle=False, **loader_kw)

    module = build_module(cfg, loss, splits.num_classes)
    if cfg.knn_every:
        module.set_knn_bank_loader(bank_loader)
    trainer = _trainer(cfg, out_dir / "logs" / f"{cfg.method}_{loss}_seed{seed}", cfg.epochs,
                       ckpt_dir=run_dir)
    start = time.perf_counter()
    trainer.fit(module, train_dataloaders=ssl_loader,
                val_dataloaders=test_loader if cfg.knn_every else None,
                ckpt_path=str(resume) if resume is not None else None)
    train_time = time.perf_counter() - start
    if not trainer.is_global_zero:
        return {}

    device = module.device
    start = time.perf_counter()
    train_x, train_y = extract_features(module.backbone, bank_loader, device, cfg.progress,
                                        "train features")
    test_x, test_y = extract_features(module.backbone, test_loader, device, cfg.progress,
                                      "test features")
    knn = knn_accuracy(train_x, train_y, test_x, test_y, splits.num_classes, cfg.knn_k, cfg.knn_t)
    linear = linear_probe(train_x, train_y, test_x, test_y, splits.num_classes,
                          cfg.linear_epochs, cfg.linear_batch_size, cfg.linear_lr, seed=seed,
                          progress=cfg.progress)
    eval_time = time.perf_counter() - start
    history = module.history
    last = history[-1] if history else {}
    record = {
        "method": cfg.method, "loss": loss, "seed": seed, "epochs": cfg.epochs,
        "batch_size": cfg.batch_size, "knn_top1": knn, "linear_top1": linear,
        "final_temperature": last.get("temperature"), "final_alignment": last.get("alignment"),
        "final_loss": last.get("loss"), "train_time_s": train_time, "eval_time_s": eval_time,
        "steps": len(history), "resumed_from": module.resumed_from, "run_dir": str(run_dir),
        "history": history, "online_knn": module.knn_history,
    }
    write_json_atomic(record_path, record)
    return record


def _table(records: list[dict[str, Any]]) -> str:
    rows = []
    for r in records:
        rows.append({
            "method": r["method"], "loss": r["loss"], "seed": str(r["seed"]),
            "kNN top-1 (%)": 100 * r["knn_top1"],
            "linear top-1 (%)": 100 * r["linear_top1"] if not math.isnan(r["linear_top1"]) else None,
            "final tau": None if r["final_temperature"] is None else f"{r['final_temperature']:.4f}",
            "final A": None if r["final_alignment"] is None else f"{r['final_alignment']:.3f}",
            "batch": str(r["batch_size"]),
            "train (s)": f"{r['train_time_s']:.0f}",
        })
    seeds = sorted({r["seed"] for r in records})
    if len(seeds) > 1:
        for loss in dict.fromkeys(r["loss"] for r in records):
            sel = [r for r in records if r["loss"] == loss]
            km, ks = mean_std([100 * r["knn_top1"] for r in sel])
            lm, ls = mean_std([100 * r["linear_top1"] for r in sel])
            rows.append({"method": sel[0]["method"], "loss": loss, "seed": "mean ± std",
                         "kNN top-1 (%)": f"{km:.2f} ± {ks:.2f}",
                         "linear top-1 (%)": f"{lm:.2f} ± {ls:.2f}"})
    return markdown_table(rows)


def _plot(records: list[dict[str, Any]], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for r in records:
        label = f"{r['loss']} (seed {r['seed']})"
        steps = [h["step"] for h in r["history"]]
        for ax, key in zip(axes[:2], ("temperature", "alignment"), strict=True):
            values = [h.get(key, float("nan")) for h in r["history"]]
            if any(not math.isnan(v) for v in values):
                ax.plot(steps, values, label=label, linewidth=1)
        if r["online_knn"]:
            axes[2].plot([h["epoch"] + 1 for h in r["online_knn"]],
                         [100 * h["knn_top1"] for h in r["online_knn"]], marker="o", label=label)
    axes[0].set(title="temperature (adaptive: MACL tau_a, AMCL mean tau+)", xlabel="step")
    axes[1].set(title="alignment A (mean positive cosine)", xlabel="step")
    axes[2].set(title="online kNN top-1 (%)", xlabel="epoch")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure_atomic(fig, path)


def run_images(config: ImagesConfig) -> dict[str, Any]:
    """Run every (loss, seed) of ``config``; write JSON, markdown and PNG; return the result."""
    import torch

    from adaptcl.recipes.image_data import load_image_splits

    cfg = config.resolved()
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    root = resolve_data_root(cfg.data_root)
    splits = load_image_splits(root, cfg.source, cfg.npz_variant, cfg.train_limit,
                               cfg.test_limit, seed=0, download=cfg.download)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"images_{cfg.method}_{cfg.preset}"
    started = time.perf_counter()
    records = []
    for seed in cfg.seeds:
        for loss in cfg.losses:
            record = _run_one(cfg, splits, loss, seed, out_dir)
            if record:
                records.append(record)
                print(f"[images] {cfg.method}/{loss} seed {seed}: kNN {100 * record['knn_top1']:.2f}% "
                      f"linear {100 * record['linear_top1']:.2f}% "
                      f"({record['train_time_s']:.0f}s train)", flush=True)
    if not records:  # non-zero ranks of a distributed run
        return {}
    table = _table(records)
    cfg_dict = dataclasses.asdict(cfg)
    result = {
        "recipe": "images", "config": cfg_dict, "data": splits.describe(),
        "wall_time_s": time.perf_counter() - started, "runs": records, "table": table,
        "torch": torch.__version__, "num_threads": torch.get_num_threads(),
    }
    paths = {
        "json": out_dir / f"{stem}.json",
        "markdown": out_dir / f"{stem}.md",
        "png": out_dir / f"{stem}_temperature.png",
    }
    header = (f"# images: {cfg.method}, preset {cfg.preset}\n\n"
              f"{splits.describe()['source']}: {len(splits.train)} train / {len(splits.test)} "
              f"test images; {cfg.backbone} width {cfg.width}, {cfg.epochs} epochs, batch "
              f"{cfg.batch_size}, {cfg.optimizer} lr {cfg.lr}; kNN k={cfg.knn_k} t={cfg.knn_t}; "
              f"linear probe {cfg.linear_epochs} epochs.\n\n")
    write_text_atomic(paths["markdown"], header + table)
    _plot(records, paths["png"], f"{cfg.method} ({cfg.preset})")
    result["outputs"] = {k: str(v) for k, v in paths.items()}
    write_json_atomic(paths["json"], result)
    return result


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def _csv(kind):
    def parse(text: str):
        items = [kind(x) for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        return tuple(items)
    return parse


def _devices(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``adaptcl images`` options."""
    d = ImagesConfig()
    parser.add_argument("--data-root", default=None,
                        help="folder with cifar-10-batches-py, cifar10_*.npz (or cifar10/), or "
                             "train/ and test/ class folders (default: $ADAPTCL_DATA)")
    parser.add_argument("--output-dir", default=d.output_dir)
    parser.add_argument("--preset", choices=tuple(PRESETS), default=d.preset,
                        help="cpu: narrow ResNet-18, 4k images, minutes; paper: MACL App. B.3")
    parser.add_argument("--method", choices=METHODS, default=d.method)
    parser.add_argument("--losses", type=_csv(str), default=d.losses,
                        help="comma-separated; simclr: nt_xent,macl,dcl,flatnce,dual,amcl; "
                             "moco: nt_xent,macl,dcl,ascl,amcl; simsiam: negcos,amcl; "
                             "barlowtwins: barlow,amcl; ascl-moco: ascl,ahcl,hard,moco")
    parser.add_argument("--seeds", type=_csv(int), default=d.seeds)
    parser.add_argument("--source", choices=("auto", "torchvision", "npz", "folder"),
                        default=d.source)
    parser.add_argument("--npz-variant", choices=("auto", "lossless", "jpeg"), default=None)
    parser.add_argument("--train-limit", type=int, default=None)
    parser.add_argument("--test-limit", type=int, default=None)
    parser.add_argument("--full-data", action="store_true", help="use every image available")
    parser.add_argument("--download", action="store_true",
                        help="download CIFAR-10 with torchvision if no local data is found")
    parser.add_argument("--input-size", type=int, default=d.input_size)
    parser.add_argument("--backbone", default=None, help="resnet-9/18/34/50 (Lightly's CIFAR ResNet)")
    parser.add_argument("--width", type=float, default=None)
    parser.add_argument("--hidden-dim", type=int, default=None)
    parser.add_argument("--output-dim", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--optimizer", choices=("adam", "adamw", "sgd"), default=None)
    parser.add_argument("--weight-decay", type=float, default=None)
    parser.add_argument("--temperature", type=float, default=None,
                        help="tau (MACL: tau0); default 0.1, MoCo 0.2 (MACL-MoCo 0.15)")
    parser.add_argument("--macl-temperature", type=float, default=None,
                        help="MACL tau0 (default: --temperature; MoCo 0.15)")
    parser.add_argument("--alpha", type=float, default=d.alpha)
    parser.add_argument("--a0", type=float, default=None, help="MACL A0 (default 0, MoCo 0.2)")
    parser.add_argument("--num-heads", type=int, default=d.num_heads, help="AMCL heads C")
    parser.add_argument("--beta", type=float, default=d.beta, help="AMCL regulariser weight")
    parser.add_argument("--kappa", type=int, default=d.kappa, help="AMCL top-kappa negatives")
    parser.add_argument("--queue-size", type=int, default=None)
    parser.add_argument("--num-neighbors", type=int, default=d.num_neighbors, help="ASCL K")
    parser.add_argument("--sharpen-temperature", type=float, default=d.sharpen_temperature)
    parser.add_argument("--knn-k", type=int, default=d.knn_k)
    parser.add_argument("--knn-t", type=float, default=d.knn_t)
    parser.add_argument("--knn-every", type=int, default=None,
                        help="online kNN monitor every N epochs (0: off)")
    parser.add_argument("--linear-epochs", type=int, default=None)
    parser.add_argument("--linear-batch-size", type=int, default=None)
    parser.add_argument("--linear-lr", type=float, default=None)
    parser.add_argument("--num-workers", type=int, default=d.num_workers)
    parser.add_argument("--accelerator", default=d.accelerator)
    parser.add_argument("--devices", type=_devices, default=d.devices)
    parser.add_argument("--strategy", default=d.strategy, help="e.g. ddp for several GPUs")
    parser.add_argument("--precision", default=None, help="e.g. 16-mixed on GPU")
    parser.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--no-progress", dest="progress", action="store_false")


def main(args: argparse.Namespace) -> int:
    fields = {f.name for f in dataclasses.fields(ImagesConfig)}
    config = ImagesConfig(**{k: v for k, v in vars(args).items() if k in fields})
    result = run_images(config)
    if result:
        print(result["table"])
        print(json.dumps(result["outputs"], indent=2))
    return 0
