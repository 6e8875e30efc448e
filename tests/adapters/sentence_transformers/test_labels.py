"""``use_labels=True``: the labels sentence-transformers passes to ``forward`` (a dataset's
``label`` column) are the pairs' classes, every in-batch candidate of the anchor's class a
positive (SupCon's L_out, checked against its formula in tests/plugins/test_targets.py); the
hard-negative columns stay negatives; off by default, as ``MultipleNegativesRankingLoss``
ignores labels. Also the hard-negative owners the hardness term reads, through the trainer's
own call ``loss(sentence_features, labels)``."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("sentence_transformers")

from adaptcl import plugins  # noqa: E402
from adaptcl.adapters import sentence_transformers as st  # noqa: E402
from adaptcl.adapters.sentence_transformers import build_simcse_model  # noqa: E402

LABELS = torch.tensor([0, 1, 0, 2, 1, 0])


def _columns(n=6, d=8, columns=3, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, d, generator=g, dtype=dtype, requires_grad=True) for _ in range(columns)]


def _supcon(anchors, docs, doc_labels, scale):
    """L_out of anchors against the documents (positives then hard negatives, labelled -1)."""
    cos = torch.nn.functional.normalize(anchors, dim=1) @ torch.nn.functional.normalize(docs, dim=1).T
    logits = cos * scale
    targets = (LABELS[:, None] == doc_labels[None, :]).to(logits.dtype)
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    return (-(log_prob * targets).sum(1) / targets.sum(1)).mean()


@pytest.mark.parametrize("num_columns", [2, 3, 4])
def test_labels_make_same_class_pairs_positives_and_hard_negatives_stay_negatives(num_columns):
    columns = _columns(columns=num_columns)
    ours = st.InfoNCELoss(None, 20.0, use_labels=True)
    value = ours.compute_loss_from_embeddings(columns, LABELS)
    docs = torch.cat(columns[1:])
    doc_labels = torch.cat([LABELS, torch.full(((num_columns - 2) * 6,), -1)])
    torch.testing.assert_close(value, _supcon(columns[0], docs, doc_labels, 20.0))
    grads = torch.autograd.grad(value, columns)
    expected = torch.autograd.grad(_supcon(columns[0], docs, doc_labels, 20.0), columns)
    for a, b in zip(grads, expected, strict=True):
        torch.testing.assert_close(a, b)


def test_symmetric_with_labels_averages_both_directions():
    columns = _columns(columns=2, seed=1)
    ours = st.InfoNCELoss(None, 10.0, use_labels=True, symmetric=True)
    expected = (_supcon(columns[0], columns[1], LABELS, 10.0)
                + _supcon(columns[1], columns[0], LABELS, 10.0)) / 2
    torch.testing.assert_close(ours.compute_loss_from_embeddings(columns, LABELS), expected)


def test_macl_and_dystress_take_labels_with_their_temperature_rules():
    columns = _columns(columns=3, seed=2)
    a, p, n = columns
    macl = st.MACLLoss(None, use_labels=True)  # the SimCSE setting, no reweighting
    core = plugins.MACLLoss(0.05, 2.0, 0.8, reweight=False, form="cross_view")
    torch.testing.assert_close(macl.compute_loss_from_embeddings(columns, LABELS),
                               core(a, p, n, labels=LABELS))
    dystress = st.DySTreSSLoss(None, use_labels=True)
    core = plugins.DySTreSSLoss(0.04, 0.05, shape="piecewise", form="cross_view")
    torch.testing.assert_close(dystress.compute_loss_from_embeddings(columns, LABELS),
                               core(a, p, n, labels=LABELS))


def test_labels_are_ignored_without_use_labels_like_the_peer():
    """An NLI dataset's label column does not change the loss of a loss built as before."""
    columns = _columns(columns=3, seed=3)
    ours = st.InfoNCELoss(None, 20.0)
    torch.testing.assert_close(ours.compute_loss_from_embeddings(columns, LABELS),
                               ours.compute_loss_from_embeddings(columns, None), rtol=0, atol=0)


def test_what_use_labels_needs():
    columns = _columns(columns=2)
    with pytest.raises(ValueError, match="needs the class of each pair"):
        st.InfoNCELoss(None, use_labels=True).compute_loss_from_embeddings(columns, None)
    with pytest.raises(TypeError, match="labels must be an integer tensor"):  # a score column
        st.InfoNCELoss(None, use_labels=True).compute_loss_from_embeddings(
            columns, torch.rand(6))
    with pytest.raises(ValueError, match="reweight=False"):
        st.MACLLoss(None, reweight=True, use_labels=True).compute_loss_from_embeddings(
            columns, LABELS)
    with pytest.raises(TypeError, match="use_labels"):
        st.ASCLLoss(None, use_labels=True)  # ASCL's targets are its own soft labels
    with pytest.raises(TypeError, match="use_labels must be a bool"):
        st.InfoNCELoss(None, use_labels=1)


def test_use_labels_shows_in_the_config_and_cites_supcon():
    loss = st.InfoNCELoss(None, use_labels=True)
    assert loss.get_config_dict()["use_labels"] is True
    assert "khosla2020supcon" in loss.citation
    assert "khosla2020supcon" not in st.InfoNCELoss(None).citation
    assert "manna2025dystress" in st.DySTreSSLoss(None).citation


def test_the_trainers_call_passes_labels_and_hard_negative_owners(tiny_bert):
    """``loss(sentence_features, labels)``, as ``SentenceTransformerTrainer`` calls it, with a
    hard-negative column: the labels reach the core, and each hard negative is its anchor's own
    for the hardness term (``"hard_negatives"`` then differs from no term at all)."""
    from sentence_transformers.base.losses.merged_forward import embed_columns

    model = build_simcse_model(str(tiny_bert), "avg", max_seq_length=16)
    model.eval()  # no dropout: two passes embed alike
    texts = [["a cat", "a dog", "the sun", "rain", "a kite", "snow"],
             ["cats", "dogs", "sunny", "wet", "kites", "cold"],
             ["tax", "law", "sums", "ink", "oil", "tin"]]
    features = [model.tokenize(column) for column in texts]
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    loss = st.InfoNCELoss(model, 20.0, use_labels=True, hardness_mode="hard_negatives",
                          hardness_strength=5.0)
    value = loss(features, labels)
    with torch.no_grad():
        a, p, n = embed_columns(model, features)
    core = plugins.InfoNCELoss(0.05, form="cross_view", hardness_mode="hard_negatives",
                               hardness_strength=5.0)
    expected = core(a, p, n, labels=labels, negative_owners=torch.arange(6))
    torch.testing.assert_close(value.detach(), expected, rtol=1e-5, atol=1e-6)
    without_owners = core(a, p, n, labels=labels)  # no owners: the term touches nothing
    assert not math.isclose(float(expected), float(without_owners), rel_tol=1e-4)
