"""The sentence recipes' command line: fast --help with defaults and an example, the shared
option vocabulary, and user errors as one line with exit status 2 (issue 13)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _cli(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + str(REPO),
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "adaptcl.cli", *argv], capture_output=True,
                          text=True, env=environ, cwd=REPO, timeout=300, check=False)


@pytest.mark.parametrize("recipe", ["sts", "transfer", "simcse"])
def test_help_is_fast_shows_defaults_and_an_example_and_imports_no_torch(recipe):
    start = time.perf_counter()
    done = _cli(recipe, "--help")
    elapsed = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    assert elapsed < 3.0, f"adaptcl {recipe} --help took {elapsed:.1f} s"
    for option in ("--data-root", "--output-dir", "--threads", "--device", "--precision"):
        assert option in done.stdout
    assert "(default: " in done.stdout and "example:" in done.stdout
    probe = subprocess.run(
        [sys.executable, "-c", f"import sys, argparse; from adaptcl.recipes import {recipe} as r; "
         "getattr(r, 'RECIPE', r).add_arguments(argparse.ArgumentParser()); "
         "print(sorted(m for m in ('torch', 'transformers', 'sentence_transformers') "
         "if m in sys.modules))"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        check=True)
    assert probe.stdout.strip() == "[]"


def test_simcse_zero_epochs_is_one_line_and_exit_2(tmp_path):
    done = _cli("simcse", "--epochs", "-1", "--output-dir", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "adaptcl simcse: error: epochs must be a positive number, got -1.0"]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_simcse_16_mixed_on_cpu_is_one_line_suggesting_bf16_before_any_work(tmp_path):
    # accelerate ignores fp16=True on CPU and trains in float32: refused, never mislabelled
    done = _cli("simcse", "--device", "cpu", "--precision", "16-mixed", "--model",
                str(tmp_path / "no-model-needed"), "--output-dir", str(tmp_path / "out"))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("adaptcl simcse: error: --precision 16-mixed needs CUDA")
    assert "bf16-mixed" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_simcse_fewer_sentences_than_a_batch_is_one_line_before_transformers(tmp_path,
                                                                            shared_data):
    sentences = tmp_path / "five.txt"
    sentences.write_text("one .\ntwo .\nthree .\nfour .\nfive .\n")
    done = _cli("simcse", "--sentences", str(sentences), "--batch-size", "8", "--model",
                str(tmp_path / "no-model-needed-yet"), "--data-root", str(shared_data),
                "--output-dir", str(tmp_path / "out"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "5 sentences from" in lines[0] and "one batch of 8" in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_simcse_missing_model_is_one_line_before_any_work(tmp_path, shared_data):
    done = _cli("simcse", "--model", str(tmp_path / "no-such-model"), "--losses", "macl",
                "--data-root", str(shared_data), "--output-dir", str(tmp_path / "out"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("adaptcl simcse: error:")]
    assert "no-such-model" in line and "neither a local model folder" in line
    assert not (tmp_path / "out").exists()


def test_sts_nan_encoder_is_one_line_exit_2_and_nothing_cached(tmp_path, shared_data):
    done = _cli("sts", "--model", "tests.evaluation._bow:nan_bow", "--model-id", "nan-bow",
                "--tasks", "STS13", "--data-root", str(shared_data), "--output-dir",
                str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), "--no-progress")
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert errors == [errors[-1]] and errors[-1].startswith("adaptcl sts: error: encoder 'nan-bow'")
    assert "NaN" in errors[-1] and "Traceback" not in done.stderr
    assert not list(tmp_path.rglob("*.npy")) and not (tmp_path / "out" / "results.json").exists()


def test_old_spellings_still_parse_with_a_note(tmp_path, shared_data, capsys):
    from adaptcl.cli import main

    code = main(["transfer", "--model", "tests.evaluation._bow:hashed_bow", "--tasks", "TREC",
                 "--limit", "60", "--kfold", "2", "--classifier", "sklearn", "--seed", "7",
                 "--num-threads", "1", "--out-dir", str(tmp_path / "o"), "--data-root",
                 str(shared_data), "--no-progress"])
    assert code == 0
    err = capsys.readouterr().err
    assert "--seed is deprecated" in err and "--num-threads is deprecated" in err
    import json

    saved = json.loads((tmp_path / "o" / "results.json").read_text())
    assert saved["config"]["seeds"] == [7] and saved["environment"]["torch_threads"] == 1

