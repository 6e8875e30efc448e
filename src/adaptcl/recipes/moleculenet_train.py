"""Pre-training and fine-tuning of the ``moleculenet`` recipe (GraphCL on Hu et al.'s GIN).

:func:`pretrain` trains (or resumes, or reuses) the GraphCL encoder on a SMILES corpus and
checkpoints it every epoch (on several devices, ``devices > 1``, through Lightning:
:func:`pretrain_distributed`); :func:`finetune_one` fine-tunes a pre-trained (or fresh) encoder
with a linear head on one MoleculeNet set's scaffold split and scores test ROC-AUC after every
epoch.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaptcl.io import resolve_data_root
from adaptcl.recipes.template.errors import RecipeError, require_steps
from adaptcl.recipes.template.files import torch_load_checked, torch_save_atomic
from adaptcl.recipes.template.loggers import metric_logger
from adaptcl.recipes.template.torch_env import loader_options, resolve_device, seed_everything

if TYPE_CHECKING:
    from adaptcl.recipes.moleculenet import MoleculeNetConfig
    from adaptcl.recipes.template.store import Cell


def build_encoder(cfg: MoleculeNetConfig, dropout: float):
    from adaptcl.adapters.graphcl import MolGINEncoder

    return MolGINEncoder(num_layers=cfg.num_layers, emb_dim=cfg.emb_dim, drop_ratio=dropout,
                         jk=cfg.jk, pooling="mean")


def build_classifier(cfg: MoleculeNetConfig, num_tasks: int):
    """MolGIN encoder (dropout ``cfg.dropout``) + mean pooling + linear head (Hu et al.)."""
    from adaptcl.adapters.graphcl import MolPropertyModel

    return MolPropertyModel(build_encoder(cfg, cfg.dropout), num_tasks)


# ------------------------------------------------------------------------ pre-training


def load_pretrain_corpus(cfg: MoleculeNetConfig):
    from adaptcl.adapters.graphcl.molecules import load_smiles_dataset

    return load_smiles_dataset(cfg.resolved_pretrain_smiles(), cache_dir=cfg.cache_path(),
                               limit=cfg.pretrain_molecules, progress=cfg.progress)


def pretrain_loss(cfg: MoleculeNetConfig, loss_name: str):
    """The pre-training loss of ``loss_name`` (``graphcl`` or ``macl``) with the run's settings."""
    from adaptcl.adapters.graphcl import graphcl_loss

    kwargs = {"alpha": cfg.alpha, "a0": cfg.a0} if loss_name == "macl" else {}
    return graphcl_loss(loss_name, temperature=cfg.temperature, **kwargs)


def pretrain(cfg: MoleculeNetConfig, loss_name: str, final: Path, corpus=None) -> dict[str, Any]:
    """Pre-train (or resume / reuse) the GraphCL encoder with ``loss_name``; return the checkpoint.

    ``final`` is where the finished checkpoint goes (named by its identity); a ``.partial.pt``
    next to it holds model, optimiser and RNG states after each epoch, so an interrupted run
    resumes exactly; corrupt checkpoints are recomputed.
    """
    import torch
    from torch_geometric.loader import DataLoader

    from adaptcl.adapters.graphcl import GraphCL, TwoViewDataset, graphcl_augmentation
    from adaptcl.recipes.graph_common import train_epochs

    done = torch_load_checked(final, what="pre-trained encoder", weights_only=True)
    if done is not None:
        return done
    partial = final.with_suffix(".partial.pt")
    corpus = corpus if corpus is not None else load_pretrain_corpus(cfg)
    if len(corpus) < 2:
        raise RecipeError("the pre-training corpus needs at least 2 valid molecules")
    if cfg.devices > 1:
        return pretrain_distributed(cfg, loss_name, final, corpus)
    seed_everything(cfg.pretrain_seed)
    device = resolve_device(cfg.device)
    model = GraphCL(build_encoder(cfg, dropout=0.0), xavier_init=False,
                    loss_fn=pretrain_loss(cfg, loss_name))
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.pretrain_lr)
    aug_gen = torch.Generator().manual_seed(cfg.pretrain_seed)
    shuffle_gen = torch.Generator().manual_seed(cfg.pretrain_seed + 1)
    state: dict[str, Any] = {"epoch": 0, "epoch_loss": [], "epoch_seconds": [], "steps": 0,
                             "step_stats": {}}
    saved = torch_load_checked(partial, what="partial pre-training checkpoint",
                               weights_only=True)
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        aug_gen.set_state(saved["aug_gen"])
        shuffle_gen.set_state(saved["shuffle_gen"])
        torch.set_rng_state(saved["torch_rng"])
        state = saved["state"]
        print(f"adaptcl: pre-training {loss_name} resumes from epoch {state['epoch'] + 1} of "
              f"{cfg.pretrain_epochs} ({partial})", file=sys.stderr, flush=True)
    aug = graphcl_augmentation(cfg.aug, cfg.aug_ratio, generator=aug_gen)
    loader = DataLoader(TwoViewDataset(corpus, aug, aug), batch_size=cfg.pretrain_batch_size,
                        shuffle=True, generator=shuffle_gen, **loader_options(device))
    clock = [time.perf_counter()]

    def checkpoint_epoch(epoch: int, loss: float, steps: int) -> None:
        state["epoch_loss"].append(loss)
        state["epoch_seconds"].append(time.perf_counter() - clock[0])
        state.update(epoch=epoch + 1, steps=steps)
        torch_save_atomic({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                           "aug_gen": aug_gen.get_state(), "shuffle_gen": shuffle_gen.get_state(),
                           "torch_rng": torch.get_rng_state(), "state": state}, partial)
        clock[0] = time.perf_counter()

    with metric_logger(cfg.logger, Path(cfg.output_dir) / "logs" / final.stem) as logger:
        train_epochs(model, loader, optimizer,
                     epochs=range(state["epoch"], cfg.pretrain_epochs), progress=cfg.progress,
                     desc=f"pre-train {loss_name}", on_epoch_end=checkpoint_epoch,
                     step=state["steps"], device=device, precision=cfg.precision,
                     stats=state["step_stats"], logger=logger)
    require_steps(state["steps"], f"pre-training {loss_name}")
    checkpoint = encoder_checkpoint(cfg, loss_name, model, corpus, state)
    torch_save_atomic(checkpoint, final)
    partial.unlink(missing_ok=True)
    return checkpoint


