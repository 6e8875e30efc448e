"""``directions`` / ``partition_mode`` as ``MultipleNegativesRankingLoss`` (6.2) takes them: every
setting the peer accepts is accepted with the peer's value and gradients (InfoNCE; MACL and
DySTreSS where they are InfoNCE, and MACL's temperature on every term of a joint row), every
setting it refuses is refused with the same kind of error."""

from __future__ import annotations

import itertools

import pytest
import torch

pytest.importorskip("sentence_transformers")

from sentence_transformers.sentence_transformer.losses import (  # noqa: E402
    MultipleNegativesRankingLoss,
)

from adaptcl.adapters import sentence_transformers as st_losses  # noqa: E402
from adaptcl.adapters.sentence_transformers.losses import (  # noqa: E402
    DIRECTIONS,
    PARTITION_MODES,
)
from adaptcl.plugins import tiling  # noqa: E402

EXTRA = ("query_to_query", "doc_to_query", "doc_to_doc")
#: every (directions, partition_mode) the peer accepts: query_to_doc with any of the other three
#: under one joint softmax; per direction only the terms that hold the positive
ACCEPTED = ([(("query_to_doc", *extra), "joint") for k in range(4)
             for extra in itertools.combinations(EXTRA, k)]
            + [(("query_to_doc",), "per_direction"), (("query_to_doc", "doc_to_query"), "per_direction")])
HARDNESS = (None, "in_batch_negatives", "hard_negatives", "all_negatives")


def _columns(n=5, d=8, columns=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, d, generator=g, dtype=torch.float64, requires_grad=True)
            for _ in range(columns)]


def _value_and_grads(loss, columns):
    value = loss.compute_loss_from_embeddings(columns, None)
    return value, torch.autograd.grad(value, columns)


