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


def test_written_file_replaces_the_old_one_with_ordinary_permissions(tmp_path):
    path = tmp_path / "sub" / "cache.pt"
    atomic_write(path, lambda handle: handle.write(b"\x00\x01"))
    atomic_write(path, lambda handle: handle.write(b"\x02"))
    assert path.read_bytes() == b"\x02"
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask
