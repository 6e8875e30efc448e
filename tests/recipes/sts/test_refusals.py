"""``sts`` never turns non-finite or constant embeddings into results (issue 13): the
evaluation's refusals reach the user as the engine's errors, and nothing is cached or stored
(``transfer``'s: tests/recipes/transfer/test_transfer.py). The embedding cache itself:
tests/evaluation/senteval/test_encoders.py."""

from __future__ import annotations

import json
import warnings

import pytest

from adaptcl.recipes.engine import DivergedError, NonResultError
from adaptcl.recipes.sts.config import STSConfig
from adaptcl.recipes.sts.recipe import STSRecipe
from tests.evaluation._bow import SwitchableEncoder


def _sts_config(encoder, tmp_path, **kwargs):
    return STSConfig(model=encoder, tasks=["STSBenchmark"], data_root=kwargs.pop("root"),
                     output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"),
                     progress=False, batch_size=512, **kwargs)


def test_nan_encoder_fails_sts_caches_nothing_and_fixed_encoder_then_scores(shared_data, tmp_path):
    encoder = SwitchableEncoder("nan")
    with pytest.raises(NonResultError,  # the evaluation's NonFiniteError, as a refusal
                       match=r"encoder 'switchable' on 'STSBenchmark': \d+ embeddings contain NaN"
                       ) as err:
        STSRecipe(_sts_config(encoder, tmp_path, root=str(shared_data))).run()
    assert not isinstance(err.value, DivergedError)  # a frozen encoder does not diverge
    assert not list(tmp_path.rglob("*.npy"))  # nothing cached
    assert not (tmp_path / "out" / "results.json").exists()

    encoder.mode = "ok"  # the same model_id, fixed: the rerun must encode again and score
    result = STSRecipe(_sts_config(encoder, tmp_path, root=str(shared_data))).run()
    assert 20 < result["table"]["STS-B"] < 80
    saved = (tmp_path / "out" / "results.json").read_text()
    assert "NaN" not in saved and json.loads(saved)["table"]["STS-B"] == result["table"]["STS-B"]
    assert len(list((tmp_path / "cache").rglob("*.npy"))) == 1


@pytest.mark.parametrize("mode", ["zero", "constant"])
def test_constant_or_zero_embeddings_give_a_clear_error_not_nan(shared_data, tmp_path, mode):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no scipy ConstantInputWarning on the way
        with pytest.raises(NonResultError, match="every embedding is the same vector") as err:
            STSRecipe(_sts_config(SwitchableEncoder(mode), tmp_path,
                                  root=str(shared_data))).run()
    assert not isinstance(err.value, DivergedError)  # refused, not diverged
    assert not list((tmp_path / "out").rglob("*.json"))  # no record, no result (locks only)

