"""Gradient caching under DistributedDataParallel (two gloo processes): the replay in backward
synchronises once, after the last mini-batch, and not at all inside an outer ``no_sync``
(gradient accumulation), exactly like sentence-transformers' CachedMultipleNegativesRankingLoss."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("sentence_transformers")

from tests._distributed import gloo_results  # noqa: E402
from tests.adapters._tiny_models import CORPUS, build_tiny_model  # noqa: E402

WORLD, ROWS = 2, 4  # 4 rows per rank at mini-batch 2: four replayed mini-batches per step
LOSSES = ("ours_cached", "peer_cached", "plain")


def _make(name: str, model):
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MultipleNegativesRankingLoss,
    )

    from adaptcl.adapters.sentence_transformers import InfoNCELoss

    if name == "ours_cached":
        return InfoNCELoss(model, scale=20.0, mini_batch_size=2)
    if name == "peer_cached":
        return CachedMultipleNegativesRankingLoss(model, scale=20.0, mini_batch_size=2)
    return MultipleNegativesRankingLoss(model, scale=20.0)


def _rank(path: str, rank: int) -> dict:
    """Each loss's step on ``rank``'s rows under DDP (in a gloo process group)."""
    from torch.nn.parallel import DistributedDataParallel

    from adaptcl.adapters.sentence_transformers import build_simcse_model

    # float64: mini-batches are padded to their own length; in float32 that alone moves the
    # (small, ~1e-5) gradients of this tiny random encoder by ~1e-6
    model = build_simcse_model(path, "cls_before_pooler", max_seq_length=16, dropout=0.0).double()
    # BERT's pooler layer is not used by CLS pooling, hence find_unused_parameters
    ddp = DistributedDataParallel(model, find_unused_parameters=True)
    syncs: list[int] = []

    def counting_allreduce(state, bucket):
        syncs.append(1)
        buffer = bucket.buffer().div_(WORLD)
        return dist.all_reduce(buffer, async_op=True).get_future().then(lambda fut: fut.value()[0])

    ddp.register_comm_hook(None, counting_allreduce)
    anchors = CORPUS[rank * ROWS:(rank + 1) * ROWS]
    columns = [anchors, anchors[::-1]]
    out = {}
    for name in LOSSES:
        loss = _make(name, model)
        loss.model = ddp  # what SentenceTransformerTrainer does under DDP
        ddp.zero_grad()
        syncs.clear()
        loss([dict(model.tokenize(t)) for t in columns], None).backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        step_syncs = len(syncs)
        ddp.zero_grad()
        syncs.clear()
        with ddp.no_sync():  # gradient accumulation: no synchronisation at all
            loss([dict(model.tokenize(t)) for t in columns], None).backward()
        out[name] = {"syncs": step_syncs, "syncs_in_no_sync": len(syncs), "grads": grads.tolist()}
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny-bert-ddp"), "bert")
    return gloo_results(functools.partial(_rank, str(path)), WORLD)


@pytest.mark.slow
def test_cached_replay_synchronises_once_like_the_peers_cached_loss(results):
    for rank in range(WORLD):
        got = results[rank]
        assert got["plain"]["syncs"] >= 1  # one all-reduce per gradient bucket
        assert got["ours_cached"]["syncs"] == got["peer_cached"]["syncs"] == got["plain"]["syncs"]


@pytest.mark.slow
def test_cached_replay_inside_no_sync_does_not_synchronise_like_the_peer(results):
    for rank in range(WORLD):
        assert {name: results[rank][name]["syncs_in_no_sync"] for name in LOSSES} == dict.fromkeys(LOSSES, 0)


@pytest.mark.slow
def test_cached_ddp_gradients_equal_the_peers_and_the_uncached_ones(results):
    tol = {"rtol": 1e-7, "atol": 1e-13}
    for rank in range(WORLD):
        ours = torch.tensor(results[rank]["ours_cached"]["grads"], dtype=torch.float64)
        assert ours.abs().max() > 1e-6
        for other in ("peer_cached", "plain"):
            torch.testing.assert_close(ours, torch.tensor(results[rank][other]["grads"], dtype=torch.float64),
                                       **tol, msg=lambda m, other=other: f"{other}: {m}")
    # synchronised: both ranks hold the same averaged gradient
    torch.testing.assert_close(torch.tensor(results[0]["ours_cached"]["grads"], dtype=torch.float64),
                               torch.tensor(results[1]["ours_cached"]["grads"], dtype=torch.float64))
