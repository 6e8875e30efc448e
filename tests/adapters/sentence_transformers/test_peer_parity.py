"""Where sentence-transformers defines a behaviour, the adapter's losses have it: arguments,
symmetric loss with hard negatives, argument validation, the finiteness check."""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("sentence_transformers")

from sentence_transformers.sentence_transformer.losses import (  # noqa: E402
    MultipleNegativesRankingLoss,
)
from sentence_transformers.util import cos_sim, dot_score  # noqa: E402

from adaptcl.adapters import sentence_transformers as st_losses  # noqa: E402


def _columns(n=6, d=16, columns=3, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, d, generator=g, dtype=dtype, requires_grad=True) for _ in range(columns)]


def _symmetric_peer(scale):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from sentence_transformers.sentence_transformer.losses import (
            MultipleNegativesSymmetricRankingLoss,
        )

        return MultipleNegativesSymmetricRankingLoss(model=None, scale=scale)


def _value_and_grads(loss, columns):
    value = loss.compute_loss_from_embeddings(columns, None)
    return value, torch.autograd.grad(value, columns)


@pytest.mark.parametrize("num_columns", [2, 3, 4], ids=["pairs", "one-hard-negative", "two-hard-negatives"])
def test_symmetric_infonce_equals_the_peers_symmetric_loss(num_columns):
    columns = _columns(columns=num_columns)
    ours = _value_and_grads(st_losses.InfoNCELoss(None, scale=20.0, symmetric=True), columns)
    theirs = _value_and_grads(_symmetric_peer(20.0), columns)
    torch.testing.assert_close(ours[0], theirs[0])
    for a, b in zip(ours[1], theirs[1], strict=True):
        torch.testing.assert_close(a, b)


def test_symmetric_infonce_equals_the_peers_directions_form():
    """sentence-transformers 5+ spells the symmetric loss as MNRL with two directions."""
    columns = _columns(columns=3)
    peer = MultipleNegativesRankingLoss(None, scale=10.0, directions=("query_to_doc", "doc_to_query"),
                                        partition_mode="per_direction")
    ours = st_losses.InfoNCELoss(None, temperature=0.1, symmetric=True)
    torch.testing.assert_close(ours.compute_loss_from_embeddings(columns, None),
                               peer.compute_loss_from_embeddings(columns, None))


def test_symmetric_macl_without_adaptation_equals_the_peers_symmetric_loss():
    columns = _columns(columns=3)
    macl = st_losses.MACLLoss(None, temperature=0.05, alpha=0.0, symmetric=True)  # alpha = 0: fixed temperature
    torch.testing.assert_close(macl.compute_loss_from_embeddings(columns, None),
                               _symmetric_peer(20.0).compute_loss_from_embeddings(columns, None))


def test_scale_is_one_over_temperature_like_the_peer():
    columns = _columns(columns=3)
    loss = st_losses.InfoNCELoss(None, scale=20.0, similarity_fct=cos_sim)
    assert loss.temperature == pytest.approx(0.05) and loss.scale == pytest.approx(20.0)
    torch.testing.assert_close(loss.compute_loss_from_embeddings(columns, None),
                               MultipleNegativesRankingLoss(None, scale=20.0).compute_loss_from_embeddings(columns, None))
    loss.scale = 10.0  # settable, as on the peer
    assert loss.temperature == pytest.approx(0.1) and loss.core.temperature == pytest.approx(0.1)
    assert st_losses.MACLLoss(None, scale=10.0).get_config_dict()["temperature"] == pytest.approx(0.1)
    assert st_losses.ASCLLoss(None, scale=40.0).temperature == pytest.approx(0.025)
    assert st_losses.InfoNCELoss(None, temperature=0.05, scale=20.0).temperature == pytest.approx(0.05)  # consistent


def test_conflicting_or_bad_scale_is_rejected():
    with pytest.raises(ValueError, match="temperature or scale, not both"):
        st_losses.InfoNCELoss(None, temperature=0.1, scale=20.0)
    for bad in (0.0, -5.0, float("inf")):
        with pytest.raises(ValueError, match="scale must be a positive"):
            st_losses.MACLLoss(None, scale=bad)


