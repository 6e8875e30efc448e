"""The simcse recipe end to end on tiny BERT/RoBERTa models, the real wiki sample and real STS
data: trains, scores, reuses a finished run only while nothing that determines it has changed
(the untrained model whatever the training settings), presets, sweeps, logs and refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("sentence_transformers")

import adaptcl.recipes.simcse.train as training  # noqa: E402
from adaptcl.recipes.engine import Cell, GridRun, NonResultError, RecipeError  # noqa: E402
from adaptcl.recipes.engine.sweep import Sweep  # noqa: E402
from adaptcl.recipes.simcse.config import PRESETS, SimCSERecipeConfig  # noqa: E402
from adaptcl.recipes.simcse.recipe import SimCSERecipe  # noqa: E402
from tests.adapters._tiny_models import build_tiny_model  # noqa: E402


def _settings(model, shared_data, out, **overrides):
    return {"model": str(model), "losses": ["macl"], "data_root": str(shared_data),
            "output_dir": str(out), "max_sentences": 24, "batch_size": 8, "eval_steps": 3,
            "max_seq_length": 16, "logging_steps": 1, "sts_tasks": ["STS12", "STSBenchmark"],
            "progress": False, "threads": 1, **overrides}


def _config(model, shared_data, out, **overrides):
    return SimCSERecipeConfig(**_settings(model, shared_data, out, **overrides))


def _cells(result, key):
    return [(c["dataset"], c["method"], c["seed"]) for c in result[key]]


def _means(result, method):
    """Every metric's mean over seeds for ``method`` (the table's row)."""
    return {metric: summary["wiki"]["methods"][method]["mean"]
            for metric, summary in result["summary"].items()
            if method in summary["wiki"]["methods"]}


def _run(result, method, seed):
    (run,) = [r for r in result["runs"] if (r["cell"]["method"], r["cell"]["seed"]) == (method, seed)]
    return run


@pytest.mark.slow
def test_recipe_trains_scores_reuses_and_recomputes_when_settings_change(tmp_path, shared_data,
                                                                         monkeypatch):
    model = build_tiny_model(tmp_path / "tiny", "roberta")
    out = tmp_path / "out"
    config = _config(model, shared_data, out)
    result = SimCSERecipe(config).run()
    rows = {method: _means(result, method) for method in ("untrained", "macl")}
    assert -100 <= rows["macl"]["best dev"] <= 100
    for column in ("STS12", "STS-B", "Avg."):
        assert -100 <= rows["macl"][column] <= 100 and -100 <= rows["untrained"][column] <= 100
    run = _run(result, "macl", 42)
    assert run["optimisation_steps"] == 3 and run["num_sentences"] == 24  # batch 8, one epoch
    macl_history = [h for h in run["history"] if "adaptcl/temperature" in h]
    assert macl_history and all(h["adaptcl/temperature"] >= 0.005 for h in macl_history)
    assert _cells(result, "computed") == [("wiki", "untrained", 0), ("wiki", "macl", 42)]
    assert result["reused"] == [] and result["partial"] is False
    env = result["environment"]
    assert env["frameworks"]["sentence-transformers"] and env["torch_threads"] >= 1
    assert env["data_fingerprint"]["sts"]["files"] == 2 * 5 + 2  # STS12 subsets + STS-B dev/test
    assert env["data_fingerprint"]["model"]["path"] == str(model.resolve())
    markdown = (out / "results.md").read_text()
    assert "| macl |" in markdown and "| untrained |" in markdown and "_adaptcl " in markdown
    assert (out / "simcse_adaptive.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "models" / "wiki" / "macl" / "seed42" / "final" / "modules.json").is_file()

    # the same settings and data: nothing is trained again, and the result says so
    def fail(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(training, "train_cell", fail)
    again = SimCSERecipe(config).run()
    assert _cells(again, "reused") == [("wiki", "untrained", 0), ("wiki", "macl", 42)]
    assert again["computed"] == [] and again["summary"] == result["summary"]
    monkeypatch.undo()

    # another learning rate: the macl run is recomputed, its old record kept aside, never mixed
    # in; the untrained model does not depend on training settings, so it is reused
    changed = SimCSERecipe(_config(model, shared_data, out, learning_rate=1e-3)).run()
    assert _cells(changed, "computed") == [("wiki", "macl", 42)]
    assert _cells(changed, "reused") == [("wiki", "untrained", 0)]
    assert [Path(p).parts[-3:] for p in changed["superseded"]] == [("wiki", "macl", "seed42.json")]
    stored = json.loads((out / "runs" / "wiki" / "macl" / "seed42.json").read_text())
    assert stored["identity"]["settings"]["learning_rate"] == 1e-3
    assert _run(changed, "macl", 42)["optimisation_steps"] == 3


def _prepared(settings: dict) -> SimCSERecipe:
    recipe = SimCSERecipe(Sweep.from_values(SimCSERecipeConfig, settings))
    recipe.prepare(recipe.point_configs())
    return recipe


def test_the_untrained_model_is_identified_by_what_builds_and_scores_it(tmp_path, shared_data,
                                                                        tiny_bert, monkeypatch):
    """A training setting changes a trained cell's identity, not the untrained one's; a setting
    that builds the model (its length) or scores it (the STS tasks) changes both; so does
    training in several processes (a global batch), the trained cells only."""
    base = _settings(tiny_bert, shared_data, tmp_path / "out")

    def identities(**overrides):
        recipe = _prepared({**base, **overrides})
        return [recipe.identity_of(recipe.cell("wiki", m, s)) for m, s in (("untrained", 0),
                                                                         ("macl", 42))]

    untrained, trained = identities()
    assert set(untrained["settings"]) == {"model", "pooler", "max_seq_length", "device", "sts",
                                          "sts_tasks"}
    assert set(untrained["data"]) == {"model", "sts"}  # not the sentences: nothing trains
    for training_setting in ({"learning_rate": 1e-3}, {"max_sentences": 16},
                             {"precision": "bf16-mixed"}, {"dropout": 0.2}):
        other_untrained, other_trained = identities(**training_setting)
        assert other_untrained == untrained and other_trained != trained, training_setting
    for scoring_setting in ({"max_seq_length": 8}, {"sts_tasks": ["STS13"]}, {"pooler": "avg"}):
        other_untrained, other_trained = identities(**scoring_setting)
        assert other_untrained != untrained and other_trained != trained, scoring_setting
    # bookkeeping: where files go and how the run looks
    assert identities(logger="csv", progress=True, baseline=False) == [untrained, trained]
    monkeypatch.setenv("WORLD_SIZE", "2")
    other_untrained, other_trained = identities()
    assert other_untrained == untrained and other_trained == {**trained, "processes": 2}


def test_a_sweep_scores_the_untrained_model_once_per_scoring_identity(tmp_path, shared_data,
                                                                      tiny_bert):
    base = _settings(tiny_bert, shared_data, tmp_path / "out", losses=["infonce", "macl"])
    by_lr = _prepared({**base, "learning_rate": [1e-3, 3e-5]}).cells()
    assert [(c.method, dict(c.point)) for c in by_lr if c.method == "untrained"] == [
        ("untrained", {"learning_rate": 1e-3})]
    assert sum(c.method != "untrained" for c in by_lr) == 4
    by_length = _prepared({**base, "max_seq_length": [16, 8]}).cells()
    assert [dict(c.point) for c in by_length if c.method == "untrained"] == [
        {"max_seq_length": 16}, {"max_seq_length": 8}]


def test_sentence_file_change_recomputes_and_curves_go_to_the_logger(tmp_path, shared_data):
    sentences = tmp_path / "cats.txt"
    sentences.write_text("\n".join(f"sentence number {i} about a cat ." for i in range(16)))
    model = build_tiny_model(tmp_path / "tiny", "bert")
    config = _config(model, shared_data, tmp_path / "out", sentences=str(sentences),
                     losses=["infonce"], baseline=False, sts=False,
                     max_sentences=None, logger="csv")
    first = SimCSERecipe(config).run()
    assert _cells(first, "computed") == [("cats", "infonce", 42)]  # the file names the row
    curves = (tmp_path / "out" / "logs" / "cats" / "infonce" / "seed42" / "metrics.csv").read_text()
    assert curves.startswith("step,name,value\n") and "\n1,loss," in curves
    assert "adaptcl/temperature" in curves
    sentences.write_text("\n".join(f"sentence number {i} about a dog ." for i in range(16)))
    second = SimCSERecipe(config).run()
    assert _cells(second, "computed") == [("cats", "infonce", 42)] and second["superseded"]
    old, new = (json.loads(Path(p).read_text())["identity"]["data"]["sentences"] for p in
                (second["superseded"][0], tmp_path / "out" / "runs" / "cats" / "infonce" /
                 "seed42.json"))
    assert old != new


def test_tensorboard_logger_writes_the_trainers_event_files_with_the_adaptive_curves(
        tmp_path, shared_data):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = build_tiny_model(tmp_path / "tiny", "bert")
    config = _config(model, shared_data, tmp_path / "out", sts=False,
                     baseline=False, logger="tensorboard", device="cpu")
    result = SimCSERecipe(config).run()
    history = [h for h in _run(result, "macl", 42)["history"] if "loss" in h]
    events = EventAccumulator(str(tmp_path / "out" / "logs" / "wiki" / "macl" / "seed42"))
    events.Reload()
    scalars = events.Tags()["scalars"]
    loss = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert loss == [(h["step"], pytest.approx(h["loss"])) for h in history] and len(loss) == 3
    temperature = [e.value for e in events.Scalars("train/adaptcl/temperature")]
    assert temperature == pytest.approx([h["adaptcl/temperature"] for h in history], rel=1e-6)
    assert {"train/adaptcl/alignment", "train/learning_rate",
            "eval/sts-dev_spearman_cosine"} <= set(scalars)
    assert not list((tmp_path / "out").rglob("metrics.csv"))  # no second, replayed copy


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_device_cpu_trains_with_use_cpu_instead_of_being_refused(device, tmp_path, shared_data,
                                                                   monkeypatch):
    """``--device cpu``, and ``auto`` where it resolves to the CPU, give the trainer
    ``use_cpu=True``: without it transformers under torchrun trained as one process."""
    if device == "auto":
        monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # auto -> cpu

    class Captured(Exception):
        pass

    seen: dict = {}

    def capture(model, dataset, loss, config, **kwargs):
        seen.update(config.extra_args)
        raise Captured

    monkeypatch.setattr(training, "train_simcse", capture)
    model = build_tiny_model(tmp_path / "tiny", "bert")
    cfg = _config(model, shared_data, tmp_path / "out", device=device, precision="bf16-mixed")
    recipe = SimCSERecipe(cfg)
    recipe.prepare(recipe.point_configs())
    inputs = recipe.inputs[()]
    with pytest.raises(Captured):
        training.train_cell(cfg, recipe.cell("wiki", "macl", 42), inputs.model,
                            inputs.sentences, recipe.senteval_root, tmp_path / "m",
                            tmp_path / "logs")
    # use_cpu=True is what keeps a CUDA machine's GPU out of the trainer
    assert seen["use_cpu"] is True and seen["bf16"] is True


@pytest.mark.parametrize("overrides, message", [
    ({"epochs": -1}, "epochs must be a positive number, got -1"),
    ({"epochs": 0}, "epochs must be a positive number, got 0"),
    ({"losses": ["simclr"]}, "unknown loss 'simclr'"),
    ({"pooler": "max"}, "unknown pooler 'max'"),
    ({"batch_size": 1}, "batch_size must be a number >= 2"),
    ({"dropout": 1.0}, "dropout must be a number in [0, 1)"),
    ({"sts_tasks": []}, "sts_tasks must name at least one task"),
    ({"sts_tasks": ["STS17"]}, "unknown sts tasks 'STS17'"),
])
def test_config_refuses_settings_that_cannot_give_a_result(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SimCSERecipeConfig(**overrides)


def test_paper_preset_takes_the_learning_rate_of_each_models_family(tmp_path):
    from adaptcl.recipes.engine.command_line import parse

    bert = build_tiny_model(tmp_path / "bert", "bert")
    roberta = build_tiny_model(tmp_path / "roberta", "roberta")
    paper = SimCSERecipeConfig(**PRESETS["paper"], model=str(roberta))
    assert (paper.learning_rate, paper.batch_size, paper.max_sentences, paper.eval_steps) == (
        1e-5, 64, None, 125)
    assert SimCSERecipeConfig().learning_rate == 3e-5  # the cpu preset: the defaults
    swept = parse(SimCSERecipe, ["--preset", "paper", "--model", str(bert), str(roberta)], "x")
    assert swept.preset == "paper"
    assert [swept.sweep.config_at(p).learning_rate for p in swept.sweep.points()] == [3e-5, 1e-5]
    forced = parse(SimCSERecipe, ["--preset", "paper", "--model", str(roberta),
                                  "--learning-rate", "2e-5"], "x")
    assert forced.sweep.base.learning_rate == 2e-5


def test_fewer_sentences_than_one_batch_is_one_clear_error_before_training(tmp_path, shared_data):
    model = build_tiny_model(tmp_path / "tiny", "bert")
    config = _config(model, shared_data, tmp_path / "out", max_sentences=5, batch_size=8)
    with pytest.raises(RecipeError, match="5 sentences from .* do not fill one batch of 8"):
        SimCSERecipe(config).run()
    assert not (tmp_path / "out").exists()  # validated before any file was written


def test_zero_step_run_is_refused_and_nothing_stored(tmp_path, shared_data, monkeypatch):
    """Whatever the cause (here a trainer that stops at once), a run without an optimisation
    step is an error, not a result, and is not stored for reuse."""
    model = build_tiny_model(tmp_path / "tiny", "bert")
    config = _config(model, shared_data, tmp_path / "out", losses=["infonce"], sts=False)

    def no_steps(*args, **kwargs):
        return {"final_model": str(model), "global_step": 0, "history": [],
                "best_dev_spearman": 0.5}

    monkeypatch.setattr(training, "train_cell", no_steps)
    with pytest.raises(NonResultError, match="no optimisation step"):
        SimCSERecipe(config).run()
    assert not list((tmp_path / "out").rglob("seed42.json"))
    assert not (tmp_path / "out" / "results.json").exists()


def test_a_run_that_trained_as_other_processes_than_launched_is_not_stored(tmp_path, shared_data,
                                                                           monkeypatch):
    """The identity records the processes launched (``WORLD_SIZE``); a trainer that trained as
    another number (transformers under torchrun without ``use_cpu`` on a CPU machine: one
    process on every sentence) stores nothing."""
    model = build_tiny_model(tmp_path / "tiny", "bert")
    config = _config(model, shared_data, tmp_path / "out", losses=["infonce"], sts=False)

    def one_process(*args, **kwargs):
        return {"final_model": str(model), "global_step": 3, "world_size": 1,
                "history": [{"loss": 1.0, "step": 3}], "best_dev_spearman": 0.5}

    monkeypatch.setattr(training, "train_cell", one_process)
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun launches rank 0
    with pytest.raises(RuntimeError, match=r"^wiki/infonce/seed42: launched as 2 process\(es\) "
                                           r"\(WORLD_SIZE\) but the trainer trained as 1; "):
        SimCSERecipe(config).run()
    assert not list((tmp_path / "out").rglob("seed42.json"))


def test_plot_says_why_when_nothing_was_logged(tmp_path, monkeypatch):
    """A run shorter than --logging-steps logs no temperature: the figure says so."""
    from adaptcl.recipes.engine import plots

    figures = []
    monkeypatch.setattr(plots, "save_figure_atomic", lambda fig, path: figures.append(fig) or path)
    cell = Cell((("dataset", "wiki"), ("method", "macl")), seed=42)
    grid = GridRun(cells=[cell], records={cell: {"optimisation_steps": 3, "history": []}})
    recipe = SimCSERecipe(SimCSERecipeConfig(logging_steps=10))
    plots.save_plot(tmp_path / "p.png", lambda axes: recipe.draw(grid, axes), ncols=2)
    (figure,) = figures
    texts = [" ".join(t.get_text().split()) for ax in figure.axes for t in ax.texts]  # wrapped
    assert len(texts) == 2 and all("3 optimisation steps" in t and "every 10" in t for t in texts)
    assert not any(ax.lines for ax in figure.axes)


def test_interrupted_run_leaves_a_partial_result_and_resumes(tmp_path, shared_data, monkeypatch):
    model = build_tiny_model(tmp_path / "tiny", "bert")
    config = _config(model, shared_data, tmp_path / "out", losses=["infonce", "macl"],
                     sts=False, max_sentences=16)
    real_train = training.train_cell

    def killed_on_macl(cfg, cell, *args, **kwargs):
        if cell.method == "macl":
            raise KeyboardInterrupt  # a kill between two runs
        return real_train(cfg, cell, *args, **kwargs)

    monkeypatch.setattr(training, "train_cell", killed_on_macl)
    with pytest.raises(KeyboardInterrupt):
        SimCSERecipe(config).run()
    partial = json.loads((tmp_path / "out" / "results.json").read_text())
    assert partial["partial"] is True and _cells(partial, "missing") == [("wiki", "macl", 42)]
    assert (tmp_path / "out" / "results.md").read_text().startswith("> **PARTIAL**")
    monkeypatch.setattr(training, "train_cell", real_train)
    resumed = SimCSERecipe(config).run()
    assert _cells(resumed, "reused") == [("wiki", "infonce", 42)]
    assert _cells(resumed, "computed") == [("wiki", "macl", 42)] and resumed["partial"] is False