def encoder_checkpoint(cfg: MoleculeNetConfig, loss_name: str, model, corpus,
                       training: dict[str, Any]) -> dict[str, Any]:
    """What a finished pre-training stores: the encoder's weights, the loss, the corpus and
    ``training``'s epoch losses and seconds, steps and per-step statistics."""
    return {"encoder": model.encoder.state_dict(), "loss": loss_name,
            "loss_module": repr(model.loss_fn), "num_molecules": len(corpus),
            "num_invalid": corpus.num_invalid, "corpus": str(cfg.resolved_pretrain_smiles()),
            **{k: training[k] for k in ("epoch_loss", "epoch_seconds", "steps", "step_stats")}}


def pretrain_distributed(cfg: MoleculeNetConfig, loss_name: str, final: Path,
                         corpus) -> dict[str, Any] | None:
    """Pre-train on ``cfg.devices`` processes with Lightning (``cfg.strategy``, e.g. ``"ddp"``).

    :func:`~adaptcl.recipes.graph_distributed.pretrain_on_devices` trains the model of
    :func:`pretrain`: each rank takes ``pretrain_batch_size / devices`` molecules a step and
    the loss sees the gathered batch; each rank draws its augmentations from its own stream
    (seed ``pretrain_seed + 1_000_003 * rank``), the molecules are shuffled with
    ``pretrain_seed + 1``. Lightning's ``last.ckpt`` in ``<final>.lightning/`` is written every
    epoch and resumed (model, optimiser, loop state; the augmentation streams start again).
    Rank 0 writes the checkpoint :func:`pretrain` returns and gets it; the other ranks get
    ``None``.
    """
    import shutil

    import torch

    from adaptcl.adapters.graphcl import GraphCL, TwoViewDataset, graphcl_augmentation
    from adaptcl.recipes.graph_common import AUGMENTATION_RANK_STRIDE, rank_logger
    from adaptcl.recipes.graph_distributed import pretrain_on_devices

    seed_everything(cfg.pretrain_seed)  # the same initial weights on every rank
    model = GraphCL(build_encoder(cfg, dropout=0.0), xavier_init=False,
                    loss_fn=pretrain_loss(cfg, loss_name))

    def pairs(rank: int) -> TwoViewDataset:
        aug = graphcl_augmentation(cfg.aug, cfg.aug_ratio, generator=torch.Generator().manual_seed(
            cfg.pretrain_seed + AUGMENTATION_RANK_STRIDE * rank))
        return TwoViewDataset(corpus, aug, aug)

    ckpt_dir = final.with_suffix(".lightning")
    with rank_logger(cfg.logger, Path(cfg.output_dir) / "logs" / final.stem) as logger:
        run = pretrain_on_devices(
            model, pairs, devices=cfg.devices, strategy=cfg.strategy,
            epochs=cfg.pretrain_epochs, batch_size=cfg.pretrain_batch_size, lr=cfg.pretrain_lr,
            device=resolve_device(cfg.device), precision=cfg.precision,
            shuffle_seed=cfg.pretrain_seed + 1, where=f"pre-training {loss_name}",
            progress=cfg.progress, checkpoint_dir=ckpt_dir, logger=logger)
    if run is None:
        return None
    checkpoint = encoder_checkpoint(cfg, loss_name, model, corpus, run) | {
        "devices": cfg.devices, "strategy": cfg.strategy}
    torch_save_atomic(checkpoint, final)
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    return checkpoint


