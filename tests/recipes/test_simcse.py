"""The simcse recipe end to end on a tiny RoBERTa, the real wiki sample and real STS data."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("sentence_transformers")

from adaptcl.recipes.simcse import SimCSERecipeConfig, run_simcse  # noqa: E402
from tests.adapters._tiny_models import build_tiny_model  # noqa: E402


def test_recipe_trains_each_loss_scores_sts_and_resumes(tmp_path, shared_data, monkeypatch):
    model = build_tiny_model(tmp_path / "tiny", "roberta")
    config = SimCSERecipeConfig(model=str(model), losses=["macl"], data_root=str(shared_data),
                                output_dir=str(tmp_path / "out"), max_sentences=24,
                                batch_size=8, eval_steps=3, max_seq_length=16, logging_steps=1,
                                sts_tasks=["STS12", "STSBenchmark"])
    result = run_simcse(config)
    assert result["num_sentences"] == 24
    rows = {row["loss"]: row for row in result["table"]}
    assert set(rows) == {"untrained", "macl"}
    assert -100 <= rows["macl"]["best dev"] <= 100
    for column in ("STS12", "STS-B", "Avg."):
        assert -100 <= rows["macl"][column] <= 100 and -100 <= rows["untrained"][column] <= 100
    macl_history = [h for h in result["runs"]["macl"]["history"] if "adaptcl/temperature" in h]
    assert macl_history and all(h["adaptcl/temperature"] >= 0.005 for h in macl_history)
    out = tmp_path / "out"
    assert json.loads((out / "simcse_results.json").read_text())["recipe"] == "simcse"
    assert "| macl |" in (out / "simcse_results.md").read_text()
    assert (out / "simcse_adaptive.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # rerun: every loss has its result file, so nothing is trained again
    import adaptcl.recipes.simcse as recipe

    def fail(*args, **kwargs):
        raise AssertionError("a finished loss was trained again")

    monkeypatch.setattr(recipe, "_train_one", fail)
    again = run_simcse(config)
    assert [r["loss"] for r in again["table"]] == ["untrained", "macl"]
    assert again["table"][1]["STS-B"] == rows["macl"]["STS-B"]


def test_config_validation():
    with pytest.raises(ValueError, match="losses"):
        SimCSERecipeConfig(losses=["simclr"])
    with pytest.raises(ValueError, match="pooler"):
        SimCSERecipeConfig(pooler="max")
    paper = SimCSERecipeConfig(paper="roberta")
    assert (paper.learning_rate, paper.batch_size, paper.max_sentences) == (1e-5, 64, None)
