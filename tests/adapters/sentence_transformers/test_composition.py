"""Gradient caching composes with sentence-transformers' loss modifiers as the peer's cached loss
does: MatryoshkaLoss decorates ``calculate_loss``, AdaptiveLayerLoss gets the uncached result."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("sentence_transformers")

from sentence_transformers.base.losses import uses_gradient_cache  # noqa: E402
from sentence_transformers.sentence_transformer.losses import (  # noqa: E402
    AdaptiveLayerLoss,
    CachedMultipleNegativesRankingLoss,
    MatryoshkaLoss,
)

from adaptcl.adapters import sentence_transformers as st_losses  # noqa: E402
from adaptcl.adapters.sentence_transformers import build_simcse_model  # noqa: E402
from tests.adapters._tiny_models import CORPUS, build_tiny_model  # noqa: E402

# float64: mini-batches are padded to their own length, so float32 rounding differs slightly
TOL = {"rtol": 1e-9, "atol": 1e-12}
DIMS = [32, 16, 8]
ANCHORS = CORPUS
POSITIVES = CORPUS[::-1]
NEGATIVES = CORPUS[3:] + CORPUS[:3]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny-bert-composition"), "bert")
    model = build_simcse_model(str(path), "cls_before_pooler", max_seq_length=16, dropout=0.0)
    model.eval()  # deterministic encoder: the two compositions must see the same embeddings
    return model.to(torch.float64)


def _value_and_grads(loss, model, columns):
    model.zero_grad()
    for p in loss.parameters():
        p.grad = None
    features = [dict(model.tokenize(texts)) for texts in columns]
    value = loss(features, None)
    value.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads, "the encoder received gradients"
    return value.detach(), grads


def _assert_same(a, b):
    torch.testing.assert_close(a[0], b[0], **TOL)
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], **TOL, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("columns", [[ANCHORS, POSITIVES], [ANCHORS, POSITIVES, NEGATIVES]],
                         ids=["pairs", "hard-negatives"])
def test_matryoshka_around_cached_macl_equals_the_uncached_composition(model, columns):
    cached = st_losses.MACLLoss(model, reweight=True, mini_batch_size=2)
    assert uses_gradient_cache(cached)
    wrapped_cached = MatryoshkaLoss(model, cached, DIMS, matryoshka_weights=[1.0, 0.5, 0.25])
    wrapped_plain = MatryoshkaLoss(model, st_losses.MACLLoss(model, reweight=True), DIMS,
                                   matryoshka_weights=[1.0, 0.5, 0.25])
    _assert_same(_value_and_grads(wrapped_cached, model, columns),
                 _value_and_grads(wrapped_plain, model, columns))


def test_matryoshka_around_cached_infonce_equals_it_around_the_peers_cached_loss(model):
    ours = MatryoshkaLoss(model, st_losses.InfoNCELoss(model, scale=20.0, mini_batch_size=3), DIMS)
    peer = MatryoshkaLoss(model, CachedMultipleNegativesRankingLoss(model, scale=20.0, mini_batch_size=3), DIMS)
    columns = [ANCHORS, POSITIVES, NEGATIVES]
    _assert_same(_value_and_grads(ours, model, columns), _value_and_grads(peer, model, columns))


def test_adaptive_layer_loss_around_cached_macl_equals_the_uncached_composition(model, caplog):
    # sentence-transformers warns for every gradient-caching loss at construction; ours then
    # embeds in one pass while AdaptiveLayerLoss patches the forward (the peer's raises KeyError)
    with pytest.warns(UserWarning, match="not compatible"):
        wrapped_cached = AdaptiveLayerLoss(model, st_losses.MACLLoss(model, mini_batch_size=2),
                                           n_layers_per_step=-1)
    wrapped_plain = AdaptiveLayerLoss(model, st_losses.MACLLoss(model), n_layers_per_step=-1)
    columns = [ANCHORS, POSITIVES]
    with caplog.at_level(logging.WARNING, logger=st_losses.__name__):
        cached = _value_and_grads(wrapped_cached, model, columns)
    assert "without gradient caching" in caplog.text
    _assert_same(cached, _value_and_grads(wrapped_plain, model, columns))


def test_cached_loss_outside_a_modifier_still_replays_in_backward(model):
    """After AdaptiveLayerLoss restored the forward, the same loss caches again: the value is
    computed without a graph (a detached leaf) and the encoder gets its gradient in backward."""
    loss = st_losses.MACLLoss(model, mini_batch_size=2)
    with pytest.warns(UserWarning, match="not compatible"):
        AdaptiveLayerLoss(model, loss, n_layers_per_step=-1)(
            [dict(model.tokenize(t)) for t in (ANCHORS, POSITIVES)], None)
    value = loss([dict(model.tokenize(t)) for t in (ANCHORS, POSITIVES)], None)
    assert value.is_leaf and value.requires_grad
    _assert_same(_value_and_grads(loss, model, [ANCHORS, POSITIVES]),
                 _value_and_grads(st_losses.MACLLoss(model), model, [ANCHORS, POSITIVES]))


def test_trainer_runs_matryoshka_around_cached_macl(tmp_path):
    """The combination that crashed in backward before ("Mismatch in shape: grad_output"),
    through SentenceTransformerTrainer, one-pair last batch included (9 pairs at batch 4)."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer.training_args import (
        SentenceTransformerTrainingArguments,
    )

    path = build_tiny_model(tmp_path / "tiny", "bert")
    model = build_simcse_model(str(path), "avg", max_seq_length=16)
    loss = MatryoshkaLoss(model, st_losses.MACLLoss(model, mini_batch_size=2), DIMS)
    before = [p.detach().clone() for p in model.parameters()]
    sentences = CORPUS + ["one more sentence ."]
    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
                                                num_train_epochs=1, report_to="none", use_cpu=True,
                                                learning_rate=1e-3)
    trainer = SentenceTransformerTrainer(model=model, args=args, loss=loss,
                                         train_dataset=Dataset.from_dict({"anchor": sentences,
                                                                          "positive": POSITIVES + ["one more ."]}))
    trainer.train()
    assert trainer.state.global_step == 3
    train_loss = trainer.state.log_history[-1]["train_loss"]
    assert train_loss == train_loss and abs(train_loss) < float("inf")
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
