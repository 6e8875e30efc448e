"""sts / transfer never turn non-finite or constant embeddings into results, and their embedding
cache is keyed on the encoder's identity (not its name) and verified on load (issue 13)."""

from __future__ import annotations

import json
import logging
import os
import warnings

import numpy as np
import pytest

from adaptcl.recipes import sts
from adaptcl.recipes import transfer as tr
from adaptcl.recipes.encoders import (
    SentenceEncoder,
    _folder_fingerprint,
    build_encoder,
    check_embeddings,
)
from adaptcl.recipes.template.errors import NonResultError
from tests.recipes._bow import CountingEncoder, hashed_bow


class SwitchableEncoder(CountingEncoder):
    """Hashed bag of words that can be broken (NaN, zeros or a constant vector)."""

    def __init__(self, mode: str = "ok") -> None:
        super().__init__()
        self.mode = mode
        self.model_id = "switchable"

    def __call__(self, sentences):
        out = super().__call__(sentences)
        if self.mode == "nan":
            out[::3] = np.nan
        elif self.mode == "zero":
            out[:] = 0.0
        elif self.mode == "constant":
            out[:] = 0.5
        return out


def _sts_config(encoder, tmp_path, **kwargs):
    return sts.STSConfig(model=encoder, tasks=["STSBenchmark"], data_root=kwargs.pop("root"),
                         output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"),
                         progress=False, batch_size=512, **kwargs)


def test_nan_encoder_fails_sts_caches_nothing_and_fixed_encoder_then_scores(shared_data, tmp_path):
    encoder = SwitchableEncoder("nan")
    with pytest.raises(NonResultError,
                       match=r"encoder 'switchable' on 'STSBenchmark': \d+ embeddings contain NaN"):
        sts.STSRecipe(_sts_config(encoder, tmp_path, root=str(shared_data))).run()
    assert not list(tmp_path.rglob("*.npy"))  # nothing cached
    assert not (tmp_path / "out" / "results.json").exists()

    encoder.mode = "ok"  # the same model_id, fixed: the rerun must encode again and score
    result = sts.STSRecipe(_sts_config(encoder, tmp_path, root=str(shared_data))).run()
    assert 20 < result["table"]["STS-B"] < 80
    saved = (tmp_path / "out" / "results.json").read_text()
    assert "NaN" not in saved and json.loads(saved)["table"]["STS-B"] == result["table"]["STS-B"]
    assert len(list((tmp_path / "cache").rglob("*.npy"))) == 1


@pytest.mark.parametrize("mode", ["zero", "constant"])
def test_constant_or_zero_embeddings_give_a_clear_error_not_nan(shared_data, tmp_path, mode):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no scipy ConstantInputWarning on the way
        with pytest.raises(NonResultError, match="every embedding is the same vector"):
            sts.STSRecipe(_sts_config(SwitchableEncoder(mode), tmp_path,
                                      root=str(shared_data))).run()
    assert not (tmp_path / "out").exists()


def test_constant_system_scores_are_refused_by_correlations():
    with pytest.raises(ValueError, match="all 3 system scores equal 0.5"):
        sts.correlations([0.5, 0.5, 0.5], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="system scores contain NaN"):
        sts.correlations([0.1, float("nan"), 0.3], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="non-finite"):
        sts.cosine_scores(np.array([[np.nan, 1.0]]), np.array([[1.0, 1.0]]))


def test_transfer_reports_no_accuracy_from_nan_features(shared_data, tmp_path):
    config = tr.TransferConfig(model=SwitchableEncoder("nan"), tasks=["CR"], data_root=str(shared_data),
                               output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"),
                               limit=60, kfold=2, progress=False)
    with pytest.raises(NonResultError, match="on 'CR': .* contain NaN"):
        tr.TransferRecipe(config).run()
    assert not (tmp_path / "out").exists()


def test_check_embeddings_accepts_finite_varied_and_rejects_bad_shapes():
    good = hashed_bow(["a b", "c d"])
    assert check_embeddings(good, "m", "d") is good
    with pytest.raises(NonResultError, match="encoder 'm' on 'd': no embeddings"):
        check_embeddings(np.zeros((2, 0), np.float32), "m", "d")
    with pytest.raises(NonResultError, match="1 embeddings contain NaN or inf"):
        check_embeddings(np.array([[1.0, np.inf], [0.0, 1.0]]), "m", "d")


def test_callable_without_model_id_is_never_cached(tmp_path):
    def bow(sentences):  # no model_id: its code may change under the same name
        return hashed_bow(sentences)

    sentences = ["a b c", "d e f"]
    enc = build_encoder(bow, cache_dir=tmp_path, show_progress=False)
    enc.encode(sentences, dataset="toy")
    enc.encode(sentences, dataset="toy")
    assert enc.batches_encoded == 2 and not list(tmp_path.rglob("*.npy"))
    named = build_encoder(bow, model_id="bow-v1", cache_dir=tmp_path, show_progress=False)
    named.encode(sentences, dataset="toy")
    named.encode(sentences, dataset="toy")
    assert named.batches_encoded == 1 and len(list(tmp_path.rglob("*.npy"))) == 1