def test_similarity_fct_other_than_cosine_is_rejected_by_name():
    with pytest.raises(ValueError, match="similarity_fct=dot_score"):
        st_losses.InfoNCELoss(None, similarity_fct=dot_score)


@pytest.mark.parametrize("cls", [st_losses.InfoNCELoss, st_losses.MACLLoss, st_losses.ASCLLoss,
                                 st_losses.AMCLLoss])
def test_a_number_in_the_model_slot_is_rejected(cls):
    with pytest.raises(TypeError, match=r"model must be the SentenceTransformer being trained .*got float 0\.05"):
        cls(0.05)


@pytest.mark.parametrize("cls", [st_losses.InfoNCELoss, st_losses.MACLLoss, st_losses.ASCLLoss])
def test_gather_across_devices_and_symmetric_must_be_bools(cls):
    with pytest.raises(TypeError, match="gather_across_devices must be a bool"):
        cls(None, gather_across_devices="yes")
    if cls is not st_losses.ASCLLoss:
        with pytest.raises(TypeError, match="symmetric must be a bool"):
            cls(None, symmetric=1)


def test_amcl_without_a_model_says_it_needs_the_embedding_dimension():
    with pytest.raises(ValueError, match="embedding dimension"):
        st_losses.AMCLLoss(None)


@pytest.mark.parametrize("cls", [st_losses.InfoNCELoss, st_losses.MACLLoss, st_losses.ASCLLoss])
def test_check_finite_rejects_nan_by_default_and_can_be_turned_off(cls):
    columns = [c.detach().clone() for c in _columns(columns=2)]
    columns[0][0, 0] = float("nan")
    with pytest.raises(ValueError, match="(?i)finite|nan"):
        cls(None).compute_loss_from_embeddings(columns, None)
    unchecked = cls(None, check_finite=False)
    assert unchecked.check_finite is False and unchecked.get_config_dict()["check_finite"] is False
    value = unchecked.compute_loss_from_embeddings(columns, None)  # no host sync, no exception
    assert torch.isnan(value)
    unchecked.check_finite = True
    with pytest.raises(ValueError, match="(?i)finite|nan"):
        unchecked.compute_loss_from_embeddings(columns, None)


class _Encoder(torch.nn.Module):
    """Stands in for a model where only the embedding size matters (AMCL sizes its heads)."""

    def get_embedding_dimension(self) -> int:
        return 16


SINGLE_PAIR_LOSSES = {
    "infonce": lambda: st_losses.InfoNCELoss(None),
    "infonce_symmetric": lambda: st_losses.InfoNCELoss(None, symmetric=True),
    "macl_reweighted": lambda: st_losses.MACLLoss(None, reweight=True),
    "ascl": lambda: st_losses.ASCLLoss(None),
    "amcl": lambda: st_losses.AMCLLoss(_Encoder(), num_heads=2, projection_dim=8),
}


@pytest.mark.parametrize("name", SINGLE_PAIR_LOSSES)
def test_single_pair_batch_gives_zero_loss_and_gradient_like_mnrl(name):
    columns = _columns(n=1, columns=2, dtype=torch.float32)
    peer = MultipleNegativesRankingLoss(None).compute_loss_from_embeddings(columns, None)
    value, grads = _value_and_grads(SINGLE_PAIR_LOSSES[name](), columns)
    assert peer.item() == 0.0
    assert value.item() == 0.0
    for grad in grads:
        assert torch.equal(grad, torch.zeros_like(grad))


