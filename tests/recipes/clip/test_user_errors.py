"""``adaptcl clip``'s mistakes are one line ``adaptcl clip: error: ...``, exit 2, before any
work or file write."""

from __future__ import annotations

import pytest

pytest.importorskip("open_clip")

from tests.recipes._cli import refused_before_any_file  # noqa: E402


@pytest.mark.parametrize("argv, expected", [
    (["--losses", "ascl"], "ascl"),
    (["--targets", "soft"], "unknown targets 'soft'"),
    (["--templates", "19"], "templates must be at most 18"),
    (["--patch-size", "5"], "patch_size must divide the 32-pixel CIFAR-10 images, got 5"),
    (["--text-width", "40"], "text_width (40) must be a multiple of head_width (32)"),
    (["--min-temperature", "0.2", "--max-temperature", "0.1"],
     "min_temperature (0.2) must be below max_temperature (0.1)"),
    (["--lr", "nan"], "lr must be a finite number, got nan"),
    (["--threads", "1", "2"], "--threads takes one value"),
    (["--precision", "16-mixed", "--device", "cpu"], "--precision 16-mixed needs CUDA"),
    (["--losses", "dcl", "--targets", "labels"], "loss dcl takes no labels"),
    (["--batch-size", "5000"], "the training set (4000 images) is smaller than one batch "
                               "(5000); lower --batch-size"),
    (["--context-length", "8"], "context_length (8) is shorter than the longest caption"),
])
def test_bad_settings_are_one_line_before_any_file(argv, expected, shared_data, tmp_path,
                                                   capsys):
    refused_before_any_file(capsys, ["clip", *argv, "--data-root", str(shared_data), "--seeds",
                                     "0"], expected, tmp_path / "out")


def test_missing_data_is_one_line_before_any_file(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    refused_before_any_file(capsys, ["clip", "--data-root", str(tmp_path / "empty")],
                            f"no cifar10_*.npz files in {tmp_path / 'empty'}", tmp_path / "out")
    refused_before_any_file(capsys, ["clip", "--data-root", str(tmp_path / "nowhere")],
                            "is not a directory", tmp_path / "out")
