"""Sentence encoders: batching, the embedding cache (keyed on the identity, verified on load),
the embedding checks, SimCSE's poolers and autocast precision."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from adaptcl.evaluation.senteval import sts
from adaptcl.evaluation.senteval.encoders import (
    POOLERS,
    SentenceEncoder,
    build_encoder,
    checked_sentence_embeddings,
    folder_fingerprint,
    hash_sentences,
    model_identifier,
)
from adaptcl.plugins.validation import NonFiniteError
from tests.evaluation._bow import CountingEncoder, hashed_bow


def test_encoder_cache_hit_and_key(tmp_path):
    counting = CountingEncoder()
    enc = build_encoder(counting, cache_dir=tmp_path, batch_size=2, show_progress=False)
    sentences = ["a b c", "a much longer sentence here", "", "x"]
    first = enc.encode(sentences, dataset="toy")
    np.testing.assert_allclose(first, hashed_bow(sentences))  # input order restored after sort
    assert counting.calls == 2 and counting.sentences == 4
    again = build_encoder(counting, cache_dir=tmp_path, show_progress=False)
    np.testing.assert_array_equal(again.encode(sentences, dataset="toy"), first)
    assert counting.calls == 2  # served from disk, the encoder was not called
    again.encode(sentences[:3], dataset="toy")  # different sentences -> miss
    assert counting.calls == 3
    other = build_encoder(counting, model_id="other-model", cache_dir=tmp_path, show_progress=False)
    other.encode(sentences, dataset="toy")  # different model id -> miss
    assert counting.calls == 4
    assert len(list(tmp_path.rglob("*.npy"))) == 3
    assert hash_sentences(["ab", "c"]) != hash_sentences(["a", "bc"])


def test_model_identifier_tracks_folder_contents(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    before = model_identifier(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"123")
    assert model_identifier(tmp_path) != before
    assert model_identifier("some/hub-name") == "some/hub-name"


def test_hf_poolers_on_minilm(minilm_path, tmp_path, one_thread):
    sentences = ["a man is playing a guitar .", "a dog runs in the park .", "hello"]
    st_enc = build_encoder(minilm_path, cache_dir=tmp_path, show_progress=False)
    reference = st_enc.encode(sentences, dataset="pool")
    outputs = {}
    for pooler in POOLERS:
        enc = build_encoder(minilm_path, pooler=pooler, cache_dir=tmp_path, show_progress=False)
        outputs[pooler] = enc.encode(sentences, dataset="pool")
        assert outputs[pooler].shape == (3, 384), pooler
    # the model's own pooling is a normalised mask-aware mean: 'avg' must match it in direction
    np.testing.assert_allclose(sts.cosine_scores(outputs["avg"], reference), 1.0, atol=1e-4)
    assert not np.allclose(outputs["avg"], outputs["avg_top2"])
    assert not np.allclose(outputs["cls_before_pooler"], outputs["avg"])
    assert len({enc.cache_path("pool", sentences) for enc in
                [build_encoder(minilm_path, pooler=p, cache_dir=tmp_path, show_progress=False)
                 for p in ("avg", "avg_top2")]}) == 2


def test_checked_sentence_embeddings_accepts_finite_varied_and_rejects_bad_shapes():
    good = hashed_bow(["a b", "c d"])
    assert checked_sentence_embeddings(good, "m", "d") is good
    with pytest.raises(ValueError, match="encoder 'm' on 'd': no embeddings") as empty:
        checked_sentence_embeddings(np.zeros((2, 0), np.float32), "m", "d")
    assert not isinstance(empty.value, NonFiniteError)
    with pytest.raises(ValueError, match=r"embeddings of shape \(3,\); expected \(n, dim\)"):
        checked_sentence_embeddings(np.ones(3, np.float32), "m", "d")
    with pytest.raises(NonFiniteError, match="1 embeddings contain NaN or inf"):
        checked_sentence_embeddings(np.array([[1.0, np.inf], [0.0, 1.0]]), "m", "d")


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
    before = folder_fingerprint(model)
    weights.write_bytes(b"weights-two")  # same size, same mtime: only the content differs
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = folder_fingerprint(model)
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
    with caplog.at_level(logging.WARNING, logger="adaptcl.evaluation"):
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


def test_encoder_argument_errors(tmp_path):
    enc = build_encoder(lambda s: np.zeros((len(s) + 1, 3)), cache_dir=tmp_path,
                        show_progress=False)
    with pytest.raises(ValueError, match=r"returned shape \(3, 3\)"):
        enc.encode(["a", "b"], dataset="bad")
    with pytest.raises(ValueError, match="pooler='mean'"):
        build_encoder("whatever", pooler="mean")
    with pytest.raises(ValueError, match="precision must be one of 32, bf16-mixed, 16-mixed"):
        SentenceEncoder("m", cache_dir=tmp_path, precision="fp8")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="not a sentence-transformers folder"):
        build_encoder(str(tmp_path))
