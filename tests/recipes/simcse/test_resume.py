"""An interrupted ``simcse`` cell resumes from its last complete checkpoint (model, optimiser,
scheduler, RNG, the loss's own state, the best-checkpoint tracking) and ends where an
uninterrupted run of the same settings does; a damaged checkpoint is set aside, a run folder of
other settings is removed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("sentence_transformers")

import adaptcl.adapters.sentence_transformers.simcse as adapter  # noqa: E402
from adaptcl.recipes.simcse.config import SimCSERecipeConfig  # noqa: E402
from adaptcl.recipes.simcse.recipe import SimCSERecipe  # noqa: E402

# 24 sentences at batch 8: 3 steps, an STS-B dev score and a checkpoint after each
SETTINGS = dict(max_sentences=24, batch_size=8, eval_steps=1, max_seq_length=16, logging_steps=1,
                sts=False, baseline=False, progress=False, threads=1, device="cpu")
TIMING = ("runtime", "per_second")  # what the clock, not the training, decides
POOLER = {"macl": "cls", "amcl": "cls_before_pooler"}  # the loss state: SimCSE's MLP, AMCL's heads


def _config(model, shared_data, out, loss, **overrides):
    return SimCSERecipeConfig(model=str(model), data_root=str(shared_data), output_dir=str(out),
                              losses=[loss], pooler=POOLER[loss], **{**SETTINGS, **overrides})


@pytest.fixture(scope="module")
def uninterrupted(tiny_bert, shared_data, tmp_path_factory):
    """The outcome of each loss's run without interruption (computed once per module)."""
    outcomes = {}

    def outcome(loss):
        if loss not in outcomes:
            out = tmp_path_factory.mktemp(f"whole-{loss}")
            SimCSERecipe(_config(tiny_bert, shared_data, out, loss)).run()
            outcomes[loss] = _outcome(out, loss)
            assert outcomes[loss][0]["optimisation_steps"] == 3 and outcomes[loss][2]
        return outcomes[loss]

    return outcome


def _interrupt_after(monkeypatch, step, *, while_saving=False):
    """A kill once checkpoint-``step`` is written (the next training step raises), or
    ``while_saving`` it: after the model's weights, before the RNG and trainer states."""
    base = adapter.AdaptiveSentenceTransformerTrainer

    class Killed(base):
        def training_step(self, *args, **kwargs):
            if self.state.global_step == step:
                raise KeyboardInterrupt
            return super().training_step(*args, **kwargs)

        def _save_rng_state(self, output_dir):
            if while_saving and self.state.global_step == step:
                raise KeyboardInterrupt
            return super()._save_rng_state(output_dir)

    monkeypatch.setattr(adapter, "AdaptiveSentenceTransformerTrainer", Killed)


def _interrupted(config, monkeypatch, step=2, **kill):
    """Run ``config`` until it is killed after (or while saving) checkpoint-``step``; that
    checkpoint's folder."""
    with monkeypatch.context() as patch:
        _interrupt_after(patch, step, **kill)
        with pytest.raises(KeyboardInterrupt):
            SimCSERecipe(config).run()
    (loss,) = config.losses
    return (Path(config.output_dir) / "models" / "wiki" / loss / "seed42" / "checkpoints"
            / f"checkpoint-{step}")


def _outcome(out, loss):
    """What the run ends with: its record (timings aside), the final model's weights and the
    loss's own state saved next to it."""
    from safetensors.torch import load_file

    stored = json.loads((out / "runs" / "wiki" / loss / "seed42.json").read_text())["record"]
    record = {k: v for k, v in stored.items()
              if k not in ("train_seconds", "final_model", "best_checkpoint")}
    record["history"] = [{k: v for k, v in h.items() if not any(t in k for t in TIMING)}
                         for h in record["history"]]
    final = out / "models" / "wiki" / loss / "seed42" / "final"
    weights = load_file(next(final.rglob("model.safetensors")))
    state = torch.load(final / "adaptcl_loss_state.pt", weights_only=True)["state"]
    return record, weights, state


def _assert_same_outcome(got, expected):
    assert got[0] == expected[0]
    for part in (1, 2):
        assert got[part].keys() == expected[part].keys()
        for name, value in expected[part].items():
            torch.testing.assert_close(got[part][name], value, rtol=0, atol=0, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["macl", "amcl"])
