"""Files a recipe writes and reads: strict JSON, derived files and checkpoints rebuilt when
corrupt, an output folder refused before any work."""

from __future__ import annotations

import errno

import pytest

from adaptcl.recipes.engine.files import (
    check_output_dir,
    load_or_rebuild,
    storage_error,
    torch_load_checked,
    write_json_atomic,
)


def test_json_results_refuse_nan(tmp_path):
    with pytest.raises(ValueError, match="refusing to write"):
        write_json_atomic(tmp_path / "r.json", {"acc": float("nan")})
    assert not (tmp_path / "r.json").exists()


def test_corrupt_derived_file_is_named_and_rebuilt(tmp_path, capsys):
    import torch

    path = tmp_path / "data.pt"
    torch.save({"x": torch.arange(10)}, path)
    path.write_bytes(path.read_bytes()[:40])  # killed mid-write

    def rebuild():
        torch.save({"x": torch.arange(3)}, path)
        return torch.load(path)

    value = load_or_rebuild(path, lambda: torch.load(path), rebuild, what="cache")
    assert value["x"].tolist() == [0, 1, 2]
    assert f"cache at {path} is corrupt or truncated" in capsys.readouterr().err


def test_corrupt_checkpoint_is_named_kept_aside_and_not_loaded(tmp_path, capsys):
    import torch

    path = tmp_path / "last.ckpt"
    assert torch_load_checked(path, what="checkpoint") is None  # missing: start afresh
    torch.save({"epoch": 3}, path)
    assert torch_load_checked(path, what="checkpoint", weights_only=True) == {"epoch": 3}
    path.write_bytes(path.read_bytes()[:30])
    assert torch_load_checked(path, what="checkpoint", weights_only=True) is None
    assert f"checkpoint at {path} is corrupt" in capsys.readouterr().err
    assert not path.exists() and (tmp_path / "last.ckpt.corrupt").is_file()


def test_an_output_folder_inside_a_file_is_refused_creating_nothing(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError, match="is inside .* which is a file"):
        check_output_dir(tmp_path / "f" / "out")
    assert check_output_dir(tmp_path / "new" / "out") == tmp_path / "new" / "out"
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("err, expected", [
    (OSError(errno.EROFS, "Read-only file system", "/x/y.json"),
     "the file system is read-only writing /x/y.json"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "the disk quota is exceeded"),
    (OSError(errno.ENOSPC, "No space left on device", "/data/a.txt", None, "/work/a.txt"),
     "the disk is full writing /work/a.txt (No space left"),  # a copy: its destination
    (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0"),
     "writing a checkpoint failed (is the disk full?)"),
    (RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"),
     "writing a checkpoint failed"),
])
def test_storage_errors_are_named(err, expected):
    assert expected in storage_error(err)


@pytest.mark.parametrize("err", [OSError(errno.ENOENT, "No such file"), RuntimeError("boom"),
                                 ValueError("x")])
def test_other_errors_stay_crashes(err):
    assert storage_error(err) is None


@pytest.mark.parametrize("err", [OSError(errno.ENOSPC, "No space left on device"),
                                 RuntimeError("PytorchStreamWriter failed writing file data/0: "
                                              "file write failed")])
def test_a_derived_file_the_disk_refuses_is_one_line_naming_it_not_a_corrupt_one(tmp_path, capsys,
                                                                                err):
    """A full disk while a dataset is processed is no corruption: rebuilding would fail the same
    way. One line names the folder (the error itself names none), what was left is deleted."""
    from adaptcl.recipes.engine.errors import RecipeError

    processed = tmp_path / "MUTAG" / "processed"

    def build():
        processed.mkdir(parents=True)
        (processed / "data.pt").write_bytes(b"half")
        raise err

    with pytest.raises(RecipeError) as info:
        load_or_rebuild(processed, build, build, what="processed MUTAG dataset")
    assert f"writing {processed} " in str(info.value) and "\n" not in str(info.value)
    assert "corrupt" not in capsys.readouterr().err and not processed.exists()

