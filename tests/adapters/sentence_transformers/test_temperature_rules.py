"""The temperature rules as sentence-transformers losses: MultipleNegativesRankingLoss at their
neutral settings; the schedule driven by the trainer's step (the loss alone, the callback with
gradient accumulation, our trainer, a resumed run); the learned temperature optimised by
``SentenceTransformerTrainer`` and saved/restored with the loss state; ``make_loss`` by name."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("sentence_transformers")

from sentence_transformers.sentence_transformer.losses import (  # noqa: E402
    MultipleNegativesRankingLoss,
)
from transformers import TrainerCallback  # noqa: E402

from adaptcl.adapters import sentence_transformers as st_losses  # noqa: E402
from adaptcl.adapters.sentence_transformers import build_simcse_model, make_loss  # noqa: E402
from adaptcl.plugins import cosine_temperature  # noqa: E402
from tests.adapters._tiny_models import CORPUS  # noqa: E402

PERIOD = 6


def _embeddings(n=8, d=16, columns=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, d, generator=g, requires_grad=True) for _ in range(columns)]


def _assert_same_loss_and_grads(ours, theirs, embs):
    a = ours.compute_loss_from_embeddings(embs, None)
    b = theirs.compute_loss_from_embeddings(embs, None)
    torch.testing.assert_close(a, b)
    for ga, gb in zip(torch.autograd.grad(a, embs), torch.autograd.grad(b, embs), strict=True):
        torch.testing.assert_close(ga, gb)


def test_neutral_settings_are_multiple_negatives_ranking_loss():
    embs = _embeddings()
    schedule = st_losses.TemperatureScheduleLoss(None, min_temperature=0.05, max_temperature=0.05)
    schedule.step = 17
    _assert_same_loss_and_grads(schedule, MultipleNegativesRankingLoss(None, scale=20.0), embs)
    learned = st_losses.LearnableTemperatureLoss(None, 20.0)  # scale 20 = temperature 0.05
    _assert_same_loss_and_grads(learned, MultipleNegativesRankingLoss(None, scale=learned.scale),
                                embs)
    assert learned.scale == pytest.approx(20.0, rel=1e-6)
    with pytest.raises(AttributeError):
        learned.scale = 10.0  # learned, not set
    with pytest.raises(TypeError, match="TemperatureScheduleLoss has no single scale"):
        st_losses.TemperatureScheduleLoss(None, 20.0)


class _Probe(TrainerCallback):
    """The temperature each optimisation step used (the loss's last forward of the step)."""

    def __init__(self, loss) -> None:
        self.loss, self.taus = loss, []

    def on_step_end(self, args, state, control, **kwargs):
        self.taus.append(float(self.loss.last_stats["temperature"]))
        return control


class _StopAfter(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step
        return control


def _run(path, output_dir, loss_name, *, steps=4, accumulation=1, callback=True,
         trainer_cls=None, extra_callbacks=(), resume=None, **loss_kwargs):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer.training_args import (
        SentenceTransformerTrainingArguments,
    )

    torch.manual_seed(0)
    model = build_simcse_model(str(path), "avg", max_seq_length=16)
    loss = make_loss(loss_name, model, **loss_kwargs)
    probe = _Probe(loss)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=4, max_steps=steps,
        gradient_accumulation_steps=accumulation, learning_rate=1e-2, save_strategy="steps",
        save_steps=1, report_to="none", use_cpu=True, disable_tqdm=True, seed=0)
    pairs = Dataset.from_dict({"anchor": CORPUS, "positive": [s.replace(" .", " !") for s in CORPUS]})
    callbacks = [st_losses.LossStateCallback(loss)] if callback else []
    trainer = (trainer_cls or SentenceTransformerTrainer)(
        model=model, args=args, train_dataset=pairs, loss=loss,
        callbacks=[*callbacks, probe, *extra_callbacks])
    trainer.train(resume_from_checkpoint=resume)
    return loss, probe.taus


def _schedule(steps):
    return [cosine_temperature(k, 0.05, 0.5, PERIOD) for k in steps]


SCHEDULE = {"temperature": 0.05, "max_temperature": 0.5, "period": PERIOD}


def test_the_loss_alone_counts_the_trainers_steps(tmp_path, tiny_bert):
    """Passed alone to SentenceTransformerTrainer (which tells a loss nothing of its step), the
    schedule counts its training forward passes: the trainer's steps without accumulation."""
    loss, taus = _run(tiny_bert, tmp_path, "temperature_schedule", callback=False, **SCHEDULE)
    assert taus == pytest.approx(_schedule(range(4)), rel=1e-6)
    assert loss.step == 4 and not loss.core.driven


def test_the_callback_drives_it_with_the_global_step_under_gradient_accumulation(tmp_path, tiny_bert):
    loss, taus = _run(tiny_bert, tmp_path, "temperature_schedule", steps=3, accumulation=2,
                      **SCHEDULE)
    assert taus == pytest.approx(_schedule(range(3)), rel=1e-6)  # one tau per optimiser step
    assert loss.core.driven


def test_our_trainer_drives_it_and_a_resumed_run_continues_the_schedule(tmp_path, tiny_bert):
    from adaptcl.adapters.sentence_transformers import AdaptiveSentenceTransformerTrainer

    # without the callback, with gradient accumulation (where counting forwards would not do)
    _, whole = _run(tiny_bert, tmp_path / "whole", "temperature_schedule", steps=3,
                    accumulation=2, callback=False,
                    trainer_cls=AdaptiveSentenceTransformerTrainer, **SCHEDULE)
    assert whole == pytest.approx(_schedule(range(3)), rel=1e-6)
    # interrupted after 2 steps, resumed in a new process (a fresh loss at step 0)
    _run(tiny_bert, tmp_path / "cut", "temperature_schedule", extra_callbacks=[_StopAfter(2)],
         **SCHEDULE)
    saved = torch.load(tmp_path / "cut" / "checkpoint-2" / st_losses.LOSS_STATE_FILE,
                       weights_only=True)["state"]
    assert list(saved) == ["core._extra_state"]
    assert saved["core._extra_state"].item() == 1  # the step of the last step taken
    loss, resumed = _run(tiny_bert, tmp_path / "cut", "temperature_schedule", resume=True,
                         **SCHEDULE)
    assert resumed == pytest.approx(_schedule(range(2, 4)), rel=1e-6)
    assert loss.step == 3


def test_the_learned_temperature_is_optimised_saved_and_restored(tmp_path, tiny_bert):
    loss, taus = _run(tiny_bert, tmp_path / "whole", "learnable_temperature", temperature=0.1)
    assert taus[0] == pytest.approx(0.1, rel=1e-6) and len(set(taus)) == len(taus)  # it trains
    assert loss.logit_scale.item() != pytest.approx(math.log(10.0))
    state = loss.loss_state_dict()
    assert list(state) == ["core.logit_scale"]
    loss.save_loss_state(tmp_path / "saved")
    fresh = make_loss("learnable_temperature", loss.model, temperature=0.3)
    fresh.load_loss_state(tmp_path / "saved")
    assert fresh.logit_scale.item() == loss.logit_scale.item()

    # a resumed trainer restores s from the checkpoint (the callback), and ends where the
    # uninterrupted run did
    _run(tiny_bert, tmp_path / "cut", "learnable_temperature", temperature=0.1,
         extra_callbacks=[_StopAfter(2)])
    s = torch.load(tmp_path / "cut" / "checkpoint-2" / st_losses.LOSS_STATE_FILE,
                   weights_only=True)["state"]["core.logit_scale"]
    resumed, resumed_taus = _run(tiny_bert, tmp_path / "cut", "learnable_temperature",
                                 temperature=0.3, resume=True)
    assert resumed_taus[0] == pytest.approx(math.exp(-float(s)), rel=1e-6)
    torch.testing.assert_close(resumed.logit_scale, loss.logit_scale)


def test_make_loss_builds_both_rules_with_the_papers_settings(tiny_bert):
    from adaptcl.adapters.sentence_transformers import LOSSES

    assert {"temperature_schedule", "learnable_temperature"} <= set(LOSSES)
    model = build_simcse_model(str(tiny_bert), "cls_before_pooler", max_seq_length=16)
    schedule = make_loss("temperature_schedule", model)
    assert type(schedule) is st_losses.TemperatureScheduleLoss
    assert schedule.get_config_dict()["min_temperature"] == 0.05  # SimCSE's temperature
    assert (schedule.core.max_temperature, schedule.core.period) == (1.0, 400)  # the authors'
    assert "Temperature Schedules" in schedule.citation
    learned = make_loss("learnable_temperature", model)
    assert type(learned) is st_losses.LearnableTemperatureLoss
    assert learned.get_config_dict()["initial_temperature"] == 0.05
    assert (learned.core.min_temperature, learned.core.max_temperature) == (0.01, 1.0)
    assert "Learning Transferable Visual Models" in learned.citation
    assert [n for n, _ in learned.named_parameters() if not n.startswith("model.")] == \
        ["core.logit_scale"]
