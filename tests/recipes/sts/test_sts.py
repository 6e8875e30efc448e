"""The ``sts`` recipe: its table (the SimCSE column order), its result files, the cache across
runs and its command line (the protocol itself: tests/evaluation/senteval/test_sts.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from adaptcl.recipes import sts
from adaptcl.recipes.template.errors import RecipeError
from tests.evaluation._bow import CountingEncoder, hashed_bow


def test_config_and_model_errors(tmp_path):
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

    code = main(["sts", "--model", "tests.evaluation._bow:hashed_bow", "--tasks", "STS13",
                 "STSBenchmark", "--data-root", str(shared_data), "--output-dir",
                 str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c"), "--no-progress"])
    assert code == 0
    saved = json.loads((tmp_path / "o" / "results.json").read_text())
    assert set(saved["table"]) == {"STS13", "STS-B", "Avg."}
    assert saved["model_id"] == "callable:tests.evaluation._bow:hashed_bow"
    env = saved["environment"]  # the result describes where and how it was computed
    assert env["data_fingerprint"]["STS13"]["files"] == 6 and env["torch_threads"] == 1
    assert env["torch"] and env["timestamp"] and env["data_root"] == str(shared_data.resolve()
                                                                         / "senteval" / "downstream")
    method = "tests.evaluation._bow_hashed_bow"  # the label, path-safe (runs/<task>/<method>/)
    assert saved["partial"] is False and saved["computed"] == [["STS13", method, 0],
                                                               ["STSBenchmark", method, 0]]
    assert saved["label"] == "tests.evaluation._bow:hashed_bow"
    assert (tmp_path / "o" / "runs" / "STS13" / method / "seed0.json").is_file()
    assert "| Model | STS13 | STS-B | Avg. |" in (tmp_path / "o" / "results.md").read_text()
    out = capsys.readouterr().out
    assert "| dataset | tests.evaluation._bow:hashed_bow |" in out and "| STS-B | " in out




def test_jobs_with_a_callable_without_model_id_are_refused_before_any_work(shared_data,
                                                                           tmp_path, capsys):
    """A job rebuilds the encoder and checks its identity; a callable without ``model_id`` has
    none a job could check (each process would draw its own token)."""
    from adaptcl.cli import main

    code = main(["sts", "--model", "tests.evaluation._bow:hashed_bow", "--tasks", "STS13",
                 "--data-root", str(shared_data), "--output-dir", str(tmp_path / "o"),
                 "--no-progress", "--jobs", "2"])
    assert code == 2 and not (tmp_path / "o").exists()
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "adaptcl sts: error: --jobs/--cluster needs an encoder with an identity; "
        "'tests.evaluation._bow:hashed_bow' has none (a callable without model_id): pass "
        "--model-id NAME, or run without --jobs")


@pytest.mark.slow
def test_two_jobs_sharing_one_embedding_cache_score_as_the_sequential_run(shared_data, tmp_path):
    pytest.importorskip("submitit")
    from adaptcl.cli import main

    common = ["sts", "--model", "tests.evaluation._bow:hashed_bow", "--model-id", "bow",
              "--tasks", "STS12", "STS13", "SICKRelatedness", "--data-root", str(shared_data),
              "--no-progress"]
    assert main([*common, "--output-dir", str(tmp_path / "seq"),
                 "--cache-dir", str(tmp_path / "c-seq")]) == 0
    assert main([*common, "--output-dir", str(tmp_path / "par"),
                 "--cache-dir", str(tmp_path / "c-par"), "--jobs", "2"]) == 0
    seq, par = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("seq", "par"))
    assert par["table"] == seq["table"] and len(par["computed"]) == 3
    # every job wrote its task's embeddings to the shared cache, each file whole
    assert sorted(p.name for p in (tmp_path / "c-par").rglob("*.npy")) == sorted(
        p.name for p in (tmp_path / "c-seq").rglob("*.npy"))
