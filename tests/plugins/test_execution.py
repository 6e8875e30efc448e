"""The scoped setting (:mod:`adaptcl.plugins.execution`): every execution choice in one home,
composing as ``torch.nn.attention.sdpa_kernel`` does.

A block changes only the fields it names, when it is entered, and restores them when it is left
(on an exception too); :func:`set_tiling` sets the process-wide default; the setting is process
wide, not thread-local; environment variables set two fields' defaults at import and refuse a
value they do not know. The first tests are the traps of issue 53 (each failed before it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import fields
from pathlib import Path

import pytest

from adaptcl.plugins import current_tiling, tiling

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _default_setting(monkeypatch):
    """Each test starts from the default setting and leaves it so."""
    from adaptcl.plugins import execution

    monkeypatch.setattr(execution, "_SETTING", execution.TilingSetting())


# --------------------------------------------------------------------------------------------
# The traps of issue 53, item 1
# --------------------------------------------------------------------------------------------

def test_an_inner_block_keeps_the_outer_blocks_budget():
    with tiling(max_logits_bytes=2**20):
        with tiling(backend="torch"):
            assert current_tiling().max_logits_bytes == 2**20
            assert current_tiling().backend == "torch"
        assert current_tiling().backend == "auto"
        assert current_tiling().max_logits_bytes == 2**20
    assert current_tiling().max_logits_bytes is None


def test_a_block_acts_when_entered_not_when_built():
    block = tiling(backend="torch", max_logits_bytes=123)
    assert current_tiling().backend == "auto" and current_tiling().max_logits_bytes is None
    with block as setting:
        assert setting == current_tiling()
        assert (setting.backend, setting.max_logits_bytes) == ("torch", 123)
    assert current_tiling().backend == "auto"


# --------------------------------------------------------------------------------------------
# Blocks, the process-wide default, threads
# --------------------------------------------------------------------------------------------

def test_blocks_nest_and_restore_what_they_changed_on_exit_and_on_an_exception():
    from adaptcl.plugins import TilingSetting

    with tiling(max_logits_bytes=2**20):
        with tiling(backend="triton", max_logits_bytes=5):
            assert current_tiling() == TilingSetting(backend="triton", max_logits_bytes=5)
        assert current_tiling() == TilingSetting(max_logits_bytes=2**20)
        with pytest.raises(RuntimeError, match="inside"), tiling(debug=True, backend="torch"):
            raise RuntimeError("inside")
        assert current_tiling() == TilingSetting(max_logits_bytes=2**20)  # restored on error
    assert current_tiling() == TilingSetting()


def test_set_tiling_sets_the_default_of_the_fields_it_names():
    from adaptcl.plugins import TilingSetting, set_tiling

    set_tiling(backend="torch")
    assert current_tiling() == TilingSetting(backend="torch")
    set_tiling(max_logits_bytes=7)  # the backend stays
    assert current_tiling() == TilingSetting(backend="torch", max_logits_bytes=7)
    with tiling(max_logits_bytes=9):
        set_tiling(debug=True)  # a field the block does not name: kept when it is left
        set_tiling(max_logits_bytes=11)  # one it names: the block restores its entry value
    assert current_tiling() == TilingSetting(backend="torch", max_logits_bytes=7, debug=True)


def test_a_decorated_function_runs_in_the_block_each_call():
    @tiling(backend="torch")
    def backend_inside(depth: int) -> list[str]:
        inner = backend_inside(depth - 1) if depth else []
        return [current_tiling().backend, *inner]

    assert backend_inside(2) == ["torch"] * 3  # re-entered recursively, restored each time
    assert current_tiling().backend == "auto"


def test_the_setting_is_process_wide_not_thread_local():
    seen = []
    with tiling(backend="torch", max_logits_bytes=123):
        thread = threading.Thread(target=lambda: seen.append(current_tiling()))
        thread.start()
        thread.join()
    assert [(s.backend, s.max_logits_bytes) for s in seen] == [("torch", 123)]


@pytest.mark.parametrize("kwargs, error, start", [
    ({"backend": "cuda"}, ValueError, "backend must be one of ('auto', 'triton', 'torch')"),
    ({"backend": None}, ValueError, "backend must be one of"),
    ({"max_logits_bytes": 0}, ValueError, "max_logits_bytes must be an int >= 1 (bytes) or None"),
    ({"max_logits_bytes": 1.5}, TypeError, "max_logits_bytes must be an int >= 1 (bytes)"),
    ({"max_logits_bytes": True}, TypeError, "max_logits_bytes must be an int"),
    ({"backward": "one-pass"}, ValueError, "backward must be one of ('split', 'onepass')"),
    ({"autotune": "maybe"}, TypeError, "autotune must be a bool"),
    ({"emulate_tensor_cores": 1}, TypeError, "emulate_tensor_cores must be a bool"),
    ({"debug": None}, TypeError, "debug must be a bool"),
    ({"tile_size": 64}, TypeError, "tiling() got an unexpected keyword argument 'tile_size'"),
])
def test_a_bad_value_is_refused_in_one_line_naming_it_and_nothing_is_set(kwargs, error, start):
    from adaptcl.plugins import TilingSetting, set_tiling

    for call in (tiling, set_tiling):
        with pytest.raises(error) as raised:
            call(**kwargs)
        message = str(raised.value).replace("set_tiling()", "tiling()")
        assert message.startswith(start) and "\n" not in message, message
        assert current_tiling() == TilingSetting()


def test_every_field_is_set_by_the_block_and_the_default_alike():
    """A new knob is one field: the block and the default take it by its name, checked."""
    from adaptcl.plugins import TilingSetting, set_tiling

    default = TilingSetting()
    for f in fields(TilingSetting):
        value = getattr(default, f.name)
        with tiling(**{f.name: value}):
            assert current_tiling() == default
        set_tiling(**{f.name: value})
        assert "check" in f.metadata


# --------------------------------------------------------------------------------------------
# The environment variables (issue 54, item 4)
# --------------------------------------------------------------------------------------------

def test_the_environment_sets_two_fields_defaults():
    from adaptcl.plugins import TilingSetting
    from adaptcl.plugins.execution import _defaults_from

    assert _defaults_from({}) == TilingSetting()
    assert _defaults_from({"ADAPTCL_TRITON_BACKWARD": "onepass"}).backward == "onepass"
    assert _defaults_from({"ADAPTCL_TRITON_BACKWARD": " Split "}).backward == "split"
    for on in ("1", "true", "ON", "yes"):
        assert _defaults_from({"ADAPTCL_TRITON_AUTOTUNE": on}).autotune is True
    for off in ("0", "false", "off", "No", ""):
        assert _defaults_from({"ADAPTCL_TRITON_AUTOTUNE": off}).autotune is False


@pytest.mark.parametrize("variable, value, start", [
    ("ADAPTCL_TRITON_BACKWARD", "one-pass",
     "ADAPTCL_TRITON_BACKWARD must be one of split, onepass, got 'one-pass'"),
    ("ADAPTCL_TRITON_AUTOTUNE", "maybe",
     "ADAPTCL_TRITON_AUTOTUNE must be one of 1, true, on, yes, 0, false, off, no, got 'maybe'"),
])
def test_a_value_the_environment_does_not_know_is_refused_naming_the_variable(variable, value,
                                                                                start):
    from adaptcl.plugins.execution import _defaults_from

    with pytest.raises(ValueError) as raised:
        _defaults_from({variable: value})
    assert str(raised.value) == start


@pytest.mark.slow
def test_importing_with_the_environment_sets_or_refuses():
    """The variables are read when ``adaptcl.plugins`` is imported (a fresh process each)."""
    code = ("import adaptcl.plugins as P; s = P.current_tiling(); "
            "print(s.backward, s.autotune)")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}",
           "ADAPTCL_TRITON_BACKWARD": "onepass", "ADAPTCL_TRITON_AUTOTUNE": "on"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["onepass", "True"]
    env["ADAPTCL_TRITON_BACKWARD"] = "one-pass"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "ValueError: ADAPTCL_TRITON_BACKWARD must be one of split, onepass, got 'one-pass'")