def test_trainer_with_default_arguments_trains_through_a_last_batch_of_one_pair(tmp_path):
    """9 pairs at batch 8: the default DataLoader keeps the last batch, which holds one pair."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer.training_args import (
        SentenceTransformerTrainingArguments,
    )

    from adaptcl.adapters.sentence_transformers import build_simcse_model
    from tests.adapters._tiny_models import CORPUS, build_tiny_model

    model = build_simcse_model(str(build_tiny_model(tmp_path / "tiny", "bert")), "avg", max_seq_length=16)
    sentences = CORPUS + ["one more sentence ."]
    seen_batches = []
    loss = st_losses.MACLLoss(model)
    loss.register_forward_hook(lambda module, args, out: seen_batches.append(args[0][0]["input_ids"].shape[0]))
    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8,
                                                num_train_epochs=1, report_to="none", use_cpu=True)
    trainer = SentenceTransformerTrainer(model=model, args=args, loss=loss,
                                         train_dataset=Dataset.from_dict({"anchor": sentences,
                                                                          "positive": sentences}))
    trainer.train()
    assert trainer.state.global_step == 2
    assert sorted(seen_batches) == [1, 8]
    assert loss.last_stats["loss"].item() == 0.0  # the last batch was the single pair


def test_amcl_single_pair_with_a_hard_negative_trains_through_its_batchnorm_heads():
    columns = _columns(n=1, columns=3, dtype=torch.float32)
    loss = st_losses.AMCLLoss(_Encoder(), num_heads=2, projection_dim=8)
    value = loss.compute_loss_from_embeddings(columns, None)
    value.backward()
    assert torch.isfinite(value) and value.item() != 0.0  # the hard negative is a real negative
    assert all(torch.isfinite(c.grad).all() for c in columns)


def test_the_peers_directions_and_partition_mode_select_the_symmetric_loss():
    columns = _columns(columns=3)
    both = ("query_to_doc", "doc_to_query")
    ours = st_losses.InfoNCELoss(None, scale=20.0, directions=both, partition_mode="per_direction")
    peer = MultipleNegativesRankingLoss(None, scale=20.0, directions=both, partition_mode="per_direction")
    assert ours.symmetric
    torch.testing.assert_close(ours.compute_loss_from_embeddings(columns, None),
                               peer.compute_loss_from_embeddings(columns, None))
    assert not st_losses.InfoNCELoss(None, directions=("query_to_doc",)).symmetric
    assert not st_losses.InfoNCELoss(None, directions=both, partition_mode="joint").symmetric


def _adapter_losses():
    """Every public loss class of the adapter."""
    import inspect

    classes = [getattr(st_losses, name) for name in st_losses.__all__]
    return [cls for cls in classes
            if inspect.isclass(cls) and issubclass(cls, st_losses.AdaptiveContrastiveLoss)
            and cls is not st_losses.AdaptiveContrastiveLoss]


def test_positional_second_argument_follows_multiple_negatives_ranking_loss():
    """``MultipleNegativesRankingLoss(model, 20.0)`` is scale 20: so is ``InfoNCELoss(model,
    20.0)`` (and MACL's / ASCL's tau0), not temperature 20. The positional parameters of every
    loss are a prefix of the peer's; the rest is keyword-only."""
    import inspect

    columns = _columns(columns=3)
    peer = MultipleNegativesRankingLoss(None, 20.0)
    ours = st_losses.InfoNCELoss(None, 20.0)
    assert ours.temperature == pytest.approx(0.05) and ours.scale == pytest.approx(20.0)
    torch.testing.assert_close(ours.compute_loss_from_embeddings(columns, None),
                               peer.compute_loss_from_embeddings(columns, None))
    assert st_losses.InfoNCELoss(None, 20.0, cos_sim).temperature == pytest.approx(0.05)  # peer's 3rd
    for cls in (st_losses.MACLLoss, st_losses.ASCLLoss, st_losses.LearnableTemperatureLoss):
        assert cls(None, 20.0).temperature == pytest.approx(0.05)
        assert cls(None, 20.0).get_config_dict() == cls(None, scale=20.0).get_config_dict()

    peer_order = list(inspect.signature(MultipleNegativesRankingLoss).parameters)
    classes = _adapter_losses()
    assert {c.__name__ for c in classes} == {"InfoNCELoss", "MACLLoss", "ASCLLoss", "AMCLLoss",
                                             "DySTreSSLoss", "TemperatureScheduleLoss",
                                             "LearnableTemperatureLoss"}
    for cls in classes:
        params = inspect.signature(cls).parameters.values()
        positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
        assert positional == peer_order[:len(positional)], cls.__name__
        assert "temperature" not in positional