def test_cache_key_follows_model_weights_not_name_or_mtime(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    weights = model / "model.safetensors"
    weights.write_bytes(b"weights-one")
    stat = weights.stat()
    before = _folder_fingerprint(model)
    weights.write_bytes(b"weights-two")  # same size, same mtime: only the content differs
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = _folder_fingerprint(model)
    assert before != after

    def encoder(fingerprint):
        return SentenceEncoder("same-name", cache_dir=tmp_path, fingerprint=fingerprint)

    assert encoder(before).cache_path("d", ["x"]) != encoder(after).cache_path("d", ["x"])
    assert encoder(before).cache_path("d", ["x"]) == encoder(before).cache_path("d", ["x"])


def test_tiny_hf_model_saved_again_under_same_path_misses_the_cache(tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoModel

    from tests.adapters._tiny_models import build_tiny_model

    path = build_tiny_model(tmp_path / "tiny", "bert")
    sentences = ["a man is playing a guitar .", "the cat sits on the mat ."]
    first = build_encoder(str(path), pooler="avg", cache_dir=tmp_path / "c", show_progress=False)
    a = first.encode(sentences, dataset="toy")
    retrained = AutoModel.from_pretrained(path)
    for parameter in retrained.parameters():
        parameter.data.add_(0.1)
    retrained.save_pretrained(path)
    second = build_encoder(str(path), pooler="avg", cache_dir=tmp_path / "c", show_progress=False)
    b = second.encode(sentences, dataset="toy")
    assert second.batches_encoded == 1  # not served the old model's embeddings
    assert not np.allclose(a, b)
    assert first.fingerprint != second.fingerprint and first.fingerprint.startswith("files:")


def test_truncated_cache_is_named_and_rebuilt(tmp_path, caplog):
    counting = CountingEncoder()
    sentences = ["a b c", "a much longer sentence", "x y"]
    enc = build_encoder(counting, cache_dir=tmp_path, show_progress=False)
    expected = enc.encode(sentences, dataset="toy")
    (path,) = tmp_path.rglob("*.npy")
    path.write_bytes(path.read_bytes()[:-20])  # a kill while writing, or a full disk
    with caplog.at_level(logging.WARNING, logger="adaptcl.recipes"):
        again = build_encoder(counting, cache_dir=tmp_path, show_progress=False)
        np.testing.assert_array_equal(again.encode(sentences, dataset="toy"), expected)
    assert counting.calls == 2  # re-encoded, not loaded
    assert str(path) in caplog.text and "SHA-256 does not match" in caplog.text
    third = build_encoder(counting, cache_dir=tmp_path, show_progress=False)
    third.encode(sentences, dataset="toy")
    assert counting.calls == 2  # the rebuilt entry is good again


def test_precision_is_part_of_the_cache_key(tmp_path):
    full = SentenceEncoder("m", cache_dir=tmp_path, fingerprint="files:abc")
    bf16 = SentenceEncoder("m", cache_dir=tmp_path, fingerprint="files:abc", precision="bf16-mixed")
    assert full.cache_path("d", ["x"]) != bf16.cache_path("d", ["x"])


@pytest.mark.parametrize("kind, pooler", [("hf", "cls"), ("sentence-transformers", None)])
def test_16_mixed_on_cpu_really_encodes_in_float16_so_sts_and_transfer_accept_it(tmp_path, kind,
                                                                                pooler):
    """Unlike the trainer (accelerate drops fp16 on CPU, so ``simcse`` refuses ``16-mixed`` there),
    ``torch.autocast("cpu", float16)`` runs the encoder's matrix products in float16: measured,
    not assumed, so ``sts`` / ``transfer`` keep ``--precision 16-mixed`` on CPU."""
    pytest.importorskip("sentence_transformers")
    import torch

    from tests.adapters._tiny_models import CORPUS, build_tiny_model

    path = build_tiny_model(tmp_path / "tiny", "bert")
    encoders = {precision: build_encoder(str(path), pooler, kind=kind, device="cpu",
                                         use_cache=False, show_progress=False, precision=precision)
                for precision in ("32", "16-mixed")}
    linear_dtypes: set[torch.dtype] = set()
    model = encoders["16-mixed"].model
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda m, i, out: linear_dtypes.add(out.dtype))
    half = encoders["16-mixed"].encode(CORPUS)
    full = encoders["32"].encode(CORPUS)
    assert linear_dtypes == {torch.float16}
    assert half.dtype == np.float32 and not np.array_equal(half, full)  # not silently float32
    np.testing.assert_allclose(half, full, atol=1e-2)
