"""The ``demo`` recipe: a shortened real run on sklearn's digits, through the CLI.

One 2-epoch run (module fixture) goes through ``adaptcl.cli.main`` exactly as ``make demo``
does; the tests then read back its JSON, table and PNG. Its kNN accuracies are pinned to what
the pre-template code (commit 101c0ba) computed for the same command.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("sklearn", reason="the demo needs the 'recipes' extra (scikit-learn)")
pytest.importorskip("matplotlib", reason="the demo needs the 'recipes' extra (matplotlib)")

from adaptcl import cli  # noqa: E402
from adaptcl.recipes.demo import model as demo_model  # noqa: E402
from adaptcl.recipes.demo.config import DemoConfig  # noqa: E402
from adaptcl.recipes.demo.data import augment, load_digits_split  # noqa: E402
from adaptcl.recipes.demo.recipe import DemoRecipe  # noqa: E402

EPOCHS = 2
BATCH = 256
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RESULT_FILE, TABLE_FILE, PLOT_FILE = "results.json", "results.md", DemoRecipe.figure.file
METHODS = ("raw_pixels", "random_encoder", "infonce", "macl")
# correct test digits of 450 (clean queries, augmented queries) of the 2-epoch run, seed 0, as the
# pre-template code computed them (PYTHONPATH=<checkout of 101c0ba>/src adaptcl demo --epochs 2)
PRE_TEMPLATE_CORRECT = {"raw_pixels": (438, 256), "random_encoder": (430, 221),
                        "infonce": (429, 255), "macl": (433, 257)}


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    out = tmp_path_factory.mktemp("demo")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = cli.main(["demo", "--epochs", str(EPOCHS), "--batch-size", str(BATCH),
                         "--seeds", "0", "--output-dir", str(out), "--no-progress",
                         "--threads", "1"])
    assert code == 0
    return out, json.loads((out / RESULT_FILE).read_text()), stdout.getvalue()


def metrics_by_method(result: dict) -> dict[str, dict]:
    return {run["cell"]["method"]: run["metrics"] for run in result["runs"]}


def test_json_has_every_method_with_sane_knn(demo_run) -> None:
    _, result, _ = demo_run
    metrics = metrics_by_method(result)
    assert list(metrics) == list(METHODS)
    assert result["data"] == {"source": "sklearn.datasets.load_digits", "n_train": 1347,
                              "n_test": 450, "classes": 10, "image_shape": [8, 8]}
    for values in metrics.values():
        for key in ("knn_accuracy", "knn_accuracy_augmented"):
            assert 0.0 <= values[key] <= 1.0
        assert values["alignment"] >= 0.0 and values["uniformity"] <= 0.0
    runs = {run["cell"]["method"]: run for run in result["runs"]}
    for key in ("infonce", "macl"):
        # even two epochs give features far above chance (10%) on clean test digits
        assert metrics[key]["knn_accuracy"] > 5 * result["chance_accuracy"]
        assert runs[key]["train_seconds"] > 0 and runs[key]["optimisation_steps"] == 10
        assert "history" not in runs[key] and "losses" not in runs[key]  # in "history" once
    for key in ("raw_pixels", "random_encoder"):  # references: no step, no temperature
        assert runs[key]["optimisation_steps"] == 0 and "final_temperature" not in metrics[key]
    knn = result["summary"]["knn_accuracy"]["digits"]
    assert knn["methods"]["macl"]["mean"] == 100 * metrics["macl"]["knn_accuracy"]
    assert knn["paired"]["macl"]["mean"] == pytest.approx(
        100 * (metrics["macl"]["knn_accuracy"] - metrics["infonce"]["knn_accuracy"]))
    assert result["baseline"] == "infonce"


def test_knn_accuracies_are_the_pre_template_codes(demo_run) -> None:
    _, result, _ = demo_run
    correct = {m: (round(450 * v["knn_accuracy"]), round(450 * v["knn_accuracy_augmented"]))
               for m, v in metrics_by_method(result).items()}
    assert correct == PRE_TEMPLATE_CORRECT


def test_macl_temperature_is_adaptive_and_floored(demo_run) -> None:
    _, result, _ = demo_run
    macl, ntxent = result["history"]["macl"], result["history"]["infonce"]
    steps = EPOCHS * (1347 // BATCH)
    assert len(macl["temperature"]) == len(ntxent["temperature"]) == steps
    floor = result["macl_min_temperature"]
    assert floor == pytest.approx(0.01)  # documented default: tau0 / 10
    temps = torch.tensor(macl["temperature"])
    assert temps.min() >= floor
    assert temps.max() - temps.min() > 1e-3  # it follows the alignment, so it moves
    # it is the linear rule tau0 * (1 + alpha * (A - A0)) of the logged alignment A
    expected = (0.1 * (1 + 0.5 * torch.tensor(macl["alignment"]))).clamp(min=floor)
    torch.testing.assert_close(temps, expected, rtol=1e-5, atol=1e-6)
    assert ntxent["temperature"] == pytest.approx([0.1] * steps)
    assert metrics_by_method(result)["macl"]["final_temperature"] == macl["temperature"][-1]
    assert result["macl_temperature_range"] == [min(macl["temperature"]),
                                                max(macl["temperature"])]


def test_both_losses_start_from_the_same_model_and_views(demo_run) -> None:
    _, result, _ = demo_run
    macl, ntxent = result["history"]["macl"], result["history"]["infonce"]
    # same initial weights and the same first batch of views: identical first alignment
    assert macl["alignment"][0] == pytest.approx(ntxent["alignment"][0], abs=1e-6)
    # ...and the losses then diverge (MACL's temperature and weights differ)
    assert macl["plain_loss"][-1] != ntxent["plain_loss"][-1]


def test_png_table_and_printed_output(demo_run) -> None:
    out, result, printed = demo_run
    png = (out / PLOT_FILE).read_bytes()
    assert png[:8] == PNG_MAGIC and len(png) > 10_000
    table = (out / TABLE_FILE).read_text()
    header = ("| method | kNN acc | alignment | uniformity | final temperature "
              "| kNN acc, augmented queries | kNN acc − NT-Xent (tau=0.1) |")  # one seed: no CI
    for text in (table, printed):
        assert header in text
        for prefix in ("| raw pixels", "| random-init encoder", "| NT-Xent (tau=0.1)",
                       "| MACL (tau0=0.1, alpha=0.5, A0=0)"):
            assert any(line.startswith(prefix) for line in text.splitlines()), prefix
    macl = metrics_by_method(result)["macl"]
    assert (f"| {100 * macl['knn_accuracy']:.1f} | {macl['alignment']:.3f} | "
            f"{macl['uniformity']:.3f} | {macl['final_temperature']:.4f} |") in table
    assert "±" not in table and "n=1" not in table  # one seed: values, no spread
    assert "| raw pixels (no training) |" in table and "| - |" in table  # no temperature
    assert "1347 train / 450 test" in table
    assert not list(out.glob(".*tmp*"))  # atomic writes leave no temporary files


def test_cli_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for option in ("--epochs", "--batch-size", "--seeds", "--output-dir", "--print-config"):
        assert option in text


def test_augment_is_a_seeded_valid_view() -> None:
    x_train, _, _, _ = load_digits_split(0.25, seed=0)
    batch = x_train[:64]
    a = augment(batch, torch.Generator().manual_seed(3))
    b = augment(batch, torch.Generator().manual_seed(3))
    c = augment(batch, torch.Generator().manual_seed(4))
    assert a.shape == batch.shape and a.min() >= 0 and a.max() <= 1
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, c) and not torch.allclose(a, batch)
    # a view keeps the digit: it stays closer to its own image than to other images
    own = torch.cosine_similarity(a.flatten(1), batch.flatten(1)).mean()
    other = torch.cosine_similarity(a.flatten(1), batch.roll(1, 0).flatten(1)).mean()
    assert own > other


@pytest.mark.parametrize("kwargs", [{"batch_size": 1}, {"epochs": 0}, {"test_fraction": 1.0},
                                    {"lr": 0.0}, {"threads": 0}, {"epochs": 2.5},
                                    {"knn_k": True}, {"seeds": []}, {"precision": "64"}])
def test_config_rejects_bad_values(kwargs) -> None:
    with pytest.raises(ValueError):
        DemoConfig(**kwargs)


def test_two_seeds_in_bf16_give_a_paired_difference_and_a_rerun_reuses_them(
        tmp_path, monkeypatch) -> None:
    config = DemoConfig(epochs=1, seeds=[0, 1], output_dir=str(tmp_path), progress=False,
                        device="cpu", precision="bf16-mixed", logger="csv")
    result = DemoRecipe(config).run()
    diff = result["summary"]["knn_accuracy"]["digits"]["paired"]["macl"]
    assert diff["n"] == 2 and diff["ci95"][0] <= diff["mean"] <= diff["ci95"][1]
    # the references once (first seed), then every loss per seed in the old order
    assert [(c["method"], c["seed"]) for c in result["computed"]] == [
        ("raw_pixels", 0), ("random_encoder", 0), ("infonce", 0), ("macl", 0), ("infonce", 1),
        ("macl", 1)]
    assert all(math.isfinite(v) for v in result["history"]["macl"]["loss"])
    assert (tmp_path / "logs" / "digits" / "macl" / "seed1" / "metrics.csv").read_text().count(
        "train/temperature") == 1347 // 256
    table = (tmp_path / TABLE_FILE).read_text()
    assert "(n=2)" in table and "_adaptcl " in table and "[95% CI] |" in table

    def boom(*args, **kwargs):
        raise AssertionError("a stored run was retrained")

    monkeypatch.setattr(demo_model, "train", boom)
    again = DemoRecipe(config).run()
    assert len(again["reused"]) == 6 and again["computed"] == []
    assert again["summary"] == result["summary"]
