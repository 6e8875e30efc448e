"""The ``transfer`` recipe on real subsets with a hashed bag-of-words encoder (no model download,
seconds per task): its table, refusals, seeds and sweeps; the protocol itself:
tests/evaluation/senteval/test_transfer.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from adaptcl.cli import main
from adaptcl.evaluation.senteval import transfer as te
from adaptcl.recipes.engine import DivergedError, NonResultError, RecipeError
from adaptcl.recipes.transfer.config import TransferConfig
from adaptcl.recipes.transfer.recipe import TransferRecipe
from tests.evaluation._bow import CountingEncoder, SwitchableEncoder, hashed_bow
from tests.recipes._cli import check_help

TABLE_COLUMNS = (*te.TRANSFER_TASKS, "Avg.")



def test_config_refuses_bad_settings():
    for bad, message in (({"params": "slow"}, "unknown params 'slow'"),
                         ({"classifier": "svm"}, "unknown classifier"),
                         ({"tasks": ["SNLI"]}, "unknown tasks 'SNLI'"),
                         ({"mrpc_features": "concat"}, "mrpc features"),
                         ({"kfold": 1}, "kfold must be a number >= 2"),
                         ({"limit": 5}, "limit must be a number >= 10"),
                         ({"backend": "senteval", "seeds": [1, 2]}, "one seed")):
        with pytest.raises(ValueError, match=message):
            TransferConfig(model=hashed_bow, **bad)
    assert TransferConfig(tasks=["mr", "trec"]).tasks == ["MR", "TREC"]
    assert TransferConfig(params="fasttest").probe(1111) == te.Probe(params="fasttest", seed=1111)


def test_help_is_fast_shows_defaults_and_an_example_and_imports_no_torch():
    check_help("transfer")


def test_senteval_backend_is_guarded(tmp_path, shared_data):
    pytest.importorskip("sklearn")
    try:
        import senteval  # noqa: F401
    except ImportError:
        pass
    else:  # pragma: no cover
        pytest.skip("senteval is installed")
    config = TransferConfig(model=hashed_bow, backend="senteval", data_root=str(shared_data),
                            output_dir=str(tmp_path), cache_dir=str(tmp_path / "c"))
    with pytest.raises(RecipeError, match="needs the senteval package"):
        TransferRecipe(config).run()
    assert not list(tmp_path.iterdir())  # refused before any work


def test_transfer_reports_no_accuracy_from_nan_features(shared_data, tmp_path):
    config = TransferConfig(model=SwitchableEncoder("nan"), tasks=["CR"],
                            data_root=str(shared_data), output_dir=str(tmp_path / "out"),
                            cache_dir=str(tmp_path / "cache"), limit=60, kfold=2,
                            progress=False)
    with pytest.raises(NonResultError, match="on 'CR': .* contain NaN") as err:
        TransferRecipe(config).run()
    assert not isinstance(err.value, DivergedError)  # a frozen encoder's NaN: refused
    assert not list((tmp_path / "out").rglob("*.json"))  # no record, no result (locks only)


@pytest.mark.slow
def test_run_transfer_all_tasks_on_subsets(shared_data, tmp_path):
    counting = CountingEncoder()
    config = TransferConfig(model=counting, data_root=str(shared_data), limit=300,
                            output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "c"),
                            progress=False, batch_size=512, kfold=3)
    result = TransferRecipe(config).run()
    assert list(result["table"]) == list(TABLE_COLUMNS)
    for task in te.TRANSFER_TASKS:
        assert result["tasks"][task]["ntest"] == 300, task
        assert 0 <= result["table"][task] <= 100
    assert len(result["tasks"]["MR"]["fold_acc"]) == 3
    # question words make TREC easy for a bag of words: far above the 6-class majority (~25 %)
    assert result["table"]["TREC"] > 45
    assert "f1" in result["tasks"]["MRPC"] and result["tasks"]["MRPC"]["features"] == "senteval"
    assert result["table"]["Avg."] == pytest.approx(np.mean([result["table"][t]
                                                             for t in te.TRANSFER_TASKS]))
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["table"] == pytest.approx(result["table"])
    md = (tmp_path / "out" / "results.md").read_text()
    assert "| Model | MR | CR | SUBJ | MPQA | SST2 | TREC | MRPC | Avg. |" in md
    assert "## acc" in md and "## devacc" in md
    calls = counting.calls
    again = TransferRecipe(config).run()  # every cell reused: nothing encoded again
    assert counting.calls == calls and again["table"] == result["table"]


def test_cli_transfer(shared_data, tmp_path, capsys):
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


def test_seeds_are_cells_and_a_protocol_sweep_is_an_axis_of_the_grid(shared_data, tmp_path,
                                                                     capsys):
    """Two classifier seeds x two values of ``--kfold``: four cells, each with its own folds;
    the protocol settings are in each cell's identity, the encoder's once (one encoder)."""
    out = tmp_path / "o"
    argv = ["transfer", "--model", "tests.evaluation._bow:hashed_bow", "--model-id", "bow",
            "--tasks", "MR", "--limit", "60", "--kfold", "2", "3", "--classifier", "sklearn",
            "--seeds", "1111", "1112", "--data-root", str(shared_data), "--output-dir",
            str(out), "--cache-dir", str(tmp_path / "c"), "--no-progress"]
    assert main(argv) == 0
    saved = json.loads((out / "results.json").read_text())
    assert sorted((c["kfold"], c["seed"]) for c in saved["computed"]) == [
        (2, 1111), (2, 1112), (3, 1111), (3, 1112)]
    folds = {(r["cell"]["kfold"], r["cell"]["seed"]): len(r["task"]["fold_acc"])
             for r in saved["runs"]}
    assert folds == {(2, 1111): 2, (2, 1112): 2, (3, 1111): 3, (3, 1112): 3}
    assert saved["summary_along"]["kfold"]["acc"][0]["values"].keys() == {"2", "3"}
    markdown = (out / "results.md").read_text()
    assert "| bow, kfold=2 | " in markdown and "| bow, kfold=3 | " in markdown
    assert main(argv) == 0  # the same command: every cell reused
    assert len(json.loads((out / "results.json").read_text())["reused"]) == 4
    capsys.readouterr()
