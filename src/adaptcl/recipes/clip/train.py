"""One cell of ``adaptcl clip``: a CLIP trained with one loss and targets from one seed by
Lightning (resumed from the ``last.ckpt`` an interrupted run left, with the random states the
batches' order draws from: a resumed run is the uninterrupted one), then scored by zero-shot
top-1 on the test images and image/text R@1 on the retrieval subset."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from adaptcl.adapters.lightning.trainer import (
    RandomStates,
    StepMeter,
    TrainingClock,
    build_trainer,
)
from adaptcl.evaluation.clip import encode_images, encode_texts, retrieval_r1, zero_shot_top1
from adaptcl.plugins.validation import NonFiniteError
from adaptcl.recipes.clip.config import ClipConfig, parse_column
from adaptcl.recipes.clip.data import CaptionTokens, ClipData, pair_datasets, templates_of
from adaptcl.recipes.clip.model import ClipModule, build_clip
from adaptcl.recipes.common.lightning import fit, resume_checkpoint
from adaptcl.recipes.common.step_cost import step_cost
from adaptcl.recipes.engine.cells import Cell
from adaptcl.recipes.engine.errors import DivergedError, NonResultError, require_steps
from adaptcl.recipes.engine.loggers import lightning_logger
from adaptcl.recipes.engine.progress import on_terminal
from adaptcl.recipes.engine.torch_env import loader_options, resolve_device, seed_everything


def loss_options(loss: str, targets: str, cfg: ClipConfig) -> dict[str, Any]:
    """The method keywords of ``loss`` from ``cfg``; MACL with ``labels`` targets runs without
    its reweighting (the adapter's requirement: ``W = 1 - P_pos`` is per anchor with one
    positive), its adaptive temperature kept."""
    if loss == "macl":
        return {"alpha": cfg.alpha, "a0": cfg.a0, "reweight": targets == "pairs"}
    if loss == "dystress":
        return {"min_temperature": cfg.min_temperature, "max_temperature": cfg.max_temperature}
    return {}


def build_loss(loss: str, targets: str, cfg: ClipConfig) -> torch.nn.Module:
    """The open_clip adapter's drop-in for ``ClipLoss`` named ``loss`` (one process), at the
    run's tile size."""
    from adaptcl.adapters.open_clip import build_clip_loss

    return build_clip_loss(loss, tile_size=cfg.tile_size, **loss_options(loss, targets, cfg))


def evaluate(model: Any, data: ClipData, tokens: CaptionTokens, retrieval: Any,
             cfg: ClipConfig, device: str) -> dict[str, float]:
    """Zero-shot top-1 on the test images, image->text and text->image R@1 on ``retrieval``."""
    from adaptcl.recipes.clip.data import to_tensor

    model = model.to(device)
    batch = max(cfg.batch_size, 256)
    top1 = zero_shot_top1(model, tokens.tokenizer, to_tensor(data.test_images),
                          data.test_labels, data.classnames, templates_of(cfg),
                          batch_size=batch, device=device)
    images = encode_images(model, retrieval.images, batch, device)
    texts = encode_texts(model, retrieval.tokens, batch, device)
    return {"zero_shot_top1": top1, **retrieval_r1(images, texts, retrieval.labels)}


def train_and_score(cfg: ClipConfig, data: ClipData, tokens: CaptionTokens, cell: Cell,
                    ckpt_dir: Path, log_dir: Path) -> dict[str, Any]:
    """Train (or resume) and evaluate one cell."""
    loss_name, targets = parse_column(cell.loss)
    resume = resume_checkpoint(ckpt_dir)
    seed_everything(cell.seed)
    train, retrieval = pair_datasets(data, tokens, cfg)
    device = resolve_device(cfg.device)
    loader = DataLoader(train, batch_size=cfg.batch_size, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(cell.seed),
                        **loader_options(device, cfg.num_workers))
    module = ClipModule(build_clip(cfg), build_loss(loss_name, targets, cfg),
                        multi_positive=targets == "labels", lr=cfg.lr,
                        weight_decay=cfg.weight_decay, warmup_steps=cfg.warmup_steps,
                        mini_batch_size=cfg.mini_batch_size)
    clock, meter = TrainingClock(), StepMeter()
    # the batches' order draws from these: resumed, the run goes on as it would have
    states = RandomStates({"order": loader.generator})
    trainer = build_trainer(cfg.epochs, device=device, precision=cfg.precision,
                            logger=lightning_logger(cfg.logger, log_dir), ckpt_dir=ckpt_dir,
                            callbacks=[clock, meter, states], progress=on_terminal(cfg.progress))
    try:
        with warnings.catch_warnings():  # DySTreSS ignores logit_scale by design (its docs)
            warnings.filterwarnings("ignore", "DySTreSSClipLoss ignores logit_scale",
                                    UserWarning)
            fit(trainer, module, train_dataloaders=loader,
                ckpt_path=str(resume) if resume is not None else None)
    except NonFiniteError as err:  # the loss met NaN features: the weights diverged
        step = trainer.global_step + 1
        last = module.history[-1] if module.history else None
        before = (f"; the last loss was {last['loss']:.4g} at step {int(last['step']) + 1}"
                  if last else "")
        raise DivergedError(f"{cell.label()}: {err} at step {step}{before}", step=step) from None
    history = module.history
    require_steps(len(history), cell.label())
    start = time.perf_counter()
    try:
        metrics = evaluate(module.model, data, tokens, retrieval, cfg, device)
    except NonFiniteError as err:
        raise DivergedError(f"{cell.label()}: {err}") from None
    except ValueError as err:  # a collapsed tower is no result
        raise NonResultError(f"{cell.label()}: {err}") from None
    last = history[-1]
    return {"metrics": metrics, "optimisation_steps": len(history), "targets": targets,
            "loss_options": loss_options(loss_name, targets, cfg),
            "losses": [h["loss"] for h in history],
            "final_temperature": float(1 / module.model.logit_scale.detach().exp()),
            "final_loss_temperature": last.get("loss_temperature"),
            "final_alignment": last.get("alignment"), "train_seconds": clock.seconds,
            **step_cost(meter), "eval_seconds": time.perf_counter() - start, "resumed_from": module.resumed_from,
            "checkpoint_dir": str(ckpt_dir), "history": history}
