"""The ``demo`` recipe: a shortened real run on sklearn's digits, through the CLI.

One 2-epoch run (module fixture) goes through ``adaptcl.cli.main`` exactly as ``make demo``
does; the tests then read back its JSON, table and PNG.
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
from adaptcl.recipes.demo import (  # noqa: E402
    PLOT_FILE,
    RESULT_FILE,
    TABLE_FILE,
    DemoConfig,
    augment,
    load_digits_split,
)

EPOCHS = 2
BATCH = 256
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    out = tmp_path_factory.mktemp("demo")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = cli.main(["demo", "--epochs", str(EPOCHS), "--batch-size", str(BATCH),
                         "--seed", "0", "--output-dir", str(out), "--no-progress",
                         "--threads", "1"])
    assert code == 0
    return out, json.loads((out / RESULT_FILE).read_text()), stdout.getvalue()


def rows_by_key(result: dict) -> dict[str, dict]:
    return {row["key"]: row for row in result["rows"]}


def test_json_has_both_losses_with_sane_knn(demo_run) -> None:
    _, result, _ = demo_run
    rows = rows_by_key(result)
    assert set(rows) == {"raw_pixels", "random_encoder", "nt_xent", "macl"}
    assert result["data"] == {"source": "sklearn.datasets.load_digits", "n_train": 1347,
                              "n_test": 450, "classes": 10, "image_shape": [8, 8]}
    for row in rows.values():
        for key in ("knn_accuracy", "knn_accuracy_augmented"):
            assert 0.0 <= row[key] <= 1.0
        assert row["alignment"] >= 0.0 and row["uniformity"] <= 0.0
    for key in ("nt_xent", "macl"):
        # even two epochs give features far above chance (10%) on clean test digits
        assert rows[key]["knn_accuracy"] > 5 * result["chance_accuracy"]
        assert rows[key]["train_seconds"] > 0
    assert result["macl_minus_ntxent_knn"] == pytest.approx(
        rows["macl"]["knn_accuracy"] - rows["nt_xent"]["knn_accuracy"])


def test_macl_temperature_is_adaptive_and_floored(demo_run) -> None:
    _, result, _ = demo_run
    macl, ntxent = result["history"]["macl"], result["history"]["nt_xent"]
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
    assert rows_by_key(result)["macl"]["final_temperature"] == macl["temperature"][-1]


def test_both_losses_start_from_the_same_model_and_views(demo_run) -> None:
    _, result, _ = demo_run
    macl, ntxent = result["history"]["macl"], result["history"]["nt_xent"]
    # same initial weights and the same first batch of views: identical first alignment
    assert macl["alignment"][0] == pytest.approx(ntxent["alignment"][0], abs=1e-6)
    # ...and the losses then diverge (MACL's temperature and weights differ)
    assert macl["plain_loss"][-1] != ntxent["plain_loss"][-1]


def test_png_table_and_printed_output(demo_run) -> None:
    out, result, printed = demo_run
    png = (out / PLOT_FILE).read_bytes()
    assert png[:8] == PNG_MAGIC and len(png) > 10_000
    table = (out / TABLE_FILE).read_text()
    header = ("| loss | kNN acc | alignment | uniformity | final temperature "
              "| kNN acc, augmented queries |")
    for text in (table, printed):
        assert header in text
        for prefix in ("| raw pixels", "| random-init encoder", "| NT-Xent (tau=0.1)",
                       "| MACL (tau0=0.1, alpha=0.5, A0=0)"):
            assert any(line.startswith(prefix) for line in text.splitlines()), prefix
    assert f"{100 * rows_by_key(result)['macl']['knn_accuracy']:.1f}%" in table
    assert not list(out.glob(".*tmp*"))  # atomic writes leave no temporary files


def test_cli_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for option in ("--epochs", "--batch-size", "--seed", "--output-dir"):
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
                                    {"lr": 0.0}, {"threads": 0}])
def test_config_rejects_bad_values(kwargs) -> None:
    with pytest.raises(ValueError):
        DemoConfig(**kwargs)


def test_two_seeds_in_bf16_give_a_paired_difference_and_a_rerun_reuses_them(
        tmp_path, monkeypatch) -> None:
    from adaptcl.recipes import demo

    config = DemoConfig(epochs=1, seeds=[0, 1], output_dir=str(tmp_path), progress=False,
                        device="cpu", precision="bf16-mixed", logger="csv")
    result = demo.run_demo(config)
    diff = result["summary"]["digits"]["paired"]["macl"]
    assert diff["n"] == 2 and diff["ci95"][0] <= diff["mean"] <= diff["ci95"][1]
    assert result["computed"] == [["digits", "nt_xent", 0], ["digits", "macl", 0],
                                  ["digits", "nt_xent", 1], ["digits", "macl", 1]]
    assert all(math.isfinite(v) for v in result["history"]["macl"]["loss"])
    assert (tmp_path / "logs" / "macl" / "seed1" / "metrics.csv").read_text().count(
        "train/temperature") == 1347 // 256
    table = (tmp_path / TABLE_FILE).read_text()
    assert "MACL − NT-Xent = " in table and "(n=2)" in table and "_adaptcl " in table

    def boom(*args, **kwargs):
        raise AssertionError("a stored run was retrained")

    monkeypatch.setattr(demo, "train", boom)
    again = demo.run_demo(config)
    assert len(again["reused"]) == 4 and again["computed"] == []
    assert again["summary"] == result["summary"]