@pytest.mark.parametrize("cls, args, keyword", [
    (st_losses.InfoNCELoss, (20.0, cos_sim, True), "temperature"),
    (st_losses.MACLLoss, (0.05, cos_sim, 2.0), "alpha"),
    (st_losses.ASCLLoss, (20.0, None, 0.025), "sharpen_temperature"),
    (st_losses.AMCLLoss, (20.0,), "num_heads"),
    (st_losses.DySTreSSLoss, (20.0,), "min_temperature"),
    (st_losses.TemperatureScheduleLoss, (20.0,), "min_temperature"),
    (st_losses.LearnableTemperatureLoss, (20.0, cos_sim, 0.05), "temperature"),
])
def test_positional_arguments_beyond_the_peers_raise_naming_the_keywords(cls, args, keyword):
    with pytest.raises(TypeError, match=rf"{cls.__name__} takes .*by keyword.*\b{keyword}\b"):
        cls(None, *args)


def test_a_number_in_the_similarity_slot_says_the_order_is_the_peers():
    """Old-style ``MACLLoss(model, 0.05, 2.0)`` (temperature, alpha) is an error, not scale 0.05."""
    with pytest.raises(TypeError, match=r"similarity_fct must be a similarity function .*\(model, scale, "
                                        r"similarity_fct\)"):
        st_losses.MACLLoss(None, 0.05, 2.0)


def test_a_scale_below_one_warns_that_it_is_a_large_temperature():
    with pytest.warns(UserWarning, match=r"scale=0.05 is temperature 20 .*pass temperature=0.05"):
        loss = st_losses.MACLLoss(None, 0.05)
    assert loss.temperature == pytest.approx(20.0)  # the peer's meaning, kept
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        st_losses.InfoNCELoss(None, 1.0)
        st_losses.InfoNCELoss(None, temperature=0.05)


# --------------------------------------------------------------------------------------------
# sentence-transformers 6.2's hardness weighting and directions / partition_mode
# --------------------------------------------------------------------------------------------

HARDNESS_MODES = ("in_batch_negatives", "hard_negatives", "all_negatives")
BOTH = ("query_to_doc", "doc_to_query")


def _hardness_losses(mode, strength, **peer_kwargs):
    """Our losses at the settings where each is the peer's loss: InfoNCE, MACL with alpha = 0
    and no reweighting, ASCL without neighbours, DySTreSS with tau_min = tau_max."""
    kw = {"hardness_mode": mode, "hardness_strength": strength, **peer_kwargs}
    losses = {
        "infonce": st_losses.InfoNCELoss(None, 20.0, **kw),
        "macl": st_losses.MACLLoss(None, 20.0, alpha=0.0, reweight=False, **kw),
        "dystress": st_losses.DySTreSSLoss(None, min_temperature=0.05, max_temperature=0.05, **kw),
    }
    if not peer_kwargs:  # ASCL has one direction only
        losses["ascl"] = st_losses.ASCLLoss(None, 20.0, num_neighbors=0, **kw)
    return losses


@pytest.mark.parametrize("num_columns", [2, 3, 4], ids=["pairs", "one-hard-negative", "two-hard-negatives"])
@pytest.mark.parametrize("mode", HARDNESS_MODES)
def test_hardness_equals_the_peers_in_every_mode(mode, num_columns):
    """``InfoNCELoss(model, hardness_mode=..., hardness_strength=0.5)`` equals
    ``MultipleNegativesRankingLoss`` with the same arguments, value and gradients, with and
    without hard-negative columns; so do MACL (alpha 0), ASCL (K = 0) and DySTreSS (one
    temperature) at the settings where they are InfoNCE."""
    columns = _columns(columns=num_columns)
    peer = MultipleNegativesRankingLoss(None, 20.0, hardness_mode=mode, hardness_strength=0.5)
    theirs = _value_and_grads(peer, columns)
    for name, ours in _hardness_losses(mode, 0.5).items():
        value, grads = _value_and_grads(ours, columns)
        torch.testing.assert_close(value, theirs[0], msg=name)
        for a, b in zip(grads, theirs[1], strict=True):
            torch.testing.assert_close(a, b, msg=name)


