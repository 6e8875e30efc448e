"""gather_across_devices with two gloo processes equals the single-process full batch."""

from __future__ import annotations

import pytest
import torch

from tests._distributed import full_batch, gloo_results, step_on_rank

pytest.importorskip("sentence_transformers")

WORLD, N, D = 2, 5, 8
NAMES = ("infonce", "macl", "macl_symmetric", "amcl", "dystress", "hardness_hard_negatives",
         "hardness_in_batch_symmetric", "supcon", "supcon_dystress_hardness", "joint_all_hardness",
         "joint_macl_doc_to_doc")
#: classes of the full batch, shared across the two ranks (labels must be gathered)
LABELS = torch.tensor([0, 1, 2, 0, 1, 2, 3, 0, 1, 3])


def _labels(name: str, rows: slice):
    return LABELS[rows] if name.startswith("supcon") else None


class _Encoder(torch.nn.Module):
    """Stands in for the model: AMCL only reads the embedding size to build its heads."""

    def get_embedding_dimension(self) -> int:
        return D


def _make(name: str, gather: bool):
    from adaptcl.adapters import sentence_transformers as st

    if name == "infonce":
        return st.InfoNCELoss(None, temperature=0.05, gather_across_devices=gather)
    if name == "macl":
        return st.MACLLoss(None, gather_across_devices=gather)
    if name == "dystress":
        return st.DySTreSSLoss(None, shape="cosine", gather_across_devices=gather)
    if name == "hardness_hard_negatives":  # each rank's hard negatives are its own anchors'
        return st.InfoNCELoss(None, temperature=0.05, hardness_mode="hard_negatives",
                              hardness_strength=5.0, gather_across_devices=gather)
    if name == "hardness_in_batch_symmetric":
        return st.MACLLoss(None, alpha=0.0, hardness_mode="in_batch_negatives",
                           hardness_strength=9.0, symmetric=True, gather_across_devices=gather)
    if name == "supcon":
        return st.InfoNCELoss(None, temperature=0.1, use_labels=True, gather_across_devices=gather)
    if name == "supcon_dystress_hardness":
        return st.DySTreSSLoss(None, use_labels=True, hardness_mode="all_negatives",
                               hardness_strength=2.0, gather_across_devices=gather)
    if name == "joint_all_hardness":  # one joint softmax over the peer's four terms
        return st.InfoNCELoss(None, temperature=0.05, hardness_mode="hard_negatives",
                              hardness_strength=5.0, gather_across_devices=gather,
                              directions=("query_to_doc", "query_to_query", "doc_to_query",
                                          "doc_to_doc"))
    if name == "joint_macl_doc_to_doc":  # each rank excludes its own pairs' documents
        return st.MACLLoss(None, alpha=0.5, a0=0.0, directions=("query_to_doc", "doc_to_doc"),
                           gather_across_devices=gather)
    if name == "amcl":
        torch.manual_seed(0)  # the same heads and temperature network on every rank
        loss = st.AMCLLoss(_Encoder(), num_heads=2, projection_dim=4, gather_across_devices=gather)
        # the heads' BatchNorm in eval mode: batch statistics per rank differ from the full
        # batch's by design (as in any DDP run without SyncBatchNorm); the gathering is under test
        return loss.eval()
    return st.MACLLoss(None, temperature=0.1, alpha=0.5, a0=0.0, symmetric=True, gather_across_devices=gather)


def _columns():
    return full_batch(N, D, WORLD, columns=3)  # anchor, positive, hard negative


def _rank(rank: int) -> dict:
    """Every loss on ``rank``'s rows of the columns (in a gloo process group)."""
    labels = {name: _labels(name, slice(rank * N, (rank + 1) * N)) for name in NAMES}
    return {name: step_on_rank(lambda *cols, name=name: _make(name, True)
                               .compute_loss_from_embeddings(list(cols), labels[name]),
                               _columns(), rank, N, WORLD) for name in NAMES}


@pytest.fixture(scope="module")
def results():
    return gloo_results(_rank, WORLD)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_gather_across_devices_equals_the_full_batch_hard_negatives_included(results, name):
    cols = [c.clone().requires_grad_() for c in _columns()]
    loss = _make(name, False).compute_loss_from_embeddings(cols, _labels(name, slice(None)))
    loss.backward()
    for rank in range(WORLD):
        got = results[rank][name]
        assert got["loss"] == pytest.approx(loss.item(), rel=1e-5)
        for g_dist, col in zip(got["grads"], cols, strict=True):
            torch.testing.assert_close(torch.tensor(g_dist), col.grad[rank * N:(rank + 1) * N],
                                       rtol=1e-4, atol=1e-6)
