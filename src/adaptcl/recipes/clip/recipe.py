"""``adaptcl clip``: CLIP from scratch (small open_clip towers) on CIFAR-10 images with
prompt-template captions, one column per loss and targets; zero-shot top-1 and image/text R@1.
The protocol, presets and outputs are on the docs page ``docs/recipes/clip.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adaptcl.io import resolve_data_root
from adaptcl.recipes.clip.config import PRESETS, ClipConfig, parse_column
from adaptcl.recipes.common.cifar_settings import apply_limits
from adaptcl.recipes.common.step_cost import step_note
from adaptcl.recipes.engine import Cell, Recipe, ReportSpec, note
from adaptcl.recipes.engine.sweep import Point
from adaptcl.recipes.engine.torch_env import check_lightning_precision

EXAMPLE = """adaptcl clip --data-root ../shared/data --losses infonce macl dystress \\
    --targets pairs labels --seeds 0 1 2 --threads 1
adaptcl clip --preset paper --device cuda --precision bf16-mixed --seeds 0 1 2"""

METRICS = ("zero_shot_top1", "i2t_r1", "t2i_r1")


class ClipRecipe(Recipe):
    """``adaptcl clip``: every (loss and targets, point, seed) trained and scored."""

    name, config_class, presets, example = "clip", ClipConfig, PRESETS, EXAMPLE
    description = ("CLIP from scratch (small open_clip towers) on CIFAR-10 with prompt "
                   "captions: zero-shot top-1 + image/text R@1")
    axes = ("dataset", "loss")
    code = ("adaptcl.recipes.clip", "adaptcl.recipes.common.cifar", "adaptcl.evaluation.clip",
            "adaptcl.adapters.open_clip", "adaptcl.adapters.lightning.trainer", "adaptcl.plugins")
    frameworks = ("open_clip_torch", "pytorch-lightning")

    def prepare(self, configs: Mapping[Point, ClipConfig]) -> None:
        """The images of every point (each set loaded once), the limits as applied to them
        (:func:`~adaptcl.recipes.common.cifar_settings.apply_limits`), that a batch fits them,
        that the captions fit the context; their fingerprints. Nothing is written."""
        from adaptcl.recipes.clip.data import (
            CaptionTokens,
            check_batch,
            load_clip_data,
            templates_of,
        )

        self.check_targets()
        self.data_root = resolve_data_root(self.config.data_root)
        self._data: dict[Any, Any] = {}
        self._tokens: dict[Any, Any] = {}
        notes: dict[str, None] = {}  # each said once, however many points it concerns
        for config in configs.values():
            check_lightning_precision(config.device, config.precision)
            key = config.data_settings()
            if key not in self._data:
                self._data[key] = load_clip_data(self.data_root, config)
            data = self._data[key]
            notes[apply_limits(config, {"train_limit": len(data.train_labels),
                                        "test_limit": len(data.test_labels),
                                        "retrieval_limit": len(data.test_labels)},
                               data.source) or ""] = None
            self._data[config.data_settings()] = data  # under the limits as applied too
            check_batch(data, config)
            text_key = (config.templates, config.context_length)
            if text_key not in self._tokens:
                self._tokens[text_key] = CaptionTokens(self._data[key].classnames,
                                                       templates_of(config),
                                                       config.context_length)
        self.fingerprints = {self.rows()[0]: self.data_of(self.config).fingerprint}
        for message in filter(None, notes):
            note(message)

    def check_targets(self) -> None:
        """Refuse a loss the adapter gives no multi-positive targets with ``--targets labels``."""
        from adaptcl.adapters.open_clip import CLIP_LOSSES

        if "labels" in self.config.targets:
            for loss in self.config.losses:
                if not CLIP_LOSSES[loss].takes_labels:
                    raise ValueError(f"loss {loss} takes no labels (multi-positive targets): "
                                     "drop it from --losses or labels from --targets")

    def data_of(self, config: ClipConfig) -> Any:
        """The images of ``config`` (loaded by :meth:`prepare`)."""
        return self._data[config.data_settings()]

    def rows(self) -> list[str]:
        return [self.data_of(self.config).name]

    def methods(self) -> list[str]:
        """A column per loss and targets: ``infonce``, ..., ``infonce+labels``, ..."""
        return self.config.columns()

    def cells(self) -> list[Cell]:
        """Seed by seed: a seed's paired differences are there as soon as its columns are."""
        return [self.cell(row, column, seed, point) for point in self.sweep.points()
                for seed in self.seeds() for row in self.rows() for column in self.methods()]

    def loss_of(self, method: str) -> str:
        """The loss of a column (``macl+labels``: ``macl``)."""
        return parse_column(method)[0]

    def identity(self, cell: Cell, config: ClipConfig) -> dict[str, Any]:
        """The settings, the fingerprint of the cell's images, the code."""
        return super().identity(cell, config) | {"data": self.data_of(config).fingerprint}

    def compute(self, cell: Cell, config: ClipConfig) -> dict[str, Any] | None:
        from adaptcl.recipes.clip.train import train_and_score

        return train_and_score(config, self.data_of(config),
                               self._tokens[(config.templates, config.context_length)], cell,
                               self.checkpoint_dir(cell, config),
                               self.layout.cell_folder("logs", cell))

    def report_spec(self) -> ReportSpec:
        cfg, data = self.config, self.data_of(self.config)
        header = (f"# clip: CLIP from scratch on {data.name}, preset {self.preset}\n\n"
                  f"{data.source}: {len(data.train_labels)} training image-caption pairs, "
                  f"zero-shot top-1 on {len(data.test_labels)} test images, R@1 on the first "
                  f"{cfg.retrieval_limit} test images and their "
                  f"captions (correct: the retrieved item has the query's class); captions "
                  f"from {cfg.templates} of CLIP's CIFAR-10 templates. ViT {cfg.vision_layers}"
                  f"x{cfg.vision_width} patch {cfg.patch_size}, text {cfg.text_layers}x"
                  f"{cfg.text_width}, embedding {cfg.embed_dim}; {cfg.epochs} epochs, batch "
                  f"{cfg.batch_size}, AdamW lr {cfg.lr}, precision {cfg.precision}; "
                  "`+labels`: multi-positive targets (every caption of the image's class). "
                  "Settings in results.json. Percent, mean ± population std over seeds; "
                  f"differences against {self.methods()[0]} paired over seeds with a 95% "
                  "t-interval.\n\n")
        return ReportSpec(metrics=METRICS, baseline=self.methods()[0],
                          header=lambda grid: header + step_note(grid.records),
                          details=lambda grid: {"data": data.describe()})


RECIPE = ClipRecipe
