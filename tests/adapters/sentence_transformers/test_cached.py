"""Gradient caching (``mini_batch_size=``) and tiling (``tile_size=``) in the sentence-transformers
losses: same loss and gradients as the plain path, dropout replayed exactly."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("sentence_transformers")

from sentence_transformers.base.losses.gradcache import _create_minibatch  # noqa: E402

from adaptcl.adapters import sentence_transformers as st_losses  # noqa: E402
from adaptcl.adapters.sentence_transformers import build_simcse_model  # noqa: E402
from tests.adapters._tiny_models import CORPUS, build_tiny_model  # noqa: E402

TOL = {"rtol": 1e-5, "atol": 1e-5}
ANCHORS = CORPUS + ["a dog sleeps .", "the man reads ."]  # 10 rows: mini-batch 3 does not divide
POSITIVES = list(reversed(ANCHORS))
NEGATIVES = ANCHORS[3:] + ANCHORS[:3]


pytestmark = pytest.mark.usefixtures("one_thread")  # small ops: no OpenMP stalls on a loaded box


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-bert-cached"), "bert")


def _model(path, dropout=0.0):
    torch.manual_seed(0)
    return build_simcse_model(str(path), "cls_before_pooler", max_seq_length=16, dropout=dropout)


def _features(model, columns):
    return [dict(model.tokenize(texts)) for texts in columns]


LOSSES = {
    "infonce": lambda m, **kw: st_losses.InfoNCELoss(m, temperature=0.05, **kw),
    "infonce_symmetric": lambda m, **kw: st_losses.InfoNCELoss(m, temperature=0.05, symmetric=True, **kw),
    "macl": lambda m, **kw: st_losses.MACLLoss(m, reweight=True, **kw),
    "ascl": lambda m, **kw: st_losses.ASCLLoss(m, num_neighbors=2, **kw),
    "amcl": lambda m, **kw: st_losses.AMCLLoss(m, num_heads=2, projection_dim=8, **kw),
}


def _run(loss, features):
    for p in loss.parameters():
        p.grad = None
    value = loss([dict(f) for f in features], None)
    value.backward()
    grads = {name: p.grad.clone() for name, p in loss.named_parameters() if p.grad is not None}
    return value.detach(), grads


def _assert_same(a, b, tol=TOL):
    torch.testing.assert_close(a[0], b[0], **tol)
    assert a[1].keys() == b[1].keys() and a[1]
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], **tol, msg=name)


def _plain(tiny_bert, name, dtype):
    """``(model, features, plain loss, its (value, gradients))`` in eval mode, seeded."""
    model = _model(tiny_bert).to(dtype)
    model.eval()
    columns = [ANCHORS, POSITIVES, NEGATIVES] if name != "infonce_symmetric" else [ANCHORS, POSITIVES]
    features = _features(model, columns)
    torch.manual_seed(1)
    plain = LOSSES[name](model).to(dtype)
    return model, features, plain, _run(plain, features)


CASES = [(name, torch.float32) for name in LOSSES if name != "amcl"] + [
    (name, torch.float64) for name in LOSSES]


@pytest.mark.parametrize("name, dtype", CASES, ids=[f"{n}-{str(d)[6:]}" for n, d in CASES])
def test_cached_equals_uncached(tiny_bert, name, dtype):
    """Encoder and loss-parameter gradients match (eval mode: no dropout to replay).

    AMCL only in float64: its learned pair temperatures amplify the float32 rounding that
    differs between one padded forward and shorter-padded mini-batches to ~2e-4 relative in
    the encoder gradients (in float64 both paths agree to 1e-12).
    """
    tol = TOL if dtype == torch.float32 else {"rtol": 1e-9, "atol": 1e-9}
    model, features, plain, reference = _plain(tiny_bert, name, dtype)
    torch.manual_seed(1)
    cached = LOSSES[name](model, mini_batch_size=3).to(dtype)
    cached.load_state_dict(plain.state_dict())
    _assert_same(_run(cached, features), reference, tol)
    # tiling on top of caching: still the same numbers
    torch.manual_seed(1)
    both = LOSSES[name](model, mini_batch_size=4, tile_size=5).to(dtype)
    both.load_state_dict(plain.state_dict())
    _assert_same(_run(both, features), reference, tol)
    assert both.get_config_dict()["tile_size"] == 5 and both.get_config_dict()["mini_batch_size"] == 4
    assert both.core.tile_size == 5


def test_dropout_is_replayed_in_the_second_pass(tiny_bert):
    """With dropout on, the cached gradients equal those of embedding the same mini-batches with
    gradient in the same order (same RNG stream): the re-embedding reused the first pass's masks."""
    model = _model(tiny_bert, dropout=0.3)
    model.train()
    features = _features(model, [ANCHORS, POSITIVES])
    loss = st_losses.MACLLoss(model, reweight=True, mini_batch_size=3)

    torch.manual_seed(7)
    cached = _run(loss, features)

    for p in loss.parameters():
        p.grad = None
    torch.manual_seed(7)
    embeddings = []
    for f in features:
        batch = f["input_ids"].shape[0]
        embeddings.append(torch.cat([model(_create_minibatch(f, b, min(b + 3, batch)))["sentence_embedding"]
                                     for b in range(0, batch, 3)]))
    value = loss.compute_loss_from_embeddings(embeddings, None)
    value.backward()
    manual = (value.detach(), {n: p.grad.clone() for n, p in loss.named_parameters() if p.grad is not None})
    _assert_same(cached, manual)
    # and the two columns really got different dropout (the SimCSE augmentation survives)
    assert not torch.allclose(embeddings[0], embeddings[1][torch.arange(len(ANCHORS) - 1, -1, -1)])