def _assert_same(ours, theirs, msg):
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-10, atol=1e-12, msg=msg)
    for a, b in zip(ours[1], theirs[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-12, msg=msg)


def test_the_choices_are_the_peers():
    import inspect
    import typing

    hints = typing.get_type_hints(MultipleNegativesRankingLoss.__init__)
    assert set(DIRECTIONS) == set(typing.get_args(typing.get_args(hints["directions"])[0]))
    assert set(PARTITION_MODES) == set(typing.get_args(hints["partition_mode"]))
    assert inspect.signature(MultipleNegativesRankingLoss).parameters["partition_mode"].default \
        == PARTITION_MODES[0]


@pytest.mark.parametrize("hardness_mode", HARDNESS)
@pytest.mark.parametrize("num_columns", [2, 3, 4], ids=["pairs", "one-hard-negative", "two-hard-negatives"])
@pytest.mark.parametrize("directions, partition_mode", ACCEPTED,
                         ids=["+".join(d) + f"/{p}" for d, p in ACCEPTED])
def test_every_setting_the_peer_accepts_gives_its_value(directions, partition_mode, num_columns,
                                                        hardness_mode):
    """InfoNCE (materialised and tiled), MACL at alpha = 0 without reweighting and DySTreSS at
    one temperature against the peer, value and gradients, hard negatives and hardness too."""
    columns = _columns(columns=num_columns)
    kw = {"directions": directions, "partition_mode": partition_mode}
    if hardness_mode is not None:
        kw |= {"hardness_mode": hardness_mode, "hardness_strength": 1.5}
    theirs = _value_and_grads(MultipleNegativesRankingLoss(None, 20.0, **kw), columns)
    ours = {
        "infonce": st_losses.InfoNCELoss(None, 20.0, **kw),
        "infonce-tiled": st_losses.InfoNCELoss(None, 20.0, tile_size=2, **kw),
        "macl": st_losses.MACLLoss(None, 20.0, alpha=0.0, reweight=False, **kw),
        "dystress": st_losses.DySTreSSLoss(None, min_temperature=0.05, max_temperature=0.05, **kw),
    }
    for name, loss in ours.items():
        assert loss.directions == directions and loss.partition_mode == partition_mode
        _assert_same(_value_and_grads(loss, columns), theirs, name)


@pytest.mark.parametrize("directions", [d for d, p in ACCEPTED if p == "joint" and len(d) > 1])
def test_macls_temperature_rules_every_term_of_a_joint_row(directions):
    """MACL's tau_A = tau0 (1 + alpha (A - A0)) from the (detached) alignment A of the pairs, on
    the whole joint row: the peer's loss at scale 1 / tau_A, value and gradients."""
    q, d, n = _columns(columns=3, seed=2)
    columns = [q, (q + 0.3 * d).detach().requires_grad_(), n]  # aligned pairs: A near 0.95
    ours = st_losses.MACLLoss(None, temperature=0.05, alpha=2.0, a0=0.8, directions=directions)
    value, grads = _value_and_grads(ours, columns)
    q, d = (torch.nn.functional.normalize(c.detach(), dim=1) for c in columns[:2])
    tau = 0.05 * (1 + 2.0 * ((q * d).sum(1).mean() - 0.8))
    assert tau > 0.05  # above the floor, and not the base temperature
    assert float(ours.last_stats["temperature"]) == pytest.approx(float(tau), rel=1e-12)
    peer = MultipleNegativesRankingLoss(None, scale=float(1 / tau), directions=directions)
    _assert_same((value, grads), _value_and_grads(peer, columns), "macl")


def test_the_order_and_repeats_of_directions_do_not_matter_as_for_the_peer():
    columns = _columns(columns=3, seed=5)
    a = st_losses.InfoNCELoss(None, directions=("doc_to_doc", "query_to_doc", "doc_to_doc"))
    b = st_losses.InfoNCELoss(None, directions=("query_to_doc", "doc_to_doc"))
    assert a.directions == b.directions == ("query_to_doc", "doc_to_doc")
    torch.testing.assert_close(a.compute_loss_from_embeddings(columns, None),
                               b.compute_loss_from_embeddings(columns, None))


@pytest.mark.parametrize("kwargs, match", [
    ({"directions": ()}, "at least one direction"),
    ({"directions": ("doc_to_query",)}, "'query_to_doc' is required"),
    ({"directions": ("query_to_doc", "doc_to_docs")}, "invalid"),
    ({"partition_mode": "both"}, "partition_mode must be one of"),
    ({"directions": ("query_to_doc", "query_to_query"), "partition_mode": "per_direction"},
     "per_direction"),
    ({"directions": ("query_to_doc", "doc_to_doc"), "partition_mode": "per_direction"},
     "per_direction"),
])
def test_what_the_peer_refuses_is_refused_the_same_way(kwargs, match):
    """The peer raises ``ValueError`` for each of these; so does every loss that takes
    ``directions``, naming the setting."""
    with pytest.raises(ValueError):
        MultipleNegativesRankingLoss(None, **kwargs)
    for cls in (st_losses.InfoNCELoss, st_losses.MACLLoss, st_losses.DySTreSSLoss):
        with pytest.raises(ValueError, match=match):
            cls(None, **kwargs)


def test_settings_meaningless_here_are_refused_naming_why():
    with pytest.raises(ValueError, match="symmetric=True is directions"):
        st_losses.InfoNCELoss(None, symmetric=True, directions=("query_to_doc", "doc_to_doc"))
    with pytest.raises(ValueError, match="no one class"):
        st_losses.InfoNCELoss(None, use_labels=True, directions=("query_to_doc", "doc_to_query"))
    with pytest.raises(TypeError, match="sequence of direction names"):
        st_losses.InfoNCELoss(None, directions="query_to_doc")


def test_the_settings_are_in_the_config_and_symmetric_is_its_spelling():
    joint = st_losses.InfoNCELoss(None, directions=("query_to_doc", "doc_to_query"))
    assert not joint.symmetric
    assert joint.get_config_dict()["directions"] == ("query_to_doc", "doc_to_query")
    assert joint.get_config_dict()["partition_mode"] == "joint"
    symmetric = st_losses.InfoNCELoss(None, symmetric=True)
    assert symmetric.directions == ("query_to_doc", "doc_to_query")
    assert symmetric.partition_mode == "per_direction"
    assert "directions" not in symmetric.get_config_dict()


def test_joint_rows_of_bf16_embeddings_multiply_in_bf16():
    """The joint rows carry the batch's dtype to the precision policy
    (adaptcl.plugins._products): bf16 columns give, bit for bit, the float32 loss of the
    same values with bf16 products (PyTorch's "medium"), not the IEEE one."""
    columns = [c.detach().bfloat16() for c in _columns(columns=3, seed=3)]
    loss = st_losses.InfoNCELoss(None, 20.0, directions=("query_to_doc", "doc_to_doc"))
    half = loss.compute_loss_from_embeddings(columns, None)
    upcast = [c.float() for c in columns]
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        with tiling(emulate_tensor_cores=True):  # float32 on the CPU at "medium": bf16 products
            medium = loss.compute_loss_from_embeddings(upcast, None)
        torch.set_float32_matmul_precision("highest")
        highest = loss.compute_loss_from_embeddings(upcast, None)
    finally:
        torch.set_float32_matmul_precision(before)
    assert torch.equal(half, medium) and not torch.equal(half, highest)
