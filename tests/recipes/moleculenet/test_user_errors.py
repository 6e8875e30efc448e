"""Every ordinary mistake with ``adaptcl moleculenet`` is one line ``adaptcl moleculenet:
error: ...``, exit 2, before any work or file write."""

from __future__ import annotations

import pytest

from tests.recipes._cli import refused_before_any_file


@pytest.mark.parametrize("argv, expected", [
    (["--lr", "nan"], "lr must be a finite number, got nan"),
    (["--temperature", "0"], "temperature must be a positive number, got 0.0"),
    (["--alpha", "-3"], "alpha must be a number >= 0, got -3.0"),  # MACL's range, declared
    (["--alpha", "0.5", "-3"], "alpha must be a number >= 0, got -3.0"),  # at every point
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
    refused_before_any_file(capsys, ["moleculenet", "--data-root", str(shared_data),
                                     "--datasets", "bbbp", *argv],
                            expected.format(empty=empty, afile=afile), out)  # no cache either
