"""``benchmarks/kernel_reach.py``: the launches the losses reach are enumerated, not listed.

* the options come from the constructors' signatures and the losses from the test table, so a
  new choice option joins by itself;
* a new flag joins by itself: a launcher that passes one more constexpr (put in here by a
  patch of ``_fused._flags`` in the enumeration's process) shows it, with each value where it
  is set, and as a flag, not layout;
* recording without running is sound: under the interpreter, each configuration launches
  exactly what it records when its launches are skipped;
* every constexpr parameter of every kernel is in what a launch records.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks import kernel_reach
from benchmarks.kernel_build import kernel_function

pytest.importorskip("triton", reason="the enumeration records Triton launches")


def test_the_options_are_the_constructors_choices_and_the_shared_keywords_are_not():
    from adaptcl.plugins import DySTreSSLoss, MACLLoss

    choices = kernel_reach._choices(DySTreSSLoss)
    assert choices["shape"] == ("cosine", "piecewise")
    assert set(choices["detach_temperature"]) == {False, True}
    assert choices["form"] == ("nt_xent", "cross_view", "cross_view_symmetric", "queue")
    assert None in choices["hardness_mode"]
    assert not set(kernel_reach.SHARED) & set(choices)
    assert {"reweight", "adaptive", "temperature_form", "weight_form"} <= set(
        kernel_reach._choices(MACLLoss))
    # the labels axis is the call's, where the class takes labels
    assert kernel_reach.axes("dystress")["labels"] == (False, True)
    assert kernel_reach.axes("dcl")["labels"] == (False,)


def test_an_option_that_adds_a_launch_is_crossed_with_the_others():
    """The first stage on a fake ``launch``: ``shape=piecewise`` and ``labels`` each add a
    launch on their own, so every combination of the two runs, in every form."""
    def launch(config):
        flags = (config.get("shape"), config.get("labels"), config.get("form"))
        return kernel_reach.Outcome(launches=[("fwd", flags)])

    ran = kernel_reach.first_stage(["dystress"], launch=launch)
    seen = {(c.get("shape"), c.get("labels"), c.get("form")) for c in ran}
    assert {(s, lab, f) for s in ("cosine", "piecewise") for lab in (False, True)
            for f in ("nt_xent", "cross_view", "cross_view_symmetric", "queue")} <= seen
    # an option that adds nothing on its own (here: all but those) stays at the case's value
    # wherever another changed
    piecewise = [c for c in ran if c.get("shape") == "piecewise"]
    assert {c.get("positive_in_denominator") for c in piecewise} == {True}
    assert {c.get("gather") for c in piecewise} == {False}
    assert {c.get("positive_in_denominator") for c in ran} == {False, True}


FRESH = """
from adaptcl.plugins.tiles import _fused
_flags = _fused._flags
_fused._flags = lambda pos, own, labels, term: {**_flags(pos, own, labels, term),
                                                "FRESH": labels is not None}
"""


@pytest.mark.slow
def test_a_new_flag_joins_the_reachable_sets_by_itself():
    result = kernel_reach.enumerate_in_subprocess(
        ["--cases", "infonce", "dystress", "--gate", "--arch", "90", "--precision", "bf16"],
        prelude=FRESH)
    assert "FRESH" not in result["layout"]
    specs = kernel_reach.specs_of(result)
    rows = [s for s in specs if s.kernel in ("fwd", "dq", "dk", "bwd")]
    assert rows and all("FRESH" in dict(s.flags) for s in rows)
    assert all(dict(s.flags)["FRESH"] == dict(s.flags)["HAS_LAB"] for s in rows)
    assert {dict(s.flags)["FRESH"] for s in rows} == {False, True}


SOUND = """
import json, sys
from benchmarks import kernel_reach as R
out = []
for case in sys.argv[1:]:
    base = R.base_configuration(case)
    for config in (base, base.but(labels=True), base.but(form="queue", bank=True)):
        config = R._normalised(config)
        ran = R.run(config, None, "ieee", 20, execute=True)
        skipped = R.run(config, None, "ieee", 20)
        if ran.invalid is None and ran.refused is None:
            out.append([config.text(), ran.launches == skipped.launches, len(ran.launches)])
print(json.dumps(out))
"""


@pytest.mark.slow
def test_recording_without_running_records_what_running_launches():
    cases = ["infonce", "dcl", "macl_plain", "schedule", "learnable", "dystress_exact",
             "dystress_piecewise", "amcl_softmax", "amcl_constant"]
    run = subprocess.run([sys.executable, "-c", SOUND, *cases], cwd=kernel_reach.ROOT,
                         env=kernel_reach._interpreted_env(), capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    compared = json.loads(run.stdout)
    assert len(compared) >= 2 * len(cases) and all(n > 0 for _, _, n in compared)
    assert [text for text, same, _ in compared if not same] == []


@pytest.mark.slow
def test_every_constexpr_of_every_kernel_is_recorded_as_a_flag_layout_or_block():
    specs = kernel_reach.reachable("--gate")
    assert {s.kernel for s in specs} == {"fwd", "dq", "dk", "bwd", "pair_fwd", "pair_dq",
                                         "pair_dk"}
    for spec in {s.function: s for s in specs}.values():
        fn = kernel_function(spec)
        constexprs = {p.name for p in fn.params if p.is_constexpr}
        assert constexprs == {k for k, _ in spec.constexprs}, spec.function
        assert [n for n, _ in spec.signature] == [p.name for p in fn.params
                                                  if not p.is_constexpr]
