"""The STS protocol: SentEval's all/mean/wmean, cosine scoring and its refusals, and its parity with
sentence-transformers' EmbeddingSimilarityEvaluator on STS-B test with the real all-MiniLM-L6-v2."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import rankdata

from adaptcl.evaluation.senteval import sts
from adaptcl.evaluation.senteval.encoders import build_encoder


def _spearman(x, y):  # independent of scipy.stats.spearmanr: Pearson of average ranks
    return float(np.corrcoef(rankdata(x), rankdata(y))[0, 1])


def test_all_mean_wmean_on_hand_made_example():
    scores = {
        "A": ([0.1, 0.2, 0.3], [1.0, 2.0, 3.0]),              # perfectly ordered: rho = 1
        "B": ([0.15, 0.25, 0.35, 0.45], [4.0, 3.0, 2.0, 1.0]),  # perfectly reversed: rho = -1
    }
    out = sts.aggregate_subsets(scores)
    assert out["subsets"]["A"]["spearman"] == pytest.approx(1.0)
    assert out["subsets"]["B"]["spearman"] == pytest.approx(-1.0)
    assert out["spearman"]["mean"] == pytest.approx(0.0)
    assert out["spearman"]["wmean"] == pytest.approx((3 * 1.0 - 4 * 1.0) / 7)
    # "all": concatenated system ranks [1,3,5,2,4,6,7] vs gold ranks [1.5,3.5,5.5,7,5.5,3.5,1.5]
    # -> centred cross-product -5, squared norms 28 and 26.5
    assert out["spearman"]["all"] == pytest.approx(-5 / np.sqrt(28 * 26.5))
    concat_sys = [0.1, 0.2, 0.3, 0.15, 0.25, 0.35, 0.45]
    concat_gold = [1.0, 2.0, 3.0, 4.0, 3.0, 2.0, 1.0]
    assert out["spearman"]["all"] == pytest.approx(_spearman(concat_sys, concat_gold))
    assert out["pearson"]["all"] == pytest.approx(np.corrcoef(concat_sys, concat_gold)[0, 1])
    assert out["n"] == 7


def test_cosine_scores_matches_definition_and_zero_vectors():
    a = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [2.0, 0.0]])
    b = np.array([[0.0, 3.0], [2.0, 2.0], [1.0, 1.0], [-1.0, 0.0]])
    np.testing.assert_allclose(sts.cosine_scores(a, b), [0.0, 1.0, 0.0, -1.0], atol=1e-12)
    with pytest.raises(ValueError, match="same|one shape"):
        sts.cosine_scores(a, b[:2])


@pytest.mark.slow
def test_stsb_parity_with_embedding_similarity_evaluator(minilm_path, shared_data, tmp_path,
                                                        one_thread):
    """Our STS-B test Spearman must be within 1 point of sentence-transformers' evaluator
    (all-MiniLM-L6-v2 publishes ~82)."""
    encoder = build_encoder(minilm_path, cache_dir=tmp_path, show_progress=False)
    ours = sts.evaluate_task(encoder, "STSBenchmark", shared_data)
    reference = sts.st_evaluator_stsb(minilm_path, shared_data)
    assert ours["n"] == 1379
    assert abs(100 * ours["spearman"] - 100 * reference["spearman"]) < 1.0
    assert 80.0 < 100 * ours["spearman"] < 84.0
    assert 80.0 < 100 * reference["spearman"] < 84.0


def test_constant_system_scores_are_refused_by_correlations():
    with pytest.raises(ValueError, match="all 3 system scores equal 0.5"):
        sts.correlations([0.5, 0.5, 0.5], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="system scores contain NaN"):
        sts.correlations([0.1, float("nan"), 0.3], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="non-finite"):
        sts.cosine_scores(np.array([[np.nan, 1.0]]), np.array([[1.0, 1.0]]))