def test_cached_gradients_follow_the_outer_scaling_loss_parameters_included(tiny_bert):
    """``(0.25 * loss).backward()`` (gradient accumulation, AMP's scaler) scales every gradient:
    the encoder's through the replay and the loss's own parameters (AMCL's heads and temperature
    network), which the cached loss computes in forward and adds in backward."""
    model = _model(tiny_bert).to(torch.float64)
    model.eval()
    features = _features(model, [ANCHORS, POSITIVES, NEGATIVES])
    torch.manual_seed(1)
    plain = LOSSES["amcl"](model).to(torch.float64)
    _, reference = _run(plain, features)
    cached = LOSSES["amcl"](model, mini_batch_size=3).to(torch.float64)
    cached.load_state_dict(plain.state_dict())
    for p in cached.parameters():
        p.grad = None
    (0.25 * cached([dict(f) for f in features], None)).backward()
    assert any(name.startswith("heads.") for name in reference)
    for name, p in cached.named_parameters():
        if name in reference:
            torch.testing.assert_close(p.grad, 0.25 * reference[name], rtol=1e-9, atol=1e-12, msg=name)


def test_token_budget_mini_batches_equal_the_plain_loss(tiny_bert):
    """``mini_batch_num_tokens`` (sentence-transformers' token-budget packing) turns caching on
    and gives the plain loss and gradients."""
    model = _model(tiny_bert).to(torch.float64)
    model.eval()
    features = _features(model, [ANCHORS, POSITIVES, NEGATIVES])
    cached = st_losses.MACLLoss(model, mini_batch_num_tokens=20)
    assert cached.uses_gradient_cache and cached.get_config_dict()["mini_batch_num_tokens"] == 20
    _assert_same(_run(cached, features), _run(st_losses.MACLLoss(model), features),
                 {"rtol": 1e-9, "atol": 1e-12})


def test_no_grad_evaluation_gives_the_plain_value(tiny_bert):
    model = _model(tiny_bert)
    model.eval()
    features = _features(model, [ANCHORS, POSITIVES])
    loss = st_losses.InfoNCELoss(model, mini_batch_size=2)
    with torch.no_grad():
        value = loss([dict(f) for f in features], None)
    torch.testing.assert_close(value, st_losses.InfoNCELoss(model)([dict(f) for f in features], None).detach())


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError)])
@pytest.mark.parametrize("argument", ["mini_batch_size", "mini_batch_num_tokens"])
def test_mini_batch_size_validation(argument, bad, error):
    with pytest.raises(error, match=argument):
        st_losses.InfoNCELoss(None, **{argument: bad})


def test_tile_size_is_validated_by_the_core():
    with pytest.raises(ValueError, match="tile_size"):
        st_losses.MACLLoss(None, tile_size=0)
    with pytest.raises(ValueError, match="^tile_size must be an int >= 1, 'auto' or None"):
        st_losses.MACLLoss(None, tile_size="big")


@pytest.mark.parametrize("name", list(LOSSES))
def test_a_budget_switches_the_core_and_tile_size_reaches_the_model_card(tiny_bert, name,
                                                                         monkeypatch):
    from adaptcl.plugins import LogitsBudgetWarning, tiling
    from adaptcl.plugins.tiles import _budget as budget

    monkeypatch.setattr(budget, "_SAID", set())  # said once a process: not yet here

    # AMCL in float64, as above: its pair temperatures amplify float32 rounding
    dtype = torch.float64 if name == "amcl" else torch.float32
    model, features, plain, reference = _plain(tiny_bert, name, dtype)
    torch.manual_seed(1)
    capped = LOSSES[name](model).to(dtype)
    capped.load_state_dict(plain.state_dict())
    with pytest.warns(LogitsBudgetWarning), tiling(max_logits_bytes=1):
        _assert_same(_run(capped, features), reference)
    assert capped.core.tile_size == "auto" and "auto_tile_size" in capped.last_stats
    assert "tile_size" not in capped.get_config_dict()
    assert LOSSES[name](model, tile_size=16).get_config_dict()["tile_size"] == 16
