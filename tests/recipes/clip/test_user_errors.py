"""``adaptcl clip``'s mistakes are one line ``adaptcl clip: error: ...``, exit 2, before any
work or file write."""

from __future__ import annotations

import pytest

pytest.importorskip("open_clip")

from adaptcl import cli  # noqa: E402


def _one_line_error(capsys, argv: list[str], expected: str) -> str:
    try:
        code = cli.main(["clip", *argv])
    except SystemExit as exit_:  # the command line's own refusals
        code = exit_.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("adaptcl ")
             or "error" in line.lower()]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("adaptcl clip: error: ") and expected in lines[0], err
    return lines[0]


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
    out = tmp_path / "out"
    _one_line_error(capsys, [*argv, "--data-root", str(shared_data), "--output-dir", str(out),
                             "--seeds", "0"], expected)
    assert not out.exists()  # no run store


def test_missing_data_is_one_line_before_any_file(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    _one_line_error(capsys, ["--data-root", str(tmp_path / "empty"), "--output-dir", str(out)],
                    f"no cifar10_*.npz files in {tmp_path / 'empty'}")
    _one_line_error(capsys, ["--data-root", str(tmp_path / "nowhere"), "--output-dir", str(out)],
                    "is not a directory")
    assert not out.exists()
