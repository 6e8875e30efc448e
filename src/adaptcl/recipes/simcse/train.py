"""One cell of ``adaptcl simcse``: a loss trained with the adapter's
:func:`~adaptcl.adapters.sentence_transformers.train_simcse` (or the untrained model saved), its
record, and the run folder an interrupted cell resumes from.

Reference: Gao, Yao & Chen, "SimCSE", EMNLP 2021; MACL's sentence setting: Huang et al., ICML
2023, App. B.4.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from adaptcl.adapters.sentence_transformers import (
    SimCSEConfig,
    build_simcse_model,
    make_loss,
    stsb_dev_evaluator,
    train_simcse,
    training_projection,
    unsupervised_dataset,
)
from adaptcl.recipes.engine import Cell
from adaptcl.recipes.engine.errors import distributed_follower, note
from adaptcl.recipes.engine.files import note_corrupt, read_json, write_json_atomic
from adaptcl.recipes.engine.loggers import MetricLogger
from adaptcl.recipes.engine.torch_env import resolve_device, seed_everything
from adaptcl.recipes.simcse.config import SimCSERecipeConfig

CHECKPOINTS = "checkpoints"  # the trainer's output_dir inside a run folder (the adapter's)
RUN_IDENTITY = "identity.json"  # which cell identity a run folder belongs to


def world_size() -> int:
    """The processes of this run (``torchrun`` sets ``WORLD_SIZE``; 1 otherwise)."""
    return int(os.environ.get("WORLD_SIZE", "1") or "1")


def check_processes(run: dict[str, Any], where: str) -> None:
    """Refuse a trained ``run`` whose trainer did not train as the processes launched: the
    cell's identity records those (``processes``), so its record would claim settings it did
    not run with. ``RuntimeError`` (ours or the trainer's fault, not the user's)."""
    launched, ran = world_size(), int(run.get("world_size") or 1)
    if ran != launched:
        raise RuntimeError(f"{where}: launched as {launched} process(es) (WORLD_SIZE) but the "
                           f"trainer trained as {ran}; nothing was stored")


def check_trainer_device(device: str) -> None:
    """Refuse a ``--device`` that transformers' Trainer would not honour; say where it trains.

    The Trainer, not this recipe, places the model: on the first visible GPU (``cuda:0``) in
    one process, spreading each batch over every visible GPU with ``nn.DataParallel`` when
    there are several, and on ``cuda:<LOCAL_RANK>`` under ``torchrun``. ``--device cuda:N``
    for ``N > 0`` would silently train on ``cuda:0``: refused, naming ``CUDA_VISIBLE_DEVICES``
    (the Trainer's own way to choose a GPU).
    """
    index = device.partition(":")[2] if device.startswith("cuda") else ""
    if index and int(index) != 0:
        raise ValueError(f"--device {device}: transformers' Trainer trains on the first visible "
                         f"GPU; choose GPU {index} with CUDA_VISIBLE_DEVICES={index} and "
                         f"--device cuda")
    if device.startswith("cuda") and world_size() == 1:
        import torch

        if torch.cuda.device_count() > 1:
            note(f"transformers' Trainer spreads each batch over the {torch.cuda.device_count()} "
                 f"visible GPUs (nn.DataParallel); for one GPU set CUDA_VISIBLE_DEVICES, for one "
                 f"process per GPU launch with torchrun")


def train_cell(cfg: SimCSERecipeConfig, cell: Cell, model: str, sentences: list[str],
               senteval_root: Path, out: Path, log_dir: Path, *,
               resume: Path | None = None) -> dict[str, Any]:
    """Train the loss ``cell.method`` from ``model`` (or go on from ``resume``); the adapter's
    result, the model under ``out/final``."""
    from adaptcl.evaluation.senteval.data import load_stsb

    seed_everything(cell.seed)
    st_model = build_simcse_model(model, cfg.pooler, max_seq_length=cfg.max_seq_length,
                                  dropout=cfg.dropout)
    projection = None if cell.method == "amcl" else training_projection(cfg.pooler, st_model)
    # under torchrun every rank's in-batch negatives join every other rank's
    loss = make_loss(cell.method, st_model, projection=projection,
                     gather_across_devices=world_size() > 1, tile_size=cfg.tile_size)
    dev = load_stsb(senteval_root, "dev")
    extra = {"bf16-mixed": {"bf16": True}, "16-mixed": {"fp16": True}}.get(cfg.precision, {})
    # use_cpu keeps a CUDA machine's GPU out of a --device cpu run, and --device auto on a
    # machine without one must say so too: without use_cpu, transformers under torchrun finds
    # no GPU and trains as one process (accelerate's PartialState is left undistributed)
    extra = {**extra, "use_cpu": resolve_device(cfg.device) == "cpu"}
    tensorboard_dir = None
    if cfg.logger == "tensorboard":  # live, through transformers' TensorBoardCallback
        tensorboard_dir = log_dir
        # a superseded run's curves (a resumed run adds to its own; rank 0 alone writes them)
        if resume is None and not distributed_follower():
            shutil.rmtree(tensorboard_dir, ignore_errors=True)
    return train_simcse(
        st_model, unsupervised_dataset(sentences), loss,
        SimCSEConfig(output_dir=str(out), batch_size=cfg.batch_size,
                     learning_rate=cfg.learning_rate, epochs=cfg.epochs,
                     max_seq_length=cfg.max_seq_length, eval_steps=cfg.eval_steps,
                     seed=cell.seed, logging_steps=cfg.logging_steps, extra_args=extra),
        dev_evaluator=stsb_dev_evaluator(dev.sentences1, dev.sentences2, dev.scores),
        resume_from_checkpoint=str(resume) if resume else None, tensorboard_dir=tensorboard_dir,
        progress=cfg.progress)


def claim_run_folder(out: Path, identity_hash: str) -> bool:
    """Make ``out`` the run folder of ``identity_hash``: ``True`` when an interrupted run of that
    identity left it (it may resume), else the folder is emptied and marked (``False``)."""
    try:
        same = read_json(out / RUN_IDENTITY).get("identity_hash") == identity_hash
    except (OSError, ValueError, AttributeError):  # none, unreadable, not a mapping
        same = False
    if not same:
        if out.exists():
            shutil.rmtree(out)
        write_json_atomic(out / RUN_IDENTITY, {"identity_hash": identity_hash})
    return same


def resume_point(out: Path, where: str) -> Path | None:
    """The last complete trainer checkpoint in ``out`` (announced on stderr), or ``None``; a
    newer one that cannot be resumed whole is kept aside as ``out/checkpoint-<step>.corrupt``,
    outside the trainer's folder, whose rotation would delete it."""
    from adaptcl.adapters.sentence_transformers import last_complete_checkpoint

    def set_aside(folder: Path, err: Exception) -> None:
        target = out / f"{folder.name}.corrupt"
        shutil.rmtree(target, ignore_errors=True)  # an older copy of the same step
        note_corrupt("checkpoint", folder, err, f"kept aside as {target} and passed over")
        os.replace(folder, target)

    resume = last_complete_checkpoint(out / CHECKPOINTS, on_incomplete=set_aside)
    if resume is not None:
        print(f"adaptcl: {where} resumes from {resume}", file=sys.stderr, flush=True)
    return resume


def untrained_run(cfg: SimCSERecipeConfig, model: str, seed: int, out: Path) -> dict[str, Any]:
    """The starting point, saved as :func:`train_cell` saves a trained model (no step)."""
    seed_everything(seed)
    st_model = build_simcse_model(model, cfg.pooler, max_seq_length=cfg.max_seq_length)
    st_model.save(str(out / "final"))
    return {"final_model": str(out / "final"), "global_step": 0, "history": [],
            "best_dev_spearman": None}


def run_record(run: dict[str, Any], train_seconds: float) -> dict[str, Any]:
    """The stored record of a :func:`train_cell` or :func:`untrained_run` result (``best dev``
    Spearman x 100 and ``final loss`` as its metrics, when there are)."""
    metrics: dict[str, float] = {}
    if run.get("best_dev_spearman") is not None:
        metrics["best dev"] = 100.0 * float(run["best_dev_spearman"])
    losses = [float(h["loss"]) for h in run["history"] if "loss" in h]
    if losses:
        metrics["final loss"] = losses[-1]
    history = [{k: v for k, v in h.items() if isinstance(v, (int, float, str))}
               for h in run["history"]]
    return {"metrics": metrics, "optimisation_steps": int(run["global_step"]), "losses": losses,
            "train_seconds": train_seconds, "history": history,
            "final_model": run["final_model"], "best_checkpoint": run.get("best_checkpoint"),
            "loss": run.get("loss"), "loss_config": run.get("loss_config"),
            "processes": int(run.get("world_size") or 1)}


def write_training_logs(record: dict[str, Any], kind: str, folder: Path) -> None:
    """``--logger csv``: a run's logged curves in ``folder/metrics.csv`` (tensorboard's are
    written live by the trainer)."""
    if kind != "csv":
        return
    shutil.rmtree(folder, ignore_errors=True)  # a superseded run's curves
    with MetricLogger(kind, folder) as logger:
        for row in record.get("history", []):
            logger.log({k: v for k, v in row.items() if k not in ("step", "epoch")},
                       int(row.get("step", 0)))
