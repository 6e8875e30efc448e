"""``atomic_write``: the one crash-safe writer behind checkpoints, caches and result files."""

from __future__ import annotations

import os

import pytest

from adaptcl.io import atomic_write


def test_a_failing_write_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "result.json"
    path.write_text("old")

    def half_then_fail(handle):
        handle.write("new, but cut")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, half_then_fail, binary=False)
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_a_full_disk_names_the_file_being_written_not_its_temporary_file(tmp_path):
    """The kernel's ENOSPC of a write to an open file names no file; a failure of the
    temporary file names that (``.result.json.<random>.tmp``): both name the file written."""
    import errno

    path = tmp_path / "result.json"

    def full(handle):
        raise OSError(errno.ENOSPC, "No space left on device")

    def tmp_full(handle):
        (tmp,) = tmp_path.glob(".result.json.*.tmp")
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp))

    for write in (full, tmp_full):
        with pytest.raises(OSError) as info:
            atomic_write(path, write, binary=False)
        assert info.value.filename == str(path)
        assert str(info.value) == f"[Errno {errno.ENOSPC}] No space left on device: '{path}'"
    assert list(tmp_path.iterdir()) == []


def test_written_file_replaces_the_old_one_with_ordinary_permissions(tmp_path):
    path = tmp_path / "sub" / "cache.pt"
    atomic_write(path, lambda handle: handle.write(b"\x00\x01"))
    atomic_write(path, lambda handle: handle.write(b"\x02"))
    assert path.read_bytes() == b"\x02"
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask
