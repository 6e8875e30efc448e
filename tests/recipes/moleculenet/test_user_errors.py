"""Every ordinary mistake with ``adaptcl moleculenet`` is one line ``adaptcl moleculenet:
error: ...``, exit 2, before any work or file write."""

from __future__ import annotations

import pytest

from adaptcl import cli


def _one_line_error(capsys, argv: list[str], expected: str) -> None:
    try:
        code = cli.main(["moleculenet", *argv])
    except SystemExit as exit_:  # the parser's own refusals
        code = exit_.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("adaptcl moleculenet: error: "), err
    assert expected in lines[0], err


def test_output_dir_that_is_a_file_is_refused_before_any_work(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    _one_line_error(capsys, ["--output-dir", str(afile)], "is a file, not a folder")
    _one_line_error(capsys, ["--output-dir", str(afile / "sub")],
                    f"is inside '{afile}', which is a file")
    assert afile.read_text() == "not a folder"


@pytest.mark.parametrize("argv, expected", [
    (["--lr", "nan"], "lr must be a finite number, got nan"),
    (["--temperature", "0"], "temperature must be a positive number, got 0.0"),
    (["--alpha", "-3"], "alpha must be a finite number >= 0"),  # MACL's own check
    (["--alpha", "0.5", "-3"], "alpha must be a finite number >= 0"),  # at every point
    (["--inits", "none", "simclr"], "unknown init 'simclr'; choose from none, dcl"),
    (["--frac-train", "0.8", "0.95"], "frac_train=0.95: frac_train + frac_valid must be < 1"),
    (["--data-root", "/nonexistent"], "data root '/nonexistent' is not a directory"),
    (["--data-root", "{empty}"], "no BBBP.csv for 'bbbp' under '{empty}'"),
    (["--pretrain-smiles", "/nonexistent/zinc.csv"], "/nonexistent/zinc.csv"),
    (["--devices", "2", "--pretrain-batch-size", "15"], "pretrain_batch_size (15) must be a "
     "multiple of devices (2)"),
    (["--threads", "1", "2"], "--threads takes one value"),
    (["--cache-dir", "{afile}/cache"], "--cache-dir '{afile}/cache' is inside '{afile}', which is "
     "a file"),
])
def test_bad_settings_are_refused_before_the_data_is_touched(argv, expected, shared_data,
                                                              tmp_path, capsys):
    out, empty, afile = tmp_path / "out", tmp_path / "empty", tmp_path / "afile"
    empty.mkdir()
    afile.write_text("not a folder")
    argv = [arg.format(empty=empty, afile=afile) for arg in argv]
    _one_line_error(capsys, ["--data-root", str(shared_data), "--output-dir", str(out),
                             "--datasets", "bbbp", *argv], expected.format(empty=empty, afile=afile))
    assert not out.exists()  # no cache, no run store
