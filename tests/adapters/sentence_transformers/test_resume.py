"""Resuming ``SentenceTransformerTrainer`` with a loss that has its own trainable state (AMCL's
heads and temperature network): :class:`LossStateCallback` loads the state of the checkpoint
being resumed and no other, and without the callback a resumed step refuses to train on from
fresh heads."""

from __future__ import annotations

import shutil

import pytest
import torch

pytest.importorskip("sentence_transformers")

from transformers import TrainerCallback  # noqa: E402

from adaptcl.adapters import sentence_transformers as st_losses  # noqa: E402
from adaptcl.adapters.sentence_transformers import build_simcse_model  # noqa: E402
from tests.adapters._tiny_models import CORPUS  # noqa: E402


class _StopAfter(TrainerCallback):
    """An interruption: training stops after ``step`` (its checkpoint written)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step
        return control


class _LossStateAtFirstStep(TrainerCallback):
    def __init__(self, loss) -> None:
        self.loss, self.state = loss, None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.state is None:
            self.state = {k: v.clone() for k, v in self.loss.loss_state_dict().items()}
        return control


def _amcl_run(path, output_dir, *, seed, callbacks=(), resume=None, with_callback=True,
              mini_batch_size=None, evaluator=None, **extra_args):
    """AMCL through the plain SentenceTransformerTrainer: 2 steps at batch 4, a checkpoint every
    step; ``seed`` initialises the loss's heads (another seed: another run's heads)."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer.training_args import (
        SentenceTransformerTrainingArguments,
    )

    model = build_simcse_model(str(path), "avg", max_seq_length=16)
    torch.manual_seed(seed)  # the loss's heads and temperature network
    loss = st_losses.AMCLLoss(model, num_heads=2, projection_dim=8, mini_batch_size=mini_batch_size)
    probe = _LossStateAtFirstStep(loss)
    evaluation = dict(eval_strategy="steps", eval_steps=1, load_best_model_at_end=True,
                      metric_for_best_model=evaluator.primary_metric) if evaluator else {}
    args = SentenceTransformerTrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=4, max_steps=2, learning_rate=1e-2,
        save_strategy="steps", save_steps=1, report_to="none", use_cpu=True, disable_tqdm=True,
        seed=0, **evaluation, **extra_args)
    pairs = Dataset.from_dict({"anchor": CORPUS, "positive": [s.replace(" .", " !") for s in CORPUS]})
    own = [st_losses.LossStateCallback(loss)] if with_callback else []
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=pairs, loss=loss,
                                         evaluator=evaluator, callbacks=[*own, probe, *callbacks])
    trainer.train(resume_from_checkpoint=resume)
    return model, loss, probe.state


def _saved(checkpoint):
    return torch.load(checkpoint / st_losses.LOSS_STATE_FILE, weights_only=True)["state"]


def _assert_same_state(got, expected):
    assert got.keys() == expected.keys() and any("heads" in k for k in expected)
    for k, v in expected.items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=0, msg=k)


