"""The ``transfer`` recipe on real subsets with a hashed bag-of-words encoder (no model download,
seconds per task); the protocol itself: tests/evaluation/senteval/test_transfer.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from adaptcl.evaluation.senteval import transfer as te
from adaptcl.recipes import transfer as tr
from adaptcl.recipes.template.errors import RecipeError
from tests.evaluation._bow import CountingEncoder, hashed_bow


def test_config_refuses_bad_settings():
    for bad, message in (({"params": "slow"}, "params"), ({"classifier": "svm"}, "classifier"),
                         ({"tasks": ["SNLI"]}, "unknown task 'SNLI'"),
                         ({"mrpc_features": "concat"}, "mrpc_features"), ({"kfold": 1}, "kfold"),
                         ({"seeds": [1, 1]}, "distinct"), ({"limit": 5}, "limit"),
                         ({"backend": "senteval", "seeds": [1, 2]}, "one seed")):
        with pytest.raises(ValueError, match=message):
            tr.TransferConfig(model=hashed_bow, **bad)
    assert tr.TransferConfig(tasks=["mr", "trec"]).tasks == ["MR", "TREC"]
    assert tr.TransferConfig(params="fasttest").probe(1111) == te.Probe(params="fasttest",
                                                                        seed=1111)


def test_senteval_backend_is_guarded(tmp_path, shared_data):
    pytest.importorskip("sklearn")
    try:
        import senteval  # noqa: F401
    except ImportError:
        pass
    else:  # pragma: no cover
        pytest.skip("senteval is installed")
    config = tr.TransferConfig(model=hashed_bow, backend="senteval", data_root=str(shared_data),
                               output_dir=str(tmp_path), cache_dir=str(tmp_path / "c"))
    with pytest.raises(RecipeError, match="needs the senteval package"):
        tr.TransferRecipe(config).run()
    assert not list(tmp_path.iterdir())  # refused before any work


@pytest.mark.slow
def test_run_transfer_all_tasks_on_subsets(shared_data, tmp_path):
    counting = CountingEncoder()
    config = tr.TransferConfig(model=counting, data_root=str(shared_data), limit=300,
                               output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "c"),
                               progress=False, batch_size=512, kfold=3)
    result = tr.TransferRecipe(config).run()
    assert list(result["table"]) == list(tr.TABLE_COLUMNS)
    for task in tr.TRANSFER_TASKS:
        assert result["tasks"][task]["ntest"] == 300, task
        assert 0 <= result["table"][task] <= 100
    assert len(result["tasks"]["MR"]["fold_acc"]) == 3
    # question words make TREC easy for a bag of words: far above the 6-class majority (~25 %)
    assert result["table"]["TREC"] > 45
    assert "f1" in result["tasks"]["MRPC"] and result["tasks"]["MRPC"]["features"] == "senteval"
    assert result["table"]["Avg."] == pytest.approx(np.mean([result["table"][t]
                                                             for t in tr.TRANSFER_TASKS]))
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["table"] == pytest.approx(result["table"])
    md = (tmp_path / "out" / "results.md").read_text()
    assert "| Model | MR | CR | SUBJ | MPQA | SST2 | TREC | MRPC | Avg. |" in md
    assert "## acc" in md and "## devacc" in md
    calls = counting.calls
    again = tr.TransferRecipe(config).run()  # embeddings from the cache, deterministic classifiers
    assert counting.calls == calls
    assert again["table"] == pytest.approx(result["table"])


def test_cli_transfer(shared_data, tmp_path, capsys):
    from adaptcl.cli import main

    code = main(["transfer", "--model", "tests.evaluation._bow:hashed_bow", "--tasks", "TREC",
                 "MRPC", "--limit", "200", "--kfold", "2", "--classifier", "sklearn",
                 "--mrpc-features", "full", "--data-root", str(shared_data),
                 "--output-dir", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c"),
                 "--no-progress"])
    assert code == 0
    saved = json.loads((tmp_path / "o" / "results.json").read_text())
    assert set(saved["table"]) == {"TREC", "MRPC", "Avg."}
    assert saved["tasks"]["MRPC"]["features"] == "full"
    assert saved["tasks"]["TREC"]["l2reg"] in te.SKLEARN_REGS_KFOLD
    assert "| Model | TREC | MRPC | Avg. |" in (tmp_path / "o" / "results.md").read_text()
    assert "| TREC | " in capsys.readouterr().out
