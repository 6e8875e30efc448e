"""``adaptcl tu``: every bad setting is one line before the data is touched or a file written."""

from __future__ import annotations

import pytest

from adaptcl import cli


@pytest.mark.parametrize("argv, expected", [
    (["--lr", "nan"], "lr must be a finite number, got nan"),
    (["--temperature", "0"], "temperature must be a positive number, got 0.0"),
    (["--alpha", "-3"], "alpha must be a number >= 0, got -3.0"),
    (["--folds", "1"], "folds must be a number >= 2, got 1"),
    (["--folds", "500"], "folds=500 is more than MUTAG can stratify: its smallest class has 63 "
                         "graphs (188 in all)"),
    (["--inner-folds", "100"], "inner_folds=100 is more than MUTAG's outer training folds can "
                               "stratify (the smallest class has 56 graphs there)"),
    (["--c-grid", "1", "-1"], "each value of c_grid must be a positive number"),
    (["--aug-ratio", "1.5"], "aug_ratio must be a number in [0, 1), got 1.5"),
    (["--temperature", "0.1", "-1"], "temperature=-1.0: temperature must be a positive number"),
    (["--threads", "1", "2"], "--threads takes one value (it cannot vary within one run), got 1 2"),
    (["--losses", "ascl"], "loss 'ascl' is not available here"),
])
def test_bad_settings_are_refused_before_the_data_is_touched(argv, expected, shared_data,
                                                             tmp_path, capsys):
    out = tmp_path / "out"
    code = cli.main(["tu", *argv, "--data-root", str(shared_data), "--output-dir", str(out),
                     "--datasets", "MUTAG"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("adaptcl tu: error: ") and expected in err, err
    assert not out.exists()  # no processed data, no run store


def test_a_full_disk_while_copying_the_raw_data_is_one_line_and_leaves_no_partial_copy(
        shared_data, tmp_path, capsys, monkeypatch):
    import errno
    import shutil

    real = shutil.copyfile

    def full(src, dst, **kwargs):
        if str(src).endswith("_A.txt"):  # the largest file: the disk fills up there
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real(src, dst, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", full)
    out = tmp_path / "out"
    code = cli.main(["tu", "--data-root", str(shared_data), "--datasets", "MUTAG", "--seeds", "0",
                     "--output-dir", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("adaptcl tu: error: the disk is full "
                                                             "writing "), err
    assert not [p for p in (out / "data").rglob("*") if p.name.startswith(".raw.")]


def test_a_full_disk_under_the_work_folder_names_the_work_folder_not_the_data(
        shared_data, tmp_path, capsys, monkeypatch):
    import errno
    import os

    def full(out_fd, in_fd, offset, count):  # what the kernel says when the copy fills the disk
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "sendfile", full)  # shutil.copyfile's fast path on Linux
    work = tmp_path / "work"
    code = cli.main(["tu", "--data-root", str(shared_data), "--datasets", "MUTAG", "--seeds", "0",
                     "--output-dir", str(tmp_path / "out"), "--work-dir", str(work),
                     "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"adaptcl tu: error: the disk is full writing {work}{os.sep}"), err
    assert str(shared_data) not in err[0], err


def test_a_work_folder_that_cannot_be_written_is_refused_before_any_work(shared_data, tmp_path,
                                                                         capsys, monkeypatch):
    import os
    from pathlib import Path

    locked = tmp_path / "work"
    locked.mkdir()
    real_access = os.access  # the tests run as root, for whom permissions do not apply
    monkeypatch.setattr(os, "access", lambda path, mode: (Path(path) != locked
                                                           and real_access(path, mode)))
    out = tmp_path / "out"
    assert cli.main(["tu", "--data-root", str(shared_data), "--datasets", "MUTAG", "--work-dir",
                     str(locked), "--output-dir", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"adaptcl tu: error: --work-dir '{locked}' is not writable: pick a folder this user can "
        "write")
    assert not out.exists()


@pytest.mark.slow
def test_training_that_diverges_is_one_line_naming_the_step(shared_data, tmp_path, capsys):
    code = cli.main(["tu", "--data-root", str(shared_data), "--datasets", "MUTAG", "--losses",
                     "dcl", "--seeds", "0", "--epochs", "2", "--lr", "1e30", "--no-progress",
                     "--no-plot", "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith(
        "adaptcl tu: error: 1 of 1 run diverged (NaN or inf; nothing stored for them): "
        "MUTAG/dcl/seed0 at step "), err
    assert not list((tmp_path / "runs").rglob("seed0.json"))
    assert "DIVERGED" in (tmp_path / "results.md").read_text()  # the file says so too