@pytest.mark.parametrize("mode", HARDNESS_MODES)
def test_hardness_with_the_peers_symmetric_directions(mode):
    """``directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction"``: the
    peer adds the term in the query -> doc direction only, and so do ours."""
    columns = _columns(columns=4, seed=3)
    peer = MultipleNegativesRankingLoss(None, 20.0, directions=BOTH, partition_mode="per_direction",
                                        hardness_mode=mode, hardness_strength=2.0)
    theirs = _value_and_grads(peer, columns)
    for name, ours in _hardness_losses(mode, 2.0, directions=BOTH,
                                       partition_mode="per_direction").items():
        assert ours.symmetric, name
        value, grads = _value_and_grads(ours, columns)
        torch.testing.assert_close(value, theirs[0], msg=name)
        for a, b in zip(grads, theirs[1], strict=True):
            torch.testing.assert_close(a, b, msg=name)
        assert ours.core.hardness_mode == mode  # restored after the reverse direction


@pytest.mark.parametrize("directions, partition_mode", [
    (("query_to_doc",), None), (("query_to_doc",), "joint"), (("query_to_doc",), "per_direction"),
    (BOTH, "per_direction"),
])
@pytest.mark.parametrize("num_columns", [2, 3])
def test_macl_without_adaptation_takes_the_peers_directions(directions, partition_mode, num_columns):
    """MACL at alpha = 0 without reweighting equals the peer for every ``directions`` /
    ``partition_mode`` the losses here offer."""
    columns = _columns(columns=num_columns, seed=4)
    kw = {"directions": directions} | ({} if partition_mode is None else {"partition_mode": partition_mode})
    theirs = _value_and_grads(MultipleNegativesRankingLoss(None, 20.0, **kw), columns)
    ours = st_losses.MACLLoss(None, 20.0, alpha=0.0, reweight=False, **kw)
    assert ours.symmetric == (directions == BOTH)
    value, grads = _value_and_grads(ours, columns)
    torch.testing.assert_close(value, theirs[0])
    for a, b in zip(grads, theirs[1], strict=True):
        torch.testing.assert_close(a, b)


def test_directions_the_peer_refuses_are_refused_by_name():
    """Every setting the peer accepts is accepted (``test_directions.py``); what it refuses is
    refused, naming the setting."""
    for cls in (st_losses.MACLLoss, st_losses.DySTreSSLoss):
        with pytest.raises(ValueError, match="per_direction"):
            cls(None, directions=("query_to_doc", "query_to_query"), partition_mode="per_direction")
        with pytest.raises(ValueError, match="at least one direction"):
            cls(None, directions=())


def test_hardness_is_refused_like_the_peer_refuses_it():
    with pytest.raises(ValueError, match="hardness_mode must be one of"):
        st_losses.InfoNCELoss(None, hardness_mode="hardest")
    with pytest.raises(ValueError, match="hardness_strength must be"):
        st_losses.MACLLoss(None, hardness_mode="all_negatives", hardness_strength=-1.0)
    with pytest.raises(ValueError):
        MultipleNegativesRankingLoss(None, hardness_mode="all_negatives", hardness_strength=-1.0)


def test_hardness_shows_in_the_model_card_config():
    loss = st_losses.InfoNCELoss(None, hardness_mode="hard_negatives", hardness_strength=5.0)
    assert loss.get_config_dict()["hardness_mode"] == "hard_negatives"
    assert loss.get_config_dict()["hardness_strength"] == 5.0
    assert "hardness_mode" not in st_losses.InfoNCELoss(None).get_config_dict()
