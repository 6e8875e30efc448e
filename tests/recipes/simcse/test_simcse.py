"""The simcse recipe end to end on a tiny RoBERTa, the real wiki sample and real STS data: trains,
scores, reuses a finished run only while nothing that determines it has changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("sentence_transformers")

import adaptcl.recipes.simcse_training as training  # noqa: E402
from adaptcl.recipes.simcse import SimCSERecipe, SimCSERecipeConfig  # noqa: E402
from adaptcl.recipes.template.errors import RecipeError  # noqa: E402
from adaptcl.recipes.template.store import Cell, GridRun
from tests.adapters._tiny_models import build_tiny_model  # noqa: E402


def _config(model, shared_data, out, **overrides):
    settings = dict(model=str(model), losses=["macl"], data_root=str(shared_data),
                    output_dir=str(out), max_sentences=24, batch_size=8, eval_steps=3,
                    max_seq_length=16, logging_steps=1, sts_tasks=["STS12", "STSBenchmark"],
                    progress=False, threads=1)
    return SimCSERecipeConfig(**{**settings, **overrides})


def _means(result, method):
    """Every metric's mean over seeds for ``method`` (the table's row)."""
    return {metric: summary["wiki"]["methods"][method]["mean"]
            for metric, summary in result["summary"].items()
            if method in summary["wiki"]["methods"]}


def _run(result, method, seed):
    (run,) = [r for r in result["runs"] if r["cell"] == ["wiki", method, seed]]
    return run


@pytest.mark.slow
def test_recipe_trains_scores_reuses_and_recomputes_when_settings_change(tmp_path, shared_data,
                                                                         monkeypatch):
    model = build_tiny_model(tmp_path / "tiny", "roberta")
    out = tmp_path / "out"
    config = _config(model, shared_data, out)
    result = SimCSERecipe(config).run()
    assert result["num_sentences"] == 24
    rows = {method: _means(result, method) for method in ("untrained", "macl")}
    assert -100 <= rows["macl"]["best dev"] <= 100
    for column in ("STS12", "STS-B", "Avg."):
        assert -100 <= rows["macl"][column] <= 100 and -100 <= rows["untrained"][column] <= 100
    run = _run(result, "macl", 42)
    assert run["optimisation_steps"] == 3  # 24 sentences, batch 8, one epoch
    macl_history = [h for h in run["history"] if "adaptcl/temperature" in h]
    assert macl_history and all(h["adaptcl/temperature"] >= 0.005 for h in macl_history)
    assert result["computed"] == [["wiki", "untrained", 0], ["wiki", "macl", 42]]
    assert result["reused"] == [] and result["partial"] is False
    env = result["environment"]
    assert env["frameworks"]["sentence-transformers"] and env["torch_threads"] >= 1
    assert env["data_fingerprint"]["sts"]["files"] == 2 * 5 + 2  # STS12 subsets + STS-B dev/test
    saved = json.loads((out / "simcse_results.json").read_text())
    assert saved["recipe"] == "simcse"
    markdown = (out / "simcse_results.md").read_text()
    assert "| macl |" in markdown and "(n=1)" in markdown and "_adaptcl " in markdown
    assert (out / "simcse_adaptive.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the same settings and data: nothing is trained again, and the result says so
    def fail(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(training, "train_one", fail)
    again = SimCSERecipe(config).run()
    assert again["reused"] == [["wiki", "untrained", 0], ["wiki", "macl", 42]]
    assert again["computed"] == [] and again["summary"] == result["summary"]
    monkeypatch.undo()

    # another learning rate: the macl run is recomputed, its old record kept aside, never mixed
    # in; the untrained model does not depend on training settings, so it is reused
    changed = SimCSERecipe(_config(model, shared_data, out, learning_rate=1e-3)).run()
    assert changed["computed"] == [["wiki", "macl", 42]]
    assert changed["reused"] == [["wiki", "untrained", 0]]
    assert [Path(p).parts[-3:] for p in changed["superseded"]] == [("wiki", "macl", "seed42.json")]
    assert changed["identity"]["settings"]["learning_rate"] == 1e-3
    assert _run(changed, "macl", 42)["optimisation_steps"] == 3


def test_sentence_file_change_recomputes_and_curves_go_to_the_logger(tmp_path, shared_data):
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("\n".join(f"sentence number {i} about a cat ." for i in range(16)))
    model = build_tiny_model(tmp_path / "tiny", "bert")
    config = _config(model, shared_data, tmp_path / "out", sentences=str(sentences),
                     losses=["infonce"], baseline=False, sts=False,
                     max_sentences=None, logger="csv")
    first = SimCSERecipe(config).run()
    assert first["computed"] == [["wiki", "infonce", 42]]
    curves = (tmp_path / "out" / "logs" / "infonce" / "seed42" / "metrics.csv").read_text()
    assert curves.startswith("step,name,value\n") and "\n1,loss," in curves
    assert "adaptcl/temperature" in curves
    sentences.write_text("\n".join(f"sentence number {i} about a dog ." for i in range(16)))
    second = SimCSERecipe(config).run()
    assert second["computed"] == [["wiki", "infonce", 42]] and second["superseded"]
    assert second["identity"]["data"]["sentences"] != first["identity"]["data"]["sentences"]


def test_tensorboard_logger_writes_the_trainers_event_files_with_the_adaptive_curves(
        tmp_path, shared_data):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = build_tiny_model(tmp_path / "tiny", "bert")
    config = _config(model, shared_data, tmp_path / "out", sts=False,
                     baseline=False, logger="tensorboard", device="cpu")
    result = SimCSERecipe(config).run()
    history = [h for h in _run(result, "macl", 42)["history"] if "loss" in h]
    events = EventAccumulator(str(tmp_path / "out" / "logs" / "macl" / "seed42"))
    events.Reload()
    scalars = events.Tags()["scalars"]
    loss = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert loss == [(h["step"], pytest.approx(h["loss"])) for h in history] and len(loss) == 3
    temperature = [e.value for e in events.Scalars("train/adaptcl/temperature")]
    assert temperature == pytest.approx([h["adaptcl/temperature"] for h in history], rel=1e-6)
    assert {"train/adaptcl/alignment", "train/learning_rate",
            "eval/sts-dev_spearman_cosine"} <= set(scalars)
    assert not list((tmp_path / "out").rglob("metrics.csv"))  # no second, replayed copy


def test_device_cpu_trains_with_use_cpu_instead_of_being_refused(tmp_path, shared_data,
                                                                   monkeypatch):
    import adaptcl.recipes.simcse_training as adapter

    class Captured(Exception):
        pass

    seen: dict = {}

    def capture(model, dataset, loss, config, **kwargs):
        seen.update(config.extra_args)
        raise Captured

    monkeypatch.setattr(adapter, "train_simcse", capture)
    model = build_tiny_model(tmp_path / "tiny", "bert")
    page = SimCSERecipe(_config(model, shared_data, tmp_path / "out", device="cpu",
                                precision="bf16-mixed"))
    page.prepare()
    with pytest.raises(Captured):
        training.train_one("macl", 42, page, tmp_path / "out")
    # use_cpu=True is what keeps a CUDA machine's GPU out of the trainer
    assert seen["use_cpu"] is True and seen["bf16"] is True


@pytest.mark.parametrize("overrides, message", [
    ({"epochs": -1}, "epochs must be a positive number, got -1"),
    ({"epochs": 0}, "epochs must be a positive number, got 0"),
    ({"losses": ["simclr"]}, "unknown loss 'simclr'"),
    ({"pooler": "max"}, "pooler"),
    ({"batch_size": 1}, "batch_size must be >= 2"),
    ({"seeds": [1, 1]}, "distinct"),
])
def test_config_refuses_settings_that_cannot_give_a_result(overrides, message):
    with pytest.raises(ValueError, match=message):
        SimCSERecipeConfig(**overrides)


def test_paper_preset_settings():
    paper = SimCSERecipeConfig(paper="roberta")
    assert (paper.learning_rate, paper.batch_size, paper.max_sentences) == (1e-5, 64, None)


def test_fewer_sentences_than_one_batch_is_one_clear_error_before_training(tmp_path, shared_data):
    model = build_tiny_model(tmp_path / "tiny", "bert")
    config = _config(model, shared_data, tmp_path / "out", max_sentences=5, batch_size=8)
    with pytest.raises(RecipeError, match="5 sentences from .* do not fill one batch of 8"):
        SimCSERecipe(config).run()
    assert not (tmp_path / "out").exists()  # validated before any file was written


def test_zero_step_run_is_refused_and_nothing_stored(tmp_path, shared_data, monkeypatch):
    """Whatever the cause (here a trainer that stops at once), a run without an optimisation
    step is an error, not a result, and is not stored for reuse."""
    from adaptcl.recipes.template.errors import NonResultError

    model = build_tiny_model(tmp_path / "tiny", "bert")
    config = _config(model, shared_data, tmp_path / "out", losses=["infonce"],
                     sts=False)

    def no_steps(name, seed, page, out):
        return {"final_model": str(model), "global_step": 0, "history": [],
                "best_dev_spearman": 0.5}

    monkeypatch.setattr(training, "train_one", no_steps)
    with pytest.raises(NonResultError, match="no optimisation step"):
        SimCSERecipe(config).run()
    assert not list((tmp_path / "out").rglob("seed42.json"))
    assert not (tmp_path / "out" / "simcse_results.json").exists()


def test_plot_says_why_when_nothing_was_logged(tmp_path, monkeypatch):
    """A run shorter than --logging-steps logs no temperature: the figure says so."""

    figures = []
    from adaptcl.recipes.template import plots

    monkeypatch.setattr(plots, "save_figure_atomic", lambda fig, path: figures.append(fig) or path)
    grid = GridRun(cells=[Cell("wiki", "macl", 42)])
    grid.records[Cell("wiki", "macl", 42)] = {"optimisation_steps": 3, "history": []}
    config = SimCSERecipeConfig(logging_steps=10)
    plots.save_plot(tmp_path / "p.png", lambda axes: training.draw_curves(grid, axes, config),
                    ncols=2)
    (figure,) = figures
    texts = [" ".join(t.get_text().split()) for ax in figure.axes for t in ax.texts]  # wrapped
    assert len(texts) == 2 and all("3 optimisation steps" in t and "every 10" in t for t in texts)
    assert not any(ax.lines for ax in figure.axes)


def test_interrupted_run_leaves_a_partial_result_and_resumes(tmp_path, shared_data, monkeypatch):
    model = build_tiny_model(tmp_path / "tiny", "bert")
    config = _config(model, shared_data, tmp_path / "out", losses=["infonce", "macl"],
                     sts=False, max_sentences=16)
    real_train = training.train_one

    def killed_on_macl(name, seed, plan, out):
        if name == "macl":
            raise KeyboardInterrupt  # a kill between two runs
        return real_train(name, seed, plan, out)

    monkeypatch.setattr(training, "train_one", killed_on_macl)
    with pytest.raises(KeyboardInterrupt):
        SimCSERecipe(config).run()
    partial = json.loads((tmp_path / "out" / "simcse_results.json").read_text())
    assert partial["partial"] is True and partial["missing"] == [["wiki", "macl", 42]]
    assert (tmp_path / "out" / "simcse_results.md").read_text().startswith("> **PARTIAL**")
    monkeypatch.setattr(training, "train_one", real_train)
    resumed = SimCSERecipe(config).run()
    assert resumed["reused"] == [["wiki", "infonce", 42]]
    assert resumed["computed"] == [["wiki", "macl", 42]] and resumed["partial"] is False


def test_preset_paper_detects_roberta_and_old_spellings_map_to_the_new(tmp_path, capsys):
    from adaptcl.cli import build_parser

    model = build_tiny_model(tmp_path / "tiny", "roberta")
    args = build_parser("simcse").parse_args(
        ["simcse", "--model", str(model), "--preset", "paper", "--seed", "1,2",
         "--num-threads", "2", "--precision", "bf16-mixed", "--logger", "tensorboard"])
    config = SimCSERecipe.config_from_args(args)
    assert (config.paper, config.learning_rate, config.batch_size) == ("roberta", 1e-5, 64)
    assert (config.seeds, config.threads, config.precision, config.logger) == (
        [1, 2], 2, "bf16-mixed", "tensorboard")
    assert "--seed is deprecated" in capsys.readouterr().err
