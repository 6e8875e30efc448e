"""``adaptcl simcse`` on the command line: fast ``--help``, and every ordinary mistake (or a run
that diverges) one line ``adaptcl simcse: error: ...`` with exit status 2, nothing stored."""

from __future__ import annotations

import re

import pytest

from tests.recipes._cli import check_help, one_line_error_in_a_process, run_cli


def test_help_is_fast_shows_defaults_and_an_example_and_imports_no_torch():
    check_help("simcse")


def test_simcse_negative_epochs_is_one_line_and_exit_2(tmp_path):
    done = run_cli("simcse", "--epochs", "-1", "--output-dir", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "adaptcl simcse: error: epochs must be a positive number, got -1.0"]
    assert not (tmp_path / "out").exists()


def test_an_unknown_preset_names_the_presets(tmp_path):
    done = run_cli("simcse", "--preset", "gpu", "--output-dir", str(tmp_path / "out"))
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "adaptcl simcse: error: --preset 'gpu' is not one of this recipe's presets (cpu, paper)"]


@pytest.mark.slow
def test_simcse_16_mixed_on_cpu_is_one_line_suggesting_bf16_before_any_work(tmp_path):
    # accelerate ignores fp16=True on CPU and trains in float32: refused, never mislabelled
    line = one_line_error_in_a_process(
        ["simcse", "--device", "cpu", "--precision", "32", "16-mixed", "--model",
         str(tmp_path / "no-model-needed"), "--output-dir", str(tmp_path / "out")],
        "adaptcl simcse: error: --precision 16-mixed needs CUDA")
    assert "bf16-mixed" in line  # one point of the sweep is enough to refuse the run
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_simcse_fewer_sentences_than_a_batch_is_one_line_before_transformers(tmp_path,
                                                                            shared_data):
    sentences = tmp_path / "five.txt"
    sentences.write_text("one .\ntwo .\nthree .\nfour .\nfive .\n")
    done = run_cli("simcse", "--sentences", str(sentences), "--batch-size", "8", "--model",
                   str(tmp_path / "no-model-needed-yet"), "--data-root", str(shared_data),
                   "--output-dir", str(tmp_path / "out"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "5 sentences from" in lines[0] and "one batch of 8" in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_simcse_missing_model_is_one_line_before_any_work(tmp_path, shared_data):
    line = one_line_error_in_a_process(
        ["simcse", "--model", str(tmp_path / "no-such-model"), "--losses", "macl",
         "--data-root", str(shared_data), "--output-dir", str(tmp_path / "out")],
        "adaptcl simcse: error: ")
    assert "no-such-model" in line and "neither a local model folder" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_simcse_that_diverges_is_one_line_and_stores_nothing(shared_data, tmp_path):
    pytest.importorskip("sentence_transformers")
    from tests.adapters._tiny_models import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", "bert")
    one_line_error_in_a_process(
        ["simcse", "--model", str(model), "--losses", "macl", "--data-root", str(shared_data),
         "--max-sentences", "24", "--batch-size", "8", "--max-seq-length", "16",
         "--logging-steps", "1", "--learning-rate", "1e12", "--no-sts", "--no-baseline",
         "--no-progress", "--output-dir", str(tmp_path / "out")],
        "adaptcl simcse: error: 1 of 1 run diverged (NaN or inf; nothing stored for them): "
        "wiki/macl/seed42 at step ")
    assert not list((tmp_path / "out" / "runs").rglob("seed42.json"))


@pytest.mark.slow
def test_no_progress_prints_the_table_and_nothing_of_the_frameworks(shared_data, tmp_path):
    """``--no-progress`` (a batch job's log): no model loading or saving bars, no trainer log
    dicts, no warnings our own settings cause; the table and where the results are."""
    pytest.importorskip("sentence_transformers")
    from tests.adapters._tiny_models import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", "bert")
    done = run_cli("simcse", "--model", str(model), "--losses", "macl", "--data-root",
                   str(shared_data), "--max-sentences", "24", "--batch-size", "8",
                   "--max-seq-length", "16", "--logging-steps", "1", "--eval-steps", "3",
                   "--no-sts", "--no-progress", "--output-dir", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("| method |") and lines[-1].startswith("results: "), done.stdout
    assert not [line for line in lines if line.startswith("{")], done.stdout
    # (sentence-transformers' model-card callback draws a bar of its own: off too)
    assert [part for part in re.split(r"[\r\n]", done.stderr) if part.strip()] == [], done.stderr


def test_a_gpu_the_trainer_would_not_use_is_refused_naming_cuda_visible_devices(monkeypatch):
    # transformers' Trainer places a one-process run on cuda:0 whatever --device says
    import torch

    from adaptcl.recipes.simcse.train import check_trainer_device

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=re.escape(
            "--device cuda:1: transformers' Trainer trains on the first visible GPU; choose "
            "GPU 1 with CUDA_VISIBLE_DEVICES=1 and --device cuda")):
        check_trainer_device("cuda:1")
    for fine in ("cpu", "cuda", "cuda:0"):
        check_trainer_device(fine)


def test_several_visible_gpus_in_one_process_are_announced_as_data_parallel(monkeypatch, capsys):
    import torch

    from adaptcl.recipes.simcse.train import check_trainer_device

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    check_trainer_device("cuda")
    assert "spreads each batch over the 4 visible GPUs (nn.DataParallel)" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "4")  # torchrun: one GPU per process, nothing to say
    check_trainer_device("cuda")
    assert capsys.readouterr().err == ""
