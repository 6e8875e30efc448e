"""``adaptcl moleculenet``: GraphCL pre-training on SMILES, fine-tuning on MoleculeNet, ROC-AUC.

The transfer-learning protocol of GraphCL (You et al., "Graph Contrastive Learning with
Augmentations", NeurIPS 2020), built on Hu et al., "Strategies for Pre-training Graph Neural
Networks" (ICLR 2020), as used by MACL (Huang et al., "Model-Aware Contrastive Learning:
Towards Escaping the Dilemmas", ICML 2023, Sec. 6.3, Table 5, App. B.5), on the MoleculeNet
classification sets (Wu et al., "MoleculeNet: a benchmark for molecular machine learning",
Chem. Sci. 2018):

* pre-training: the 5-layer, 300-dim GIN of Hu et al. with OGB atom/bond encoders
  (:class:`~adaptcl.adapters.graphcl.MolGINEncoder`, mean pooling, no dropout), GraphCL's
  projection head, both views augmented (``--aug random2``: node dropping or subgraph, ratio
  0.2; attribute masking is not offered because OGB's integer features have no mask token),
  Adam lr 1e-3, batch 256, 100 epochs; loss ``graphcl`` (DCL cross-view, tau 0.1) or ``macl``
  (tau0 0.1, alpha 0.5, A0 0, no reweighting). The paper pre-trains on Hu et al.'s 2M ZINC15
  molecules, which are not available offline; the default corpus here is the ZINC-derived MOSES
  test split ``<data-root>/zinc/moses/test.csv.gz`` (176k SMILES), ``--pretrain-smiles`` takes
  any SMILES file;
* fine-tuning: the pre-trained encoder (or a fresh one: the ``none`` row) + mean pooling + a
  linear head with one logit per task, dropout 0.5, Adam lr 1e-3, batch 32, 100 epochs,
  masked multi-task BCE (:func:`masked_bce_loss`); scaffold split 80/10/10
  (:func:`~adaptcl.adapters.graphcl.molecules.scaffold_split`, the same on every run);
* evaluation: ROC-AUC averaged over the tasks whose evaluation labels hold both classes
  (:func:`multitask_roc_auc`; the others are skipped and counted), after every epoch on the
  validation and test sets. Reported: the test score of the last epoch (the paper's protocol)
  and the test score at the best-validation epoch (the sounder choice); mean +- population std
  over seeds (0-9 in the paper).

``--preset cpu`` is a configuration that completes on two CPU cores in about 40 minutes (see
:meth:`MoleculeNetConfig.cpu`); ``--preset paper`` (the default) is the paper's.

Resume: the pre-trained encoders are checkpointed after every epoch under
``<out-dir>/pretrain/<pretrain-key>/`` and reused once finished; every finished
(dataset, init, seed) is written atomically to
``<out-dir>/runs/<finetune-key>/<dataset>/<init>/seed<k>.json`` and skipped on rerun. The keys
hash every setting that changes a result. ``results.json`` and ``results.md`` are rewritten
after every finished run.

Example::

    adaptcl moleculenet --preset cpu --data-root /path/to/data --out-dir results/moleculenet
    adaptcl moleculenet --data-root /path/to/data --datasets bbbp bace --seeds 0 1 2 \\
        --pretrain-molecules 20000 --pretrain-epochs 5 --finetune-epochs 20
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
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

ALL_DATASETS = ("bbbp", "tox21", "toxcast", "sider", "clintox", "muv", "hiv", "bace")
INITS = ("none", "graphcl", "macl")  # no pre-training, GraphCL, GraphCL + MACL
INIT_LABELS = {"none": "no pre-train", "graphcl": "GraphCL", "macl": "GraphCL+MACL"}
DISPLAY = {"bbbp": "BBBP", "tox21": "Tox21", "toxcast": "ToxCast", "sider": "SIDER",
           "clintox": "ClinTox", "muv": "MUV", "hiv": "HIV", "bace": "BACE"}
AUGMENTATIONS = ("none", "dnodes", "pedges", "subgraph", "random2", "random3")
DEFAULT_PRETRAIN_SMILES = ("zinc", "moses", "test.csv.gz")

# Huang et al. 2023 (MACL), Table 5: test ROC-AUC % (mean, std) over 10 seeds.
PAPER_TABLE5: dict[str, dict[str, tuple[float, float]]] = {
    "tox21": {"graphcl": (73.87, 0.66), "macl": (74.39, 0.29)},
    "bbbp": {"graphcl": (69.68, 0.67), "macl": (67.98, 0.97)},
    "toxcast": {"graphcl": (62.40, 0.57), "macl": (62.96, 0.28)},
    "sider": {"graphcl": (60.53, 0.88), "macl": (61.46, 0.39)},
    "clintox": {"graphcl": (75.99, 2.65), "macl": (78.13, 4.29)},
    "muv": {"graphcl": (69.80, 2.66), "macl": (72.77, 1.25)},
    "hiv": {"graphcl": (78.47, 1.22), "macl": (77.56, 1.12)},
    "bace": {"graphcl": (75.38, 1.44), "macl": (76.07, 0.90)},
}

_PRETRAIN_FIELDS = ("pretrain_smiles", "pretrain_molecules", "pretrain_epochs",
                    "pretrain_batch_size", "pretrain_lr", "temperature", "alpha", "a0", "aug",
                    "aug_ratio", "num_layers", "emb_dim", "jk", "pretrain_seed")
_FINETUNE_FIELDS = ("finetune_epochs", "batch_size", "lr", "weight_decay", "dropout",
                    "num_layers", "emb_dim", "jk", "max_molecules", "frac_train", "frac_valid")


@dataclass
class MoleculeNetConfig:
    """Settings of a ``moleculenet`` run; defaults are the paper's (GraphCL / MACL App. B.5)."""

    datasets: list[str] = field(default_factory=lambda: list(ALL_DATASETS))
    inits: list[str] = field(default_factory=lambda: list(INITS))
    seeds: list[int] = field(default_factory=lambda: list(range(10)))
    data_root: str | None = None
    out_dir: str = "results/moleculenet"
    cache_dir: str | None = None  # default <out_dir>/cache
    # pre-training
    pretrain_smiles: str | None = None  # default <data_root>/zinc/moses/test.csv.gz
    pretrain_molecules: int | None = None  # None: every SMILES of the file
    pretrain_epochs: int = 100
    pretrain_batch_size: int = 256
    pretrain_lr: float = 1e-3
    temperature: float = 0.1  # tau (tau0 for MACL)
    alpha: float = 0.5
    a0: float = 0.0
    aug: str = "random2"
    aug_ratio: float = 0.2
    pretrain_seed: int = 0
    # encoder
    num_layers: int = 5
    emb_dim: int = 300
    jk: str = "last"
    # fine-tuning
    finetune_epochs: int = 100
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.0
    dropout: float = 0.5
    max_molecules: int | None = None  # first N rows of each CSV (tests / quick looks)
    frac_train: float = 0.8
    frac_valid: float = 0.1
    threads: int = 1
    progress: bool = True
    plot: bool = True

    def __post_init__(self) -> None:
        self.datasets = [d.lower() for d in self.datasets]
        for name in self.datasets:
            if name not in ALL_DATASETS:
                raise ValueError(f"unknown dataset {name!r}; choose from {ALL_DATASETS}")
        for init in self.inits:
            if init not in INITS:
                raise ValueError(f"unknown init {init!r}; choose from {INITS}")
        if self.aug not in AUGMENTATIONS:
            raise ValueError(f"aug must be one of {AUGMENTATIONS}, got {self.aug!r}")
        if self.jk not in ("last", "sum", "concat"):
            raise ValueError(f"jk must be last/sum/concat, got {self.jk!r}")
        for name in ("pretrain_epochs", "pretrain_batch_size", "num_layers", "emb_dim",
                     "finetune_epochs", "batch_size", "threads"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.pretrain_batch_size < 2:
            raise ValueError("pretrain_batch_size must be >= 2 (a contrastive batch needs negatives)")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not (0 < self.frac_train < 1 and 0 < self.frac_valid < 1
                and self.frac_train + self.frac_valid < 1):
            raise ValueError("need 0 < frac_train, frac_valid and frac_train + frac_valid < 1")
        if not self.datasets or not self.inits or not self.seeds:
            raise ValueError("datasets, inits and seeds must not be empty")

    @classmethod
    def paper(cls, **overrides: Any) -> MoleculeNetConfig:
        """The paper's configuration (the dataclass defaults)."""
        return cls(**overrides)

    @classmethod
    def cpu(cls, **overrides: Any) -> MoleculeNetConfig:
        """A configuration that completes here (2 loaded CPU cores, one thread) in ~40 min.

        BBBP, BACE, ClinTox, SIDER, Tox21; seeds 0-2; pre-training on the first 6,000 SMILES of
        the corpus for 3 epochs; fine-tuning 5 epochs; the encoder keeps 5 GIN layers but is
        128 wide instead of 300 (3x cheaper per step). Everything else as the paper. Measured
        here (load average ~10 on 2 cores): pre-training ~2.5 min per loss, fine-tuning
        ~160 molecules/s, so one epoch over the five training sets (11.4k molecules) is ~70 s.
        """
        params: dict[str, Any] = {
            "datasets": ["bbbp", "bace", "clintox", "sider", "tox21"], "seeds": [0, 1, 2],
            "pretrain_molecules": 6000, "pretrain_epochs": 3, "finetune_epochs": 5,
            "emb_dim": 128,
        }
        params.update(overrides)
        return cls(**params)

    def resolved_pretrain_smiles(self) -> Path:
        if self.pretrain_smiles is not None:
            return Path(self.pretrain_smiles)
        return resolve_data_root(self.data_root).joinpath(*DEFAULT_PRETRAIN_SMILES)

    def pretrain_key(self) -> str:
        """Hash of every setting that changes a pre-trained encoder."""
        payload = {name: getattr(self, name) for name in _PRETRAIN_FIELDS}
        payload["pretrain_smiles"] = str(self.resolved_pretrain_smiles().resolve())
        return _hash(payload)

    def finetune_key(self) -> str:
        """Hash of every setting that changes a fine-tuning result (besides the init)."""
        return _hash({name: getattr(self, name) for name in _FINETUNE_FIELDS})


def _hash(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()
                          ).hexdigest()[:12]


# ------------------------------------------------------------------ loss and evaluation


def masked_bce_loss(logits, y):
    """Multi-task BCE over the present labels only (Hu et al.'s fine-tuning loss).

    ``y`` holds 0/1 with ``NaN`` where a label is missing; the loss is the mean of
    ``BCEWithLogits(logits, y)`` over the present entries (0 with a zero gradient when a batch
    has none).
    """
    import torch
    import torch.nn.functional as F

    y = y.to(logits.dtype).view_as(logits)
    mask = ~torch.isnan(y)
    target = torch.where(mask, y, torch.zeros_like(y))
    per_entry = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    per_entry = torch.where(mask, per_entry, torch.zeros_like(per_entry))
    return per_entry.sum() / mask.sum().clamp(min=1)


def multitask_roc_auc(y_true, scores) -> dict[str, Any]:
    """ROC-AUC per task and its mean over the tasks whose labels hold both classes.

    ``y_true`` [N, T] 0/1 with ``NaN`` = missing, ``scores`` [N, T] (logits or probabilities).
    Tasks with a single class among the present labels (or none) are skipped, as in Hu et
    al.'s ``eval``; ``num_skipped`` says how many. ``mean`` is NaN when every task is skipped.
    """
    import numpy as np
    from sklearn.metrics import roc_auc_score

    y = np.asarray(y_true, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    if y.ndim == 1:
        y, s = y[:, None], s[:, None]
    if y.shape != s.shape:
        raise ValueError(f"labels {y.shape} and scores {s.shape} differ")
    per_task: list[float | None] = []
    for t in range(y.shape[1]):
        present = ~np.isnan(y[:, t])
        labels = y[present, t]
        if labels.size == 0 or labels.min() == labels.max():
            per_task.append(None)
            continue
        per_task.append(float(roc_auc_score(labels, s[present, t])))
    valid = [v for v in per_task if v is not None]
    return {"mean": float(np.mean(valid)) if valid else math.nan, "per_task": per_task,
            "num_tasks": int(y.shape[1]), "num_evaluated": len(valid),
            "num_skipped": int(y.shape[1] - len(valid))}


# --------------------------------------------------------------------------- models


def build_encoder(cfg: MoleculeNetConfig, dropout: float):
    from adaptcl.adapters.graphcl import MolGINEncoder

    return MolGINEncoder(num_layers=cfg.num_layers, emb_dim=cfg.emb_dim, drop_ratio=dropout,
                         jk=cfg.jk, pooling="mean")


def build_classifier(cfg: MoleculeNetConfig, num_tasks: int):
    """MolGIN encoder (dropout ``cfg.dropout``) + mean pooling + linear head (Hu et al.)."""
    from torch import nn

    class MolPropertyModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = build_encoder(cfg, cfg.dropout)
            self.head = nn.Linear(self.encoder.out_dim, num_tasks)

        def forward(self, data):
            return self.head(self.encoder(data))

    return MolPropertyModel()


def _torch_save_atomic(obj: Any, path: Path) -> Path:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# ------------------------------------------------------------------------ pre-training


def pretrain_path(cfg: MoleculeNetConfig, loss_name: str) -> Path:
    return Path(cfg.out_dir) / "pretrain" / cfg.pretrain_key() / f"{loss_name}.pt"


def load_pretrain_corpus(cfg: MoleculeNetConfig):
    from adaptcl.adapters.graphcl.molecules import load_smiles_dataset

    return load_smiles_dataset(cfg.resolved_pretrain_smiles(), cache_dir=_cache_dir(cfg),
                               limit=cfg.pretrain_molecules, progress=cfg.progress)


def pretrain(cfg: MoleculeNetConfig, loss_name: str, corpus=None) -> dict[str, Any]:
    """Pre-train (or resume / reuse) the GraphCL encoder with ``loss_name``; return the checkpoint.

    The checkpoint (``encoder`` state dict, per-epoch loss, per-step alignment/temperature,
    seconds) is written atomically to :func:`pretrain_path`; a ``.partial.pt`` next to it holds
    the model, optimiser and RNG states after each epoch so an interrupted run resumes there.
    """
    import torch
    from torch_geometric.loader import DataLoader

    from adaptcl.adapters.graphcl import (
        GraphCL,
        TwoViewDataset,
        graphcl_augmentation,
        graphcl_loss,
        train_epoch,
    )

    final = pretrain_path(cfg, loss_name)
    if final.is_file():
        return torch.load(final, weights_only=True)
    partial = final.with_suffix(".partial.pt")
    if corpus is None:
        corpus = load_pretrain_corpus(cfg)
    if len(corpus) < 2:
        raise ValueError("the pre-training corpus needs at least 2 valid molecules")

    seed_everything(cfg.pretrain_seed)
    loss_kwargs = {"alpha": cfg.alpha, "a0": cfg.a0} if loss_name == "macl" else {}
    model = GraphCL(build_encoder(cfg, dropout=0.0),
                    loss_fn=graphcl_loss(loss_name, temperature=cfg.temperature, **loss_kwargs),
                    xavier_init=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.pretrain_lr)
    aug_gen = torch.Generator().manual_seed(cfg.pretrain_seed)
    shuffle_gen = torch.Generator().manual_seed(cfg.pretrain_seed + 1)
    state: dict[str, Any] = {"epoch": 0, "epoch_loss": [], "epoch_seconds": [],
                             "step_stats": {}}
    if partial.is_file():
        saved = torch.load(partial, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        aug_gen.set_state(saved["aug_gen"])
        shuffle_gen.set_state(saved["shuffle_gen"])
        torch.set_rng_state(saved["torch_rng"])
        state = saved["state"]

    aug = graphcl_augmentation(cfg.aug, cfg.aug_ratio, generator=aug_gen)
    pairs = TwoViewDataset(corpus, aug, aug)  # GraphCL's molecule code augments both views
    loader = DataLoader(pairs, batch_size=cfg.pretrain_batch_size, shuffle=True,
                        generator=shuffle_gen)
    epochs = range(state["epoch"], cfg.pretrain_epochs)
    if cfg.progress:
        from tqdm.auto import tqdm

        epochs = tqdm(epochs, desc=f"pre-train {loss_name}", leave=False, dynamic_ncols=True,
                      initial=state["epoch"], total=cfg.pretrain_epochs)
    for epoch in epochs:
        t0 = time.perf_counter()
        state["epoch_loss"].append(train_epoch(model, loader, optimizer, state["step_stats"],
                                               where=f"pre-training {loss_name}, epoch {epoch}"))
        state["epoch_seconds"].append(time.perf_counter() - t0)
        state["epoch"] = epoch + 1
        if cfg.progress:
            epochs.set_postfix(loss=f"{state['epoch_loss'][-1]:.3f}")
        _torch_save_atomic({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "aug_gen": aug_gen.get_state(),
                            "shuffle_gen": shuffle_gen.get_state(),
                            "torch_rng": torch.get_rng_state(), "state": state}, partial)
    checkpoint = {
        "encoder": model.encoder.state_dict(), "loss": loss_name,
        "loss_module": repr(model.loss_fn), "pretrain_key": cfg.pretrain_key(),
        "num_molecules": len(corpus), "num_invalid": corpus.num_invalid,
        "corpus": str(cfg.resolved_pretrain_smiles()),
        "epoch_loss": state["epoch_loss"], "epoch_seconds": state["epoch_seconds"],
        "step_stats": state["step_stats"],
    }
    _torch_save_atomic(checkpoint, final)
    partial.unlink(missing_ok=True)
    return checkpoint


# ------------------------------------------------------------------------- fine-tuning


def _cache_dir(cfg: MoleculeNetConfig) -> Path:
    return Path(cfg.cache_dir) if cfg.cache_dir else Path(cfg.out_dir) / "cache"


def load_split_dataset(cfg: MoleculeNetConfig, name: str):
    """A MoleculeNet set and its scaffold split (train, valid, test index lists)."""
    from adaptcl.adapters.graphcl.molecules import load_moleculenet, scaffold_split

    dataset = load_moleculenet(name, resolve_data_root(cfg.data_root), cache_dir=_cache_dir(cfg),
                               limit=cfg.max_molecules)
    split = scaffold_split(dataset.smiles, cfg.frac_train, cfg.frac_valid,
                           1.0 - cfg.frac_train - cfg.frac_valid)
    return dataset, split


def evaluate(model, graphs, batch_size: int = 256) -> dict[str, Any]:
    """Multi-task ROC-AUC of ``model`` (eval mode, no gradient) on a list of labelled graphs."""
    import torch
    from torch_geometric.loader import DataLoader

    model.eval()
    ys, outs = [], []
    with torch.no_grad():
        for batch in DataLoader(graphs, batch_size=batch_size, shuffle=False):
            outs.append(model(batch))
            ys.append(batch.y)
    return multitask_roc_auc(torch.cat(ys).numpy(), torch.cat(outs).numpy())


def finetune_one(cfg: MoleculeNetConfig, name: str, dataset, split, init: str, seed: int,
                 encoder_state: dict | None) -> dict[str, Any]:
    """Fine-tune one (dataset, init, seed); ROC-AUC on valid and test after every epoch."""
    import torch
    from torch_geometric.loader import DataLoader

    train_idx, valid_idx, test_idx = split
    train = [dataset[i] for i in train_idx]
    valid = [dataset[i] for i in valid_idx]
    test = [dataset[i] for i in test_idx]
    seed_everything(seed)
    model = build_classifier(cfg, dataset.num_tasks)
    if init != "none":
        if encoder_state is None:
            raise ValueError(f"init {init!r} needs a pre-trained encoder state")
        model.encoder.load_state_dict(encoder_state)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    loader = DataLoader(train, batch_size=cfg.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))
    history: dict[str, list] = {"train_loss": [], "valid_roc": [], "test_roc": [],
                                "valid_skipped": [], "test_skipped": []}
    t0 = time.perf_counter()
    epochs = range(cfg.finetune_epochs)
    if cfg.progress:
        from tqdm.auto import tqdm

        epochs = tqdm(epochs, desc=f"{name}/{init}/seed{seed}", leave=False, dynamic_ncols=True)
    for _ in epochs:
        model.train()
        total, count = 0.0, 0
        for batch in loader:
            if batch.num_nodes < 2:  # BatchNorm needs two nodes
                continue
            optimizer.zero_grad()
            loss = masked_bce_loss(model(batch), batch.y)
            loss.backward()
            optimizer.step()
            total += loss.item() * batch.num_graphs
            count += batch.num_graphs
        history["train_loss"].append(total / max(count, 1))
        val, tst = evaluate(model, valid), evaluate(model, test)
        history["valid_roc"].append(val["mean"])
        history["test_roc"].append(tst["mean"])
        history["valid_skipped"].append(val["num_skipped"])
        history["test_skipped"].append(tst["num_skipped"])
        if cfg.progress:
            epochs.set_postfix(loss=f"{history['train_loss'][-1]:.3f}",
                               val=f"{val['mean']:.3f}", test=f"{tst['mean']:.3f}")
    finite = [(v, i) for i, v in enumerate(history["valid_roc"]) if not math.isnan(v)]
    best_epoch = max(finite, key=lambda t: (t[0], -t[1]))[1] if finite else len(
        history["valid_roc"]) - 1
    return {
        "dataset": name, "init": init, "seed": seed,
        "test_roc_last": history["test_roc"][-1],
        "test_roc_best_valid": history["test_roc"][best_epoch],
        "valid_roc_best": history["valid_roc"][best_epoch],
        "best_epoch": best_epoch + 1,
        "test_per_task_last": tst["per_task"],
        "test_tasks_skipped": tst["num_skipped"], "valid_tasks_skipped": val["num_skipped"],
        "num_tasks": dataset.num_tasks,
        "split_sizes": [len(train), len(valid), len(test)],
        "history": history, "train_seconds": time.perf_counter() - t0,
        "torch_threads": torch.get_num_threads(),
    }


# ------------------------------------------------------------------------------ results


def init_tag(cfg: MoleculeNetConfig, init: str) -> str:
    return "none" if init == "none" else f"{init}-{cfg.pretrain_key()}"


def run_path(cfg: MoleculeNetConfig, name: str, init: str, seed: int) -> Path:
    return (Path(cfg.out_dir) / "runs" / cfg.finetune_key() / name / init_tag(cfg, init)
            / f"seed{seed}.json")


def _stats(values: list[float]) -> dict[str, Any] | None:
    finite = [100.0 * v for v in values if v is not None and not math.isnan(v)]
    if not finite:
        return None
    mean, std = mean_std(finite)
    return {"mean": mean, "std": std, "n": len(finite), "values": finite}


def summarize(cfg: MoleculeNetConfig, runs: dict[tuple[str, str, int], dict[str, Any]],
              infos: dict[str, Any]) -> dict[str, Any]:
    """Mean +- std ROC-AUC (%) per (dataset, init), last epoch and best-validation epoch."""
    summary: dict[str, Any] = {}
    for name in cfg.datasets:
        per_init = {}
        for init in cfg.inits:
            recs = [runs[(name, init, s)] for s in cfg.seeds if (name, init, s) in runs]
            if not recs:
                continue
            per_init[init] = {
                "last": _stats([r["test_roc_last"] for r in recs]),
                "best_valid": _stats([r["test_roc_best_valid"] for r in recs]),
                "n_seeds": len(recs),
                "test_tasks_skipped": max(r["test_tasks_skipped"] for r in recs),
                "seconds_per_seed": sum(r["train_seconds"] for r in recs) / len(recs),
            }
        summary[name] = {"info": infos.get(name), "inits": per_init,
                         "paper_table5": PAPER_TABLE5.get(name)}
    return summary


def _cell(stats: dict[str, Any] | None) -> str:
    if not stats:
        return "-"
    return f"{stats['mean']:.2f} ± {stats['std']:.2f} (n={stats['n']})"


def results_table(cfg: MoleculeNetConfig, summary: dict[str, Any], which: str = "last") -> str:
    """Markdown table: our ROC-AUC per init (``which``: last / best_valid) next to Table 5."""
    rows = []
    for name in cfg.datasets:
        entry = summary.get(name, {})
        row: dict[str, Any] = {"dataset": DISPLAY[name]}
        for init in cfg.inits:
            stats = entry.get("inits", {}).get(init)
            row[f"ours {INIT_LABELS[init]}"] = _cell(stats[which] if stats else None)
        skipped = [v["test_tasks_skipped"] for v in entry.get("inits", {}).values()]
        info = entry.get("info") or {}
        row["tasks (skipped)"] = (f"{info.get('num_tasks', '?')} ({max(skipped)})"
                                  if skipped else str(info.get("num_tasks", "-")))
        paper = PAPER_TABLE5.get(name)
        row["paper GraphCL"] = f"{paper['graphcl'][0]:.2f} ± {paper['graphcl'][1]:.2f}"
        row["paper GraphCL+MACL"] = f"{paper['macl'][0]:.2f} ± {paper['macl'][1]:.2f}"
        rows.append(row)
    return markdown_table(rows)


def plot_pretraining(checkpoints: dict[str, dict[str, Any]], path: Path) -> Path | None:
    """Alignment and temperature over pre-training steps, one line per loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not checkpoints:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for loss_name, ckpt in checkpoints.items():
        stats = ckpt.get("step_stats") or {}
        for ax, key in zip(axes, ("alignment", "temperature"), strict=True):
            if key in stats:
                ax.plot(stats[key], label=loss_name, lw=1)
    axes[0].set_ylabel("alignment A (mean positive cosine)")
    axes[1].set_ylabel("temperature")
    for ax in axes:
        ax.set_xlabel("pre-training step")
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure_atomic(fig, path)


def run_moleculenet(cfg: MoleculeNetConfig) -> dict[str, Any]:
    """Pre-train what is missing, fine-tune every unfinished (dataset, init, seed), write results.

    Jobs run seed by seed (every dataset and init of seed 0 first), so an interrupted run
    already has complete rows. Returns the result dict (also ``<out_dir>/results.json``) with
    ``computed`` and ``skipped`` lists of ``[dataset, init, seed]``.
    """
    import torch

    torch.set_num_threads(max(1, int(cfg.threads)))
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    write_json_atomic(out_dir / "runs" / cfg.finetune_key() / "config.json",
                      dataclasses.asdict(cfg) | {"pretrain_key": cfg.pretrain_key()})

    jobs = [(n, i, s) for s in cfg.seeds for n in cfg.datasets for i in cfg.inits]
    runs: dict[tuple[str, str, int], dict[str, Any]] = {}
    computed, skipped, todo = [], [], []
    for job in jobs:
        path = run_path(cfg, *job)
        if path.exists():
            runs[job] = read_json(path)
            skipped.append(list(job))
        else:
            todo.append(job)

    # pre-trained encoders (reused when finished; resumed per epoch otherwise)
    checkpoints: dict[str, dict[str, Any]] = {}
    pretrain_info: dict[str, Any] = {}
    needed = [i for i in cfg.inits if i != "none"]
    corpus = None
    for loss_name in needed:
        if not pretrain_path(cfg, loss_name).is_file() and corpus is None:
            corpus = load_pretrain_corpus(cfg)
        checkpoints[loss_name] = pretrain(cfg, loss_name, corpus)
        ck = checkpoints[loss_name]
        stats = ck.get("step_stats") or {}
        pretrain_info[loss_name] = {
            "num_molecules": ck["num_molecules"], "num_invalid": ck["num_invalid"],
            "corpus": ck["corpus"], "epoch_loss": ck["epoch_loss"],
            "seconds": sum(ck["epoch_seconds"]), "loss_module": ck["loss_module"],
            "final_alignment": stats["alignment"][-1] if stats.get("alignment") else None,
            "final_temperature": stats["temperature"][-1] if stats.get("temperature") else None,
        }
    corpus = None

    bar = None
    if cfg.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(jobs), initial=len(skipped), desc="moleculenet runs",
                   dynamic_ncols=True)
    infos: dict[str, Any] = {}
    loaded: dict[str, tuple[Any, tuple]] = {}
    for name, init, seed in todo:
        if name not in loaded:
            loaded.clear()
            dataset, split = load_split_dataset(cfg, name)
            loaded[name] = (dataset, split)
            infos[name] = dataset.info() | {"split_sizes": [len(p) for p in split]}
        dataset, split = loaded[name]
        if bar is not None:
            bar.set_postfix_str(f"{name}/{init}/seed{seed}")
        state = checkpoints[init]["encoder"] if init != "none" else None
        record = finetune_one(cfg, name, dataset, split, init, seed, state)
        record["finetune_key"] = cfg.finetune_key()
        record["pretrain_key"] = cfg.pretrain_key() if init != "none" else None
        write_json_atomic(run_path(cfg, name, init, seed), record)
        runs[(name, init, seed)] = record
        computed.append([name, init, seed])
        _write_results(cfg, jobs, runs, infos, pretrain_info, computed, skipped, t_start)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    result = _write_results(cfg, jobs, runs, infos, pretrain_info, computed, skipped, t_start)
    if cfg.plot and checkpoints:
        plot = plot_pretraining(checkpoints, out_dir / "pretraining_alignment_temperature.png")
        result["plot"] = str(plot) if plot else None
    return result


def _write_results(cfg: MoleculeNetConfig, jobs: list, runs: dict, infos: dict,
                   pretrain_info: dict, computed: list, skipped: list,
                   t_start: float) -> dict[str, Any]:
    """(Re)write results.json and results.md from every finished run, atomically."""
    out_dir = Path(cfg.out_dir)
    info_dir = out_dir / "runs" / cfg.finetune_key()
    for name in cfg.datasets:  # dataset facts even when every run of it was skipped
        path = info_dir / name / "info.json"
        if name in infos:
            if not path.exists():
                write_json_atomic(path, infos[name])
        elif path.exists():
            infos[name] = read_json(path)
    summary = summarize(cfg, runs, infos)
    table_last = results_table(cfg, summary, "last")
    table_best = results_table(cfg, summary, "best_valid")
    result = {
        "recipe": "moleculenet",
        "config": dataclasses.asdict(cfg),
        "pretrain_key": cfg.pretrain_key(), "finetune_key": cfg.finetune_key(),
        "complete": all(j in runs for j in jobs),
        "pretraining": pretrain_info,
        "summary": summary,
        "runs": [runs[j] for j in jobs if j in runs],
        "computed": list(computed), "skipped": list(skipped),
        "wall_seconds_this_call": time.perf_counter() - t_start,
        "table_markdown": table_last, "table_best_valid_markdown": table_best,
    }
    write_json_atomic(out_dir / "results.json", result)
    write_text_atomic(out_dir / "results.md", _markdown_report(cfg, pretrain_info, table_last,
                                                                table_best))
    return result


def _markdown_report(cfg: MoleculeNetConfig, pretrain_info: dict, table_last: str,
                     table_best: str) -> str:
    corpus = next(iter(pretrain_info.values()), {}) if pretrain_info else {}
    lines = [
        "# MoleculeNet transfer: test ROC-AUC (%)",
        "",
        f"Pre-training: {corpus.get('num_molecules', '-')} molecules of "
        f"{corpus.get('corpus', cfg.pretrain_smiles or 'the default ZINC corpus')}, "
        f"{cfg.pretrain_epochs} epochs, batch {cfg.pretrain_batch_size}, lr {cfg.pretrain_lr}, "
        f"aug {cfg.aug} (ratio {cfg.aug_ratio}) on both views, tau {cfg.temperature} "
        f"(MACL tau0 {cfg.temperature}, alpha {cfg.alpha}, A0 {cfg.a0}). Encoder: GIN "
        f"{cfg.num_layers} x {cfg.emb_dim}, JK {cfg.jk}, mean pooling. Fine-tuning: "
        f"{cfg.finetune_epochs} epochs, batch {cfg.batch_size}, lr {cfg.lr}, dropout "
        f"{cfg.dropout}, masked BCE; scaffold split {cfg.frac_train:g}/{cfg.frac_valid:g}/"
        f"{1 - cfg.frac_train - cfg.frac_valid:g}; seeds {cfg.seeds}. Mean ± population std "
        "over seeds; ROC-AUC averaged over tasks with both classes in the test set (tasks "
        "skipped in brackets). Paper columns: Huang et al. 2023 (MACL), Table 5 (2M ZINC15 "
        "molecules, 5 x 300 GIN, 100 + 100 epochs, 10 seeds).",
        "",
        "## Last epoch (the paper's protocol)",
        "",
        table_last,
        "## Epoch with the best validation ROC-AUC",
        "",
        table_best,
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- CLI

_OVERRIDABLE = ("datasets", "inits", "seeds", "pretrain_smiles", "pretrain_molecules",
                "pretrain_epochs", "pretrain_batch_size", "pretrain_lr", "temperature", "alpha",
                "a0", "aug", "aug_ratio", "pretrain_seed", "num_layers", "emb_dim", "jk",
                "finetune_epochs", "batch_size", "lr", "weight_decay", "dropout",
                "max_molecules")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=["paper", "cpu"], default="paper",
                        help="paper: GraphCL/MACL settings; cpu: the ~40-minute CPU configuration "
                             "(options below override either)")
    parser.add_argument("--data-root", default=None,
                        help="folder holding moleculenet/<name>/raw and zinc/; default $ADAPTCL_DATA")
    parser.add_argument("--out-dir", default="results/moleculenet")
    parser.add_argument("--cache-dir", default=None,
                        help="processed-graph cache (default <out-dir>/cache)")
    parser.add_argument("--datasets", nargs="+", choices=ALL_DATASETS, default=None)
    parser.add_argument("--inits", nargs="+", choices=INITS, default=None,
                        help="none (no pre-training), graphcl, macl")
    parser.add_argument("--seeds", nargs="+", type=int, default=None)
    parser.add_argument("--pretrain-smiles", default=None,
                        help="SMILES file for pre-training (default <data-root>/zinc/moses/test.csv.gz)")
    parser.add_argument("--pretrain-molecules", type=int, default=None,
                        help="use the first N SMILES of the file")
    parser.add_argument("--pretrain-epochs", type=int, default=None)
    parser.add_argument("--pretrain-batch-size", type=int, default=None)
    parser.add_argument("--pretrain-lr", type=float, default=None)
    parser.add_argument("--temperature", type=float, default=None, help="tau (tau0 for MACL)")
    parser.add_argument("--alpha", type=float, default=None)
    parser.add_argument("--a0", type=float, default=None)
    parser.add_argument("--aug", choices=AUGMENTATIONS, default=None)
    parser.add_argument("--aug-ratio", type=float, default=None)
    parser.add_argument("--pretrain-seed", type=int, default=None)
    parser.add_argument("--num-layers", type=int, default=None)
    parser.add_argument("--emb-dim", type=int, default=None)
    parser.add_argument("--jk", choices=["last", "sum", "concat"], default=None)
    parser.add_argument("--finetune-epochs", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None, help="fine-tuning batch size")
    parser.add_argument("--lr", type=float, default=None, help="fine-tuning learning rate")
    parser.add_argument("--weight-decay", type=float, default=None)
    parser.add_argument("--dropout", type=float, default=None)
    parser.add_argument("--max-molecules", type=int, default=None,
                        help="first N rows of each CSV (quick looks)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--no-plot", action="store_true")


def config_from_args(args: argparse.Namespace) -> MoleculeNetConfig:
    params: dict[str, Any] = {"data_root": args.data_root, "out_dir": args.out_dir,
                              "cache_dir": args.cache_dir, "threads": args.threads,
                              "progress": not args.no_progress, "plot": not args.no_plot}
    for name in _OVERRIDABLE:
        value = getattr(args, name)
        if value is not None:
            params[name] = value
    factory = MoleculeNetConfig.cpu if args.preset == "cpu" else MoleculeNetConfig.paper
    return factory(**params)


def main(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    result = run_moleculenet(cfg)
    print("Last epoch (paper protocol):")
    print(result["table_markdown"])
    print("Best-validation epoch:")
    print(result["table_best_valid_markdown"])
    print(f"results: {Path(cfg.out_dir) / 'results.json'}  table: "
          f"{Path(cfg.out_dir) / 'results.md'}")
    return 0
