"""``adaptcl images``'s mistakes are one line ``adaptcl images: error: ...``, exit 2, before any
work or file write; ``--help`` is fast and imports no framework."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.recipes._cli import one_line_error, refused_before_any_file

SRC = str(Path(__file__).resolve().parents[3] / "src")


@pytest.mark.parametrize("argv, expected", [
    (["--backbone", "resnet-7"], "unknown backbone 'resnet-7'"),
    (["--lr", "nan"], "lr must be a finite number, got nan"),
    (["--method", "simsiam"], "loss 'infonce' does not apply to simsiam"),
    (["--train-limit", "0"], "train_limit must be a positive number, got 0"),
    (["--threads", "1", "2"], "--threads takes one value"),
])
def test_bad_settings_are_refused_before_the_data_is_touched(argv, expected, shared_data,
                                                             tmp_path, capsys):
    refused_before_any_file(capsys, ["images", *argv, "--data-root", str(shared_data),
                                     "--seeds", "0"], expected, tmp_path / "out")


def test_missing_data_is_one_line_before_any_file(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    refused_before_any_file(capsys, ["images", "--data-root", str(tmp_path / "empty")],
                            "no image data under", tmp_path / "out")


def test_two_ranks_need_a_batch_each_before_any_process_starts(shared_data, tmp_path, capsys):
    one_line_error(capsys, ["images", "--data-root", str(shared_data), "--train-limit", "200",
                            "--batch-size", "128", "--devices", "2", "--strategy", "ddp",
                            "--seeds", "0", "--output-dir", str(tmp_path / "out")],
                   "(200 images, 100 per device over 2) is smaller than one batch (128)")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_images_that_diverge_are_one_line_naming_each_run(shared_data, tmp_path, capsys):
    one_line_error(capsys, ["images", "--data-root", str(shared_data), "--train-limit", "64",
                            "--test-limit", "32", "--batch-size", "32", "--epochs", "2",
                            "--width", "0.0625", "--linear-epochs", "0", "--knn-every", "0",
                            "--seeds", "0", "--losses", "infonce", "macl", "--lr", "1e30",
                            "--no-progress", "--output-dir", str(tmp_path)],
                   "2 of 2 runs diverged (NaN or inf; nothing stored for them): "
                   "cifar10/infonce/seed0 at step ")
    assert not list((tmp_path / "runs").rglob("seed0.json"))
    # the step that met NaN embeddings computed no loss: the finite loss before it is not its
    diverged = json.loads((tmp_path / "results.json").read_text())["diverged"]
    assert [d["loss"] for d in diverged] == [None, None]
    for d in diverged:
        assert re.search(rf"NaN or inf at step {d['step']}; the last loss was [\d.]+ at step "
                         rf"{d['step'] - 1}$", d["message"]), d


def test_help_is_fast_shows_defaults_presets_and_an_example():
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "adaptcl.cli", "images", "--help"],
                          env=dict(os.environ, PYTHONPATH=SRC), capture_output=True, text=True,
                          timeout=60)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    assert elapsed < 3.0, f"adaptcl images --help took {elapsed:.1f} s"
    assert "(default: " in proc.stdout and "example:" in proc.stdout
    assert "cpu, paper (default: cpu)" in proc.stdout
    for option in ("--output-dir", "--seeds", "--threads", "--device", "--precision", "--logger",
                   "--method", "--full-data", "--devices", "--strategy"):
        assert option in proc.stdout


def test_help_imports_no_heavy_module():
    code = ("import sys\nfrom adaptcl import cli\n"
            "try:\n    cli.main(['images', '--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('torch', 'torchvision', 'lightly', 'pytorch_lightning', "
            "'numpy', 'matplotlib') if m in sys.modules)\n"
            "print(heavy, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=SRC),
                          capture_output=True, text=True, timeout=60)
    assert proc.stderr.strip() == "[]", proc.stderr