def test_interrupted_cell_resumes_from_its_last_checkpoint_and_ends_as_an_uninterrupted_one(
        tiny_bert, shared_data, tmp_path, monkeypatch, capsys, uninterrupted, loss):
    config = _config(tiny_bert, shared_data, tmp_path, loss)
    checkpoint = _interrupted(config, monkeypatch)
    assert (checkpoint / "adaptcl_loss_state.pt").is_file()
    capsys.readouterr()
    resumed = SimCSERecipe(config).run()
    assert resumed["computed"] == [{"dataset": "wiki", "method": loss, "seed": 42}]
    assert f"adaptcl: wiki/{loss}/seed42 resumes from {checkpoint}\n" in capsys.readouterr().err
    _assert_same_outcome(_outcome(tmp_path, loss), uninterrupted(loss))


def _truncate_optimizer(checkpoint):
    optimizer = checkpoint / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:1000])  # a disk that filled up


@pytest.mark.slow
@pytest.mark.parametrize("kill, damage, reason, resumes_from", [
    ({"while_saving": True}, None, "no trainer_state.json: the save was cut short", 1),
    ({}, _truncate_optimizer, "optimizer.pt: ", "as kept"),
], ids=["cut_short", "truncated"])
def test_a_damaged_checkpoint_is_set_aside_and_the_run_still_ends_as_an_uninterrupted_one(
        tiny_bert, shared_data, tmp_path, monkeypatch, capsys, uninterrupted, kill, damage,
        reason, resumes_from):
    """A checkpoint that cannot be resumed whole is named on stderr, kept aside next to the
    trainer's folder, and the run resumes from the one before it (or starts again)."""
    config = _config(tiny_bert, shared_data, tmp_path, "macl")
    checkpoint = _interrupted(config, monkeypatch, **kill)
    if damage is not None:
        damage(checkpoint)
    if resumes_from == "as kept":
        # save_total_limit=1 keeps the last checkpoint, and transformers 5.24 also protects the
        # best one (checkpoint-1 when it scored best; older releases deleted it): the run
        # resumes from checkpoint-1 where it is still there, else starts again
        kept = checkpoint.parent / "checkpoint-1"
        resumes_from = 1 if kept.is_dir() else None
    assert sorted(p.name for p in checkpoint.parent.glob("checkpoint-*")) == (
        ["checkpoint-1", "checkpoint-2"] if resumes_from else ["checkpoint-2"])
    capsys.readouterr()
    SimCSERecipe(config).run()
    err = capsys.readouterr().err
    aside = checkpoint.parent.parent / "checkpoint-2.corrupt"
    assert (f"adaptcl: checkpoint at {checkpoint} is corrupt or truncated "
            f"(IncompleteCheckpointError: {reason}") in err
    assert f"kept aside as {aside} and passed over\n" in err and aside.is_dir()
    earlier = checkpoint.with_name(f"checkpoint-{resumes_from}")
    assert (f"adaptcl: wiki/macl/seed42 resumes from {earlier}\n" in err) == bool(resumes_from)
    assert ("resumes from" in err) == bool(resumes_from)
    _assert_same_outcome(_outcome(tmp_path, "macl"), uninterrupted("macl"))


@pytest.mark.slow
def test_a_run_folder_of_other_settings_is_removed_not_resumed(tiny_bert, shared_data, tmp_path,
                                                               monkeypatch, capsys):
    checkpoint = _interrupted(_config(tiny_bert, shared_data, tmp_path, "macl"), monkeypatch)
    run = checkpoint.parent.parent
    (run / "left-behind").write_text("a file of the interrupted run")
    capsys.readouterr()
    changed = SimCSERecipe(_config(tiny_bert, shared_data, tmp_path, "macl",
                                   learning_rate=1e-3)).run()
    assert "resumes from" not in capsys.readouterr().err
    assert not (run / "left-behind").exists()
    assert changed["runs"][0]["optimisation_steps"] == 3
    stored = json.loads((tmp_path / "runs" / "wiki" / "macl" / "seed42.json").read_text())
    assert json.loads((run / "identity.json").read_text()) == {
        "identity_hash": stored["identity_hash"]}
