"""What produced a result: content fingerprints, the environment with the CPU's kernel path."""

from __future__ import annotations

import pytest
import torch

from adaptcl.recipes.engine.provenance import (
    cpu_capability,
    environment,
    fingerprint_files,
    package_versions,
)


def test_fingerprint_follows_content_not_location(tmp_path):
    for where in ("a", "b"):
        (tmp_path / where).mkdir()
        (tmp_path / where / "x.txt").write_text("1 2 3\n")
    fa = fingerprint_files([tmp_path / "a"], root=tmp_path / "a")
    fb = fingerprint_files([tmp_path / "b"], root=tmp_path / "b")
    assert fa == fb and fa["files"] == 1 and fa["bytes"] == 6
    (tmp_path / "b" / "x.txt").write_text("1 2 4\n")
    assert fingerprint_files([tmp_path / "b"], root=tmp_path / "b") != fa
    with pytest.raises(FileNotFoundError):
        fingerprint_files([tmp_path / "missing"])


def test_the_environment_records_the_cpu_kernel_path_and_the_versions():
    env = environment(frameworks=["numpy", "no-such-package"])
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability() == cpu_capability()
    assert env["frameworks"]["no-such-package"] is None and env["frameworks"]["numpy"]
    assert package_versions(["torch"])["torch"] == torch.__version__.split("+")[0] or \
        package_versions(["torch"])["torch"] == torch.__version__


def test_the_environment_names_the_variables_that_chose_other_kernels(monkeypatch):
    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
                 "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR"):
        monkeypatch.delenv(name, raising=False)
    assert environment()["kernel_overrides"] == {}
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "")  # empty: not set
    assert environment()["kernel_overrides"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