# ------------------------------------------------------------------------- fine-tuning


def load_split_dataset(cfg: MoleculeNetConfig, name: str):
    """A MoleculeNet set and its scaffold split (train, valid, test index lists)."""
    from adaptcl.adapters.graphcl.molecules import load_moleculenet, scaffold_split

    root = resolve_data_root(cfg.data_root)
    try:
        dataset = load_moleculenet(name, root, cache_dir=cfg.cache_path(),
                                   limit=cfg.max_molecules)
    except (ValueError, KeyError) as err:  # malformed CSV: name the set and the root
        raise RecipeError(f"reading MoleculeNet {name!r} under {root}: {err}") from err
    split = scaffold_split(dataset.smiles, cfg.frac_train, cfg.frac_valid,
                           1.0 - cfg.frac_train - cfg.frac_valid)
    return dataset, split


def evaluate(model, graphs, device: str = "cpu") -> dict[str, Any]:
    """Multi-task ROC-AUC of ``model`` (eval mode, no gradient) on a list of labelled graphs."""
    from adaptcl.evaluation.graphs import multitask_roc_auc
    from adaptcl.recipes.graph_common import embed_graphs

    model.eval()
    scores, labels = embed_graphs(model, graphs, device=device,
                                  where="fine-tuned model scores", allow_constant=True)
    return multitask_roc_auc(labels, scores)


def finetune_one(cfg: MoleculeNetConfig, cell: Cell, dataset, split,
                 encoder_state: dict | None, logger=None) -> dict[str, Any]:
    """Fine-tune one (dataset, init, seed); ROC-AUC on valid and test after every epoch."""
    import torch
    from torch_geometric.loader import DataLoader

    from adaptcl.evaluation.graphs import masked_bce_loss
    from adaptcl.recipes.graph_common import train_epochs

    train, valid, test = ([dataset[i] for i in part] for part in split)
    seed_everything(cell.seed)
    device = resolve_device(cfg.device)
    model = build_classifier(cfg, dataset.num_tasks)
    if encoder_state is not None:
        model.encoder.load_state_dict(encoder_state)
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    loader = DataLoader(train, batch_size=cfg.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(cell.seed),
                        **loader_options(device))
    history: dict[str, list] = {"train_loss": [], "valid_roc": [], "test_roc": []}
    last: dict[str, Any] = {}

    def evaluate_epoch(epoch: int, loss: float, steps: int) -> None:
        last.update(val=evaluate(model, valid, device), tst=evaluate(model, test, device))
        history["train_loss"].append(loss)
        for key, res in (("valid_roc", last["val"]), ("test_roc", last["tst"])):
            history[key].append(None if math.isnan(res["mean"]) else res["mean"])
            if logger is not None:
                logger.log({f"eval/{key}": history[key][-1]}, steps)

    start = time.perf_counter()
    _, steps = train_epochs(model, loader, optimizer,
                            lambda b: masked_bce_loss(model(b), b.y),
                            epochs=range(cfg.finetune_epochs), progress=cfg.progress,
                            desc=cell.label(), on_epoch_end=evaluate_epoch, device=device,
                            precision=cfg.precision, logger=logger)
    tst = last["tst"]
    finite = [(v, i) for i, v in enumerate(history["valid_roc"]) if v is not None]
    best = max(finite, key=lambda t: (t[0], -t[1]))[1] if finite else len(finite) - 1
    metrics = {"test_roc_last": history["test_roc"][-1], "test_roc_best_valid":
               history["test_roc"][best]}
    return {"metrics": metrics, "optimisation_steps": steps, "losses": history["train_loss"],
            "best_epoch": best + 1, "valid_roc_best": history["valid_roc"][best],
            "test_per_task_last": tst["per_task"], "test_tasks_skipped": tst["num_skipped"],
            "num_tasks": dataset.num_tasks, "split_sizes": [len(train), len(valid), len(test)],
            "history": history, "train_seconds": time.perf_counter() - start}
