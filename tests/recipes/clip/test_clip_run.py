"""``adaptcl clip`` end to end on a tiny setting: the result files, a second run that reuses
every stored cell, a changed setting that recomputes, and determinism."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("open_clip")
pytest.importorskip("pytorch_lightning")

from adaptcl import cli  # noqa: E402
from adaptcl.recipes.clip.config import ClipConfig  # noqa: E402
from adaptcl.recipes.clip.recipe import ClipRecipe  # noqa: E402

TINY = ["--train-limit", "64", "--test-limit", "40", "--retrieval-limit", "20",
        "--batch-size", "32", "--epochs", "1", "--warmup-steps", "1", "--patch-size", "16",
        "--vision-width", "32", "--text-width", "32", "--head-width", "16",
        "--vision-layers", "1", "--text-layers", "1", "--embed-dim", "16", "--templates", "3",
        "--context-length", "12", "--threads", "1", "--device", "cpu", "--no-progress"]

TINY_CONFIG = dict(train_limit=64, test_limit=40, retrieval_limit=20, batch_size=32, epochs=1,
                   warmup_steps=1, patch_size=16, vision_width=32, text_width=32, head_width=16,
                   vision_layers=1, text_layers=1, embed_dim=16, templates=3, context_length=12,
                   threads=1, device="cpu", progress=False)


def test_a_tiny_run_writes_its_table_and_a_rerun_reuses_every_cell(shared_data, tmp_path,
                                                                  capsys):
    out = tmp_path / "clip"
    argv = ["clip", "--data-root", str(shared_data), "--output-dir", str(out),
            "--losses", "infonce", "--targets", "pairs", "labels", "--seeds", "0", "1", *TINY]
    assert cli.main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    assert not result["partial"] and len(result["computed"]) == 4 and not result["reused"]
    runs = {(r["cell"]["loss"], r["cell"]["seed"]): r for r in result["runs"]}
    assert set(runs) == {(c, s) for c in ("infonce", "infonce+labels") for s in (0, 1)}
    for (column, _), run in runs.items():
        assert run["targets"] == ("labels" if column.endswith("+labels") else "pairs")
        assert run["optimisation_steps"] == 2  # 64 pairs, batch 32, one epoch
        assert set(run["metrics"]) == {"zero_shot_top1", "i2t_r1", "t2i_r1"}
        assert all(0 <= v <= 1 for v in run["metrics"].values())
        assert 0.01 <= run["final_temperature"] <= 1.0  # logit_scale clamped to [0, ln 100]
    for seed in (0, 1):  # the same initialisation and batches; the targets change the loss
        assert runs[("infonce+labels", seed)]["losses"][0] != runs[("infonce", seed)]["losses"][0]
    markdown = (out / "results.md").read_text()
    assert "## zero_shot_top1" in markdown and "infonce+labels" in markdown
    assert "paired over seeds with a 95% t-interval" in markdown
    assert "clip" in (out / "config.yaml").read_text()
    capsys.readouterr()

    assert cli.main(argv) == 0  # the same command: every cell is reused, none computed
    again = json.loads((out / "results.json").read_text())
    assert len(again["reused"]) == 4 and not again["computed"]
    assert {(r["cell"]["loss"], r["cell"]["seed"]): r["metrics"] for r in again["runs"]} == {
        k: r["metrics"] for k, r in runs.items()}

    # --targets pairs alone is a subset of the stored grid: reused, not recomputed
    assert cli.main([*argv[:argv.index("--targets")], "--targets", "pairs",
                     *argv[argv.index("--seeds"):]]) == 0
    subset = json.loads((out / "results.json").read_text())
    assert len(subset["reused"]) == 2 and not subset["computed"]


def test_the_same_cell_trains_to_the_same_numbers(shared_data, tmp_path):
    def metrics(folder: str) -> dict:
        cfg = ClipConfig(data_root=str(shared_data), output_dir=str(tmp_path / folder),
                         losses=["infonce"], targets=["pairs"], seeds=[3], **TINY_CONFIG)
        return ClipRecipe(cfg).run()["runs"][0]

    first, second = metrics("a"), metrics("b")
    assert first["metrics"] == second["metrics"] and first["losses"] == second["losses"]


def test_a_cell_resumes_from_the_checkpoint_an_interrupted_run_left(shared_data, tmp_path):
    """The training of one cell stopped after its first epoch (``last.ckpt`` written) goes on
    from there: the second call trains only the second epoch."""
    from adaptcl.recipes.clip.data import CaptionTokens, load_clip_data, templates_of
    from adaptcl.recipes.clip.train import train_and_score
    from adaptcl.recipes.engine.cells import Cell

    one, two = (ClipConfig(data_root=str(shared_data), losses=["macl"], targets=["labels"],
                           **(TINY_CONFIG | {"epochs": epochs})) for epochs in (1, 2))
    data = load_clip_data(shared_data, one)
    tokens = CaptionTokens(data.classnames, templates_of(one), one.context_length)
    cell = Cell((("dataset", "cifar10"), ("loss", "macl+labels")), 0)
    ckpt, logs = tmp_path / "ckpt", tmp_path / "logs"
    first = train_and_score(one, data, tokens, cell, ckpt, logs)
    assert first["resumed_from"] is None and first["optimisation_steps"] == 2
    assert (ckpt / "last.ckpt").is_file()
    second = train_and_score(two, data, tokens, cell, ckpt, logs)
    assert second["resumed_from"] == {"checkpoint_epoch": 0, "checkpoint_global_step": 2,
                                      "start_epoch": 1, "start_global_step": 2}
    assert second["optimisation_steps"] == 4  # the first epoch's history came with it
    assert second["losses"][:2] == first["losses"]
    assert second["loss_options"] == {"alpha": 0.5, "a0": 0.0, "reweight": False}
    # MACL's own temperature, tau0 * (1 + alpha * A) with tau0 = 1 / logit_scale, is recorded
    last = second["history"][-1]
    assert last["loss_temperature"] == second["final_loss_temperature"]
    assert last["loss_temperature"] == pytest.approx(
        last["temperature"] * (1 + 0.5 * last["alignment"]), rel=1e-4)


def test_the_presets_build_their_open_clip_towers():
    import torch

    from adaptcl.recipes.clip.config import PRESETS
    from adaptcl.recipes.clip.model import build_clip

    for name, preset in PRESETS.items():
        cfg = ClipConfig(**preset)
        model = build_clip(cfg)
        tokens = torch.zeros(2, cfg.context_length, dtype=torch.long)
        tokens[:, 0], tokens[:, 1] = 49406, 49407  # start, end of text
        image, text, scale = model(torch.zeros(2, 3, 32, 32), tokens)
        assert image.shape == text.shape == (2, cfg.embed_dim), name
        assert float(scale.detach()) == pytest.approx(1 / cfg.init_temperature, rel=1e-5)
        assert model.visual.patch_size == (cfg.patch_size, cfg.patch_size)
        assert len(model.transformer.resblocks) == cfg.text_layers


def test_the_learned_logit_scale_is_clamped_after_every_step_as_open_clip_does():
    import math

    import torch

    from adaptcl.recipes.clip.model import ClipModule, build_clip

    module = ClipModule(build_clip(ClipConfig(**TINY_CONFIG)), torch.nn.Identity(),
                        multi_positive=False, lr=1e-3, weight_decay=0.1, warmup_steps=1)
    for value, clamped in ((6.0, math.log(100)), (-0.5, 0.0), (3.0, 3.0)):
        module.model.logit_scale.data.fill_(value)
        module.on_train_batch_end(None, None, 0)
        assert float(module.model.logit_scale) == pytest.approx(clamped)