def _assert_same_run(model, loss, reference_model, reference_loss):
    for k, v in reference_loss.loss_state_dict().items():
        torch.testing.assert_close(loss.loss_state_dict()[k], v, msg=k)
    for (name, a), b in zip(reference_model.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(b, a, msg=name)


def test_amcl_heads_restored_when_trainer_resumes(tmp_path, tiny_bert):
    """``train(resume_from_checkpoint=True)`` restores AMCL's heads and temperature network from
    the checkpoint (they are not part of the model), and the resumed run ends where an
    uninterrupted one does."""
    model, loss, _ = _amcl_run(tiny_bert, tmp_path / "whole", seed=0)
    _amcl_run(tiny_bert, tmp_path / "cut", seed=0, callbacks=[_StopAfter(1)])
    saved = _saved(tmp_path / "cut" / "checkpoint-1")
    # resumed in a new process: fresh heads (another seed), the trainer restores the rest
    resumed_model, resumed_loss, at_resume = _amcl_run(tiny_bert, tmp_path / "cut", seed=1, resume=True)
    _assert_same_state(at_resume, saved)
    _assert_same_run(resumed_model, resumed_loss, model, loss)


def test_resume_loads_the_resumed_checkpoints_state_not_the_one_in_output_dir(tmp_path, tiny_bert):
    """``train(resume_from_checkpoint="<run a>/checkpoint-1")`` while ``output_dir`` holds a
    ``checkpoint-1`` of another run: the loss state is run a's (the trainer state loaded from the
    checkpoint records which), and the run ends where run a uninterrupted does."""
    model, loss, _ = _amcl_run(tiny_bert, tmp_path / "whole", seed=0)
    _amcl_run(tiny_bert, tmp_path / "a", seed=0, callbacks=[_StopAfter(1)])
    _amcl_run(tiny_bert, tmp_path / "b", seed=1, callbacks=[_StopAfter(1)])
    saved, other = _saved(tmp_path / "a" / "checkpoint-1"), _saved(tmp_path / "b" / "checkpoint-1")
    assert any(not torch.equal(saved[k], other[k]) for k in saved), "two runs, two states"
    resumed_model, resumed_loss, at_resume = _amcl_run(
        tiny_bert, tmp_path / "b", seed=2, resume=str(tmp_path / "a" / "checkpoint-1"))
    _assert_same_state(at_resume, saved)
    _assert_same_run(resumed_model, resumed_loss, model, loss)


def test_a_checkpoint_whose_loss_state_cannot_be_found_is_one_clear_error(tmp_path, tiny_bert):
    """Never another checkpoint's state: when the loss state recorded for the checkpoint being
    resumed is nowhere the callback can look (a checkpoint moved away from where it was written,
    ``output_dir`` holding another run's ``checkpoint-1``; a deleted state file), resuming fails
    with one line; ``TrainingArguments(resume_from_checkpoint=...)`` names a moved checkpoint."""
    _amcl_run(tiny_bert, tmp_path / "a", seed=0, callbacks=[_StopAfter(1)])
    _amcl_run(tiny_bert, tmp_path / "b", seed=1, callbacks=[_StopAfter(1)])
    moved = tmp_path / "moved" / "checkpoint-1"
    shutil.copytree(tmp_path / "a" / "checkpoint-1", moved)
    shutil.rmtree(tmp_path / "a")
    with pytest.raises(FileNotFoundError) as caught:
        _amcl_run(tiny_bert, tmp_path / "b", seed=2, resume=str(moved))
    message = str(caught.value)
    assert "\n" not in message and "resumes at step 1" in message
    assert "TrainingArguments(resume_from_checkpoint=" in message and "checkpoint-1" in message
    _, _, at_resume = _amcl_run(tiny_bert, tmp_path / "b", seed=2, resume=str(moved),
                                resume_from_checkpoint=str(moved))
    _assert_same_state(at_resume, _saved(moved))

    (moved / st_losses.LOSS_STATE_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=r"resumes at step 1 .*adaptcl_loss_state\.pt"):
        _amcl_run(tiny_bert, tmp_path / "moved", seed=0, resume=True)


def test_a_checkpoint_written_without_the_callback_cannot_be_resumed_with_it(tmp_path, tiny_bert):
    _amcl_run(tiny_bert, tmp_path / "run", seed=0, callbacks=[_StopAfter(1)], with_callback=False)
    assert not (tmp_path / "run" / "checkpoint-1" / st_losses.LOSS_STATE_FILE).exists()
    with pytest.raises(FileNotFoundError, match=r"resumes at step 1 from a checkpoint written "
                                                r"without LossStateCallback"):
        _amcl_run(tiny_bert, tmp_path / "run", seed=0, resume=True)


@pytest.mark.parametrize("mini_batch_size", [None, 2], ids=["one_pass", "gradient_cache"])
def test_resumed_step_with_fresh_heads_raises_without_the_callback(tmp_path, tiny_bert,
                                                                   mini_batch_size):
    """Without ``LossStateCallback`` the trainer restores the model, optimiser and scheduler but
    not the heads: the first resumed step raises, naming the callback, instead of training on
    from fresh heads. Training from scratch without the callback is not affected."""
    _amcl_run(tiny_bert, tmp_path / "run", seed=0, callbacks=[_StopAfter(1)],
              mini_batch_size=mini_batch_size)
    with pytest.raises(RuntimeError, match=r"^AMCLLoss: the model's weights were loaded .* "
                                           r"callbacks=\[LossStateCallback\(loss\)\]"):
        _amcl_run(tiny_bert, tmp_path / "run", seed=1, resume=True, with_callback=False,
                  mini_batch_size=mini_batch_size)
    _amcl_run(tiny_bert, tmp_path / "fresh", seed=0, with_callback=False,
              mini_batch_size=mini_batch_size)


def test_resumed_run_with_gradient_caching_ends_where_the_uninterrupted_one_does(tmp_path, tiny_bert):
    model, loss, _ = _amcl_run(tiny_bert, tmp_path / "whole", seed=0, mini_batch_size=2)
    _amcl_run(tiny_bert, tmp_path / "cut", seed=0, callbacks=[_StopAfter(1)], mini_batch_size=2)
    resumed_model, resumed_loss, at_resume = _amcl_run(tiny_bert, tmp_path / "cut", seed=1,
                                                       resume=True, mini_batch_size=2)
    _assert_same_state(at_resume, _saved(tmp_path / "cut" / "checkpoint-1"))
    _assert_same_run(resumed_model, resumed_loss, model, loss)


class _ScriptedScore:
    """An evaluator whose score is scripted per call: the best checkpoint is chosen by the test."""

    def __init__(self, scores) -> None:
        from sentence_transformers.sentence_transformer.evaluation import SentenceEvaluator

        class Scripted(SentenceEvaluator):
            def __init__(self) -> None:
                super().__init__()
                self.primary_metric, self.calls = "score", 0

            def __call__(self, model, output_path=None, epoch=-1, steps=-1):
                self.calls += 1
                return {"score": scores[self.calls - 1]}

        self.evaluator = Scripted()


def test_load_best_model_at_end_brings_the_best_checkpoints_loss_state(tmp_path, tiny_bert):
    """The trainer reloads the best checkpoint's model at the end: the loss state (in memory and
    in ``output_dir``) is that checkpoint's too, not the last step's."""
    evaluator = _ScriptedScore([1.0, 0.0]).evaluator  # step 1 is the best
    _, loss, _ = _amcl_run(tiny_bert, tmp_path / "run", seed=0, evaluator=evaluator)
    best, last = _saved(tmp_path / "run" / "checkpoint-1"), _saved(tmp_path / "run" / "checkpoint-2")
    assert any(not torch.equal(best[k], last[k]) for k in best)
    _assert_same_state(loss.loss_state_dict(), best)
    _assert_same_state(_saved(tmp_path / "run"), best)


def test_restoring_callback_states_is_refused_in_one_line(tmp_path, tiny_bert):
    """``restore_callback_states_from_checkpoint=True`` rebuilds callbacks from JSON, without the
    loss: refused with a clear message rather than a bare ``TypeError``."""
    _amcl_run(tiny_bert, tmp_path / "run", seed=0, callbacks=[_StopAfter(1)])
    with pytest.raises(TypeError, match="restore_callback_states_from_checkpoint"):
        _amcl_run(tiny_bert, tmp_path / "run", seed=0, resume=True,
                  restore_callback_states_from_checkpoint=True)


def test_the_watched_model_still_copies_and_saves(tmp_path, tiny_bert):
    """The loss watches its model's ``load_state_dict``; a copy or a saved and reloaded model
    carries no tie to the loss, and loading the copy does not concern it."""
    import copy

    model = build_simcse_model(str(tiny_bert), "avg", max_seq_length=16)
    loss = st_losses.AMCLLoss(model, num_heads=2, projection_dim=8)
    twin = copy.deepcopy(model)
    torch.save(model, tmp_path / "model.pt")
    reloaded = torch.load(tmp_path / "model.pt", weights_only=False)
    twin.load_state_dict(model.state_dict())
    reloaded.load_state_dict(model.state_dict())
    features = [model.tokenize(CORPUS[:4]), model.tokenize(CORPUS[4:])]
    assert torch.isfinite(loss(features, None))  # its own model was not loaded
    model.load_state_dict(twin.state_dict())
    with pytest.raises(RuntimeError, match="LossStateCallback"):
        loss(features, None)
    loss.load_loss_state(loss.save_loss_state(tmp_path / "state").parent)
    assert torch.isfinite(loss(features, None))


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage, named", [
    (lambda c: (c / "trainer_state.json").unlink(), "no trainer_state.json"),
    (lambda c: _truncate(c / "trainer_state.json"), "trainer_state.json"),
    (lambda c: _truncate(c / "optimizer.pt"), "optimizer.pt"),
    (lambda c: _truncate(next(c.rglob("*.safetensors"))), ".safetensors"),
    (lambda c: (c / st_losses.LOSS_STATE_FILE).unlink(), "no adaptcl_loss_state.pt"),
    (lambda c: shutil.copy(c.parent / "checkpoint-1" / st_losses.LOSS_STATE_FILE, c),
     "adaptcl_loss_state.pt is not the loss state its trainer state records"),
], ids=["cut_short", "trainer_state", "optimizer", "weights", "no_loss_state", "other_loss_state"])
def test_last_complete_checkpoint_passes_over_a_damaged_newer_one(tmp_path, tiny_bert, damage, named):
    """A checkpoint a resume could not load whole (a save cut short, a truncated file, a missing
    or foreign loss state) is reported and passed over for the one before it."""
    _amcl_run(tiny_bert, tmp_path / "run", seed=0)
    assert st_losses.last_complete_checkpoint(tmp_path / "run") == tmp_path / "run" / "checkpoint-2"
    damage(tmp_path / "run" / "checkpoint-2")
    seen = []
    found = st_losses.last_complete_checkpoint(tmp_path / "run",
                                               on_incomplete=lambda c, e: seen.append((c, e)))
    assert found == tmp_path / "run" / "checkpoint-1"
    ((folder, error),) = seen
    assert folder == tmp_path / "run" / "checkpoint-2" and named in str(error)
    assert isinstance(error, st_losses.IncompleteCheckpointError)
    assert st_losses.last_complete_checkpoint(tmp_path / "nowhere") is None
