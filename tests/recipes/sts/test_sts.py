"""The ``sts`` recipe: its table (the SimCSE column order), its result files, the cache across
runs, what enters a cell's identity, sweeps, config files and jobs (the protocol itself:
tests/evaluation/senteval/test_sts.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from adaptcl.cli import main
from adaptcl.recipes.engine import RecipeError
from adaptcl.recipes.sts.config import STSConfig
from adaptcl.recipes.sts.recipe import TABLE_COLUMNS, STSRecipe
from tests.evaluation._bow import CountingEncoder, hashed_bow

BOW = "tests.evaluation._bow:hashed_bow"


def _argv(shared_data, out, *extra):
    return ["sts", "--model", BOW, "--model-id", "bow", "--data-root", str(shared_data),
            "--output-dir", str(out), "--cache-dir", str(out / "cache"), "--no-progress", *extra]


def _cells(result, key):
    return [(c["task"], c["encoder"], c["seed"]) for c in result[key]]


def test_config_and_model_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown tasks 'STS17'"):
        STSConfig(model=hashed_bow, tasks=["STS17"])
    with pytest.raises(RecipeError, match="no model given"):
        STSRecipe(STSConfig(output_dir=str(tmp_path / "out"))).run()
    assert not (tmp_path / "out").exists()


def test_run_sts_all_tasks_with_callable_twice_uses_cache(shared_data, tmp_path):
    counting = CountingEncoder()
    config = STSConfig(model=counting, data_root=str(shared_data),
                       output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"),
                       progress=False, batch_size=512)
    result = STSRecipe(config).run()
    assert list(result["table"]) == list(TABLE_COLUMNS)
    assert result["table"]["Avg."] == pytest.approx(np.mean([result["table"][c]
                                                             for c in TABLE_COLUMNS[:-1]]))
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
    assert saved["table"] == pytest.approx(result["table"]) and saved["axes"] == ["task",
                                                                                  "encoder"]
    (method,) = saved["summary"]["spearman"]["STS12"]["methods"]
    for task, column in STSRecipe.columns.items():
        assert saved["summary"]["spearman"][task]["methods"][method]["mean"] == result["table"][column]
    markdown = (tmp_path / "out" / "results.md").read_text()
    assert "| Model | STS12 | STS13 | STS14 | STS15 | STS16 | STS-B | SICK-R | Avg. |" in markdown
    assert "| Task | n | Spearman all | Spearman mean | Spearman wmean |" in markdown
    assert "## spearman" in markdown and "| STS-B | " in markdown
    second = STSRecipe(config).run()
    assert counting.calls == calls  # every dataset came from the cache
    assert second["table"] == result["table"]


def test_cli_with_callable_spec(shared_data, tmp_path, capsys):
    code = main(["sts", "--model", BOW, "--tasks", "sts13", "STSBenchmark", "--data-root",
                 str(shared_data), "--output-dir", str(tmp_path / "o"), "--cache-dir",
                 str(tmp_path / "c"), "--no-progress"])
    assert code == 0
    saved = json.loads((tmp_path / "o" / "results.json").read_text())
    assert set(saved["table"]) == {"STS13", "STS-B", "Avg."}
    assert saved["model_id"] == f"callable:{BOW}"
    env = saved["environment"]  # the result describes where and how it was computed
    assert env["data_fingerprint"]["STS13"]["files"] == 6 and env["torch_threads"] == 1
    assert env["torch"] and env["timestamp"] and env["data_root"] == str(shared_data.resolve()
                                                                         / "senteval" / "downstream")
    method = "tests.evaluation._bow_hashed_bow"  # the label, path-safe (runs/<task>/<method>/)
    assert saved["partial"] is False and _cells(saved, "computed") == [
        ("STS13", method, 0), ("STSBenchmark", method, 0)]
    assert saved["label"] == BOW
    assert (tmp_path / "o" / "runs" / "STS13" / method / "seed0.json").is_file()
    assert "| Model | STS13 | STS-B | Avg. |" in (tmp_path / "o" / "results.md").read_text()
    out = capsys.readouterr().out
    assert f"| task | {BOW} |" in out and "| STS-B | " in out


def test_encoder_settings_enter_the_identity_as_the_encoder_and_bookkeeping_does_not(
        shared_data, tmp_path):
    """``--batch-size`` changes no embedding (bookkeeping: reused); ``--no-cache`` recomputes
    anyway, setting the old record aside; ``--max-length`` builds another encoder, whose identity
    differs (recomputed)."""
    out = tmp_path / "o"
    argv = _argv(shared_data, out, "--tasks", "STS13")
    assert main(argv) == 0
    first = json.loads((out / "results.json").read_text())
    assert main([*argv, "--batch-size", "7"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["computed"] == [] and len(again["reused"]) == 1
    assert main([*argv, "--no-cache"]) == 0
    forced = json.loads((out / "results.json").read_text())
    assert forced["reused"] == [] and len(forced["computed"]) == 1
    assert len(forced["superseded"]) == 1  # the old record set aside, not overwritten
    assert forced["table"] == first["table"]
    assert main([*argv, "--max-length", "8"]) == 0
    longer = json.loads((out / "results.json").read_text())
    assert len(longer["computed"]) == 1 and len(longer["superseded"]) == 1
    assert longer["encoder"]["max_length"] == 8


def test_the_saved_config_reruns_the_same_cells(shared_data, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(_argv(shared_data, out, "--tasks", "STS13", "SICKRelatedness")) == 0
    assert main(["sts", "--config", str(out / "config.yaml")]) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["computed"] == [] and len(again["reused"]) == 2
    assert again["config"]["model_id"] == "bow"
    capsys.readouterr()


def test_a_swept_pooler_builds_one_encoder_per_value(shared_data, tmp_path, tiny_bert, capsys):
    out = tmp_path / "o"
    assert main(["sts", "--model", str(tiny_bert), "--pooler", "cls_before_pooler", "avg",
                 "--tasks", "STSBenchmark", "--data-root", str(shared_data), "--output-dir",
                 str(out), "--cache-dir", str(out / "cache"), "--no-progress"]) == 0
    saved = json.loads((out / "results.json").read_text())
    assert saved["sweep"] == {"pooler": ["cls_before_pooler", "avg"]}
    scores = {r["cell"]["pooler"]: r["metrics"]["spearman"] for r in saved["runs"]}
    assert set(scores) == {"cls_before_pooler", "avg"} and len(set(scores.values())) == 2
    header = (out / "results.md").read_text()
    for pooler, score in scores.items():
        assert f"| {tiny_bert.name}, pooler={pooler} | {score:.2f} |" in header
    capsys.readouterr()


def test_jobs_with_a_callable_without_model_id_are_refused_before_any_work(shared_data,
                                                                           tmp_path, capsys):
    """A job rebuilds the encoder and checks its identity; a callable without ``model_id`` has
    none a job could check (each process would draw its own token)."""
    code = main(["sts", "--model", BOW, "--tasks", "STS13", "--data-root", str(shared_data),
                 "--output-dir", str(tmp_path / "o"), "--no-progress", "--jobs", "2"])
    assert code == 2 and not (tmp_path / "o").exists()
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"adaptcl sts: error: --jobs/--cluster needs an encoder with an identity; '{BOW}' has "
        "none (a callable without model_id): pass --model-id NAME, or run without --jobs")


@pytest.mark.slow
def test_two_jobs_sharing_one_embedding_cache_score_as_the_sequential_run(shared_data, tmp_path):
    pytest.importorskip("submitit")
    common = ["--tasks", "STS12", "STS13", "SICKRelatedness"]
    assert main(_argv(shared_data, tmp_path / "seq", *common)) == 0
    assert main(_argv(shared_data, tmp_path / "par", *common, "--jobs", "2")) == 0
    seq, par = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("seq", "par"))
    assert par["table"] == seq["table"] and len(par["computed"]) == 3
    # every job wrote its task's embeddings to the shared cache, each file whole
    assert sorted(p.name for p in (tmp_path / "par" / "cache").rglob("*.npy")) == sorted(
        p.name for p in (tmp_path / "seq" / "cache").rglob("*.npy"))
