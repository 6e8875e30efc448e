"""Training SimCSE with sentence-transformers' trainer (:func:`~adaptcl.adapters.sentence_transformers.train_simcse`):
the adapter's model, poolers and losses train, log their adaptive quantities and save a plain
model with the loss state next to it; a diverging run says at which step."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("sentence_transformers")

from adaptcl.adapters.sentence_transformers import (  # noqa: E402
    SimCSEConfig,
    build_simcse_model,
    make_loss,
    supervised_dataset,
    train_simcse,
    training_projection,
    unsupervised_dataset,
)
from tests.adapters._tiny_models import CORPUS  # noqa: E402


@pytest.mark.parametrize("loss_name,pooler", [("macl", "cls"), ("ascl", "avg"), ("infonce", "cls")])
def test_unsupervised_simcse_trains_and_saves_a_plain_model(tmp_path, tiny_roberta, loss_name, pooler):
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = build_simcse_model(str(tiny_roberta), pooler, max_seq_length=16)
    loss = make_loss(loss_name, model, projection=training_projection(pooler, model))
    before = [p.detach().clone() for p in model.parameters()]
    result = train_simcse(model, unsupervised_dataset(CORPUS * 2), loss,
                          SimCSEConfig(output_dir=str(tmp_path), batch_size=4, max_steps=3,
                                       logging_steps=1))
    assert result["global_step"] == 3 and result["finite"]
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    logged = [h for h in result["history"] if "adaptcl/temperature" in h]
    assert logged, "the adaptive quantities reach the trainer's logs"
    reloaded = SentenceTransformer(result["final_model"])
    # the training MLP is not part of the saved model: the saved model is Transformer + Pooling
    assert len(reloaded) == 2
    torch.testing.assert_close(reloaded.encode(CORPUS[:2], convert_to_tensor=True),
                               model.encode(CORPUS[:2], convert_to_tensor=True))
    card = (tmp_path / "final" / "README.md").read_text(encoding="utf-8")
    assert type(loss).__name__ in card
    if loss_name == "macl":
        assert '"alpha": 2.0' in card and "huang2023macl" in card


@pytest.mark.parametrize("progress", [False, True])
def test_no_progress_draws_not_even_the_model_cards_bar(tmp_path, tiny_bert, capfd, progress):
    model = build_simcse_model(str(tiny_bert), "cls", max_seq_length=16)
    loss = make_loss("infonce", model, projection=training_projection("cls", model))
    train_simcse(model, unsupervised_dataset(CORPUS), loss,
                 SimCSEConfig(output_dir=str(tmp_path), batch_size=4, max_steps=1,
                              logging_steps=1), progress=progress)
    err = capfd.readouterr().err
    assert ("Computing widget examples" in err) is progress, err  # the bar is the card's own
    assert model.model_card_data.widget  # the card's examples computed all the same


def test_supervised_simcse_with_hard_negatives(tmp_path, tiny_bert):
    model = build_simcse_model(str(tiny_bert), "cls", max_seq_length=16)
    training_projection("cls", model, keep_mlp=True)  # supervised SimCSE keeps its MLP
    loss = make_loss("macl", model)
    triplets = [(CORPUS[i], CORPUS[i].replace(".", "!"), CORPUS[(i + 3) % 8]) for i in range(8)]
    result = train_simcse(model, supervised_dataset(triplets), loss,
                          SimCSEConfig(output_dir=str(tmp_path), batch_size=4, max_steps=2))
    assert result["finite"] and result["global_step"] == 2
    assert len(model) == 3  # Transformer, Pooling, Dense (the kept MLP)


def test_amcl_state_is_trained_saved_and_restored(tmp_path, tiny_roberta):
    torch.manual_seed(0)
    model = build_simcse_model(str(tiny_roberta), "cls_before_pooler", max_seq_length=16)
    loss = make_loss("amcl", model, num_heads=2, projection_dim=8)
    start = {k: v.clone() for k, v in loss.loss_state_dict().items()}
    result = train_simcse(model, unsupervised_dataset(CORPUS * 2), loss,
                          SimCSEConfig(output_dir=str(tmp_path), batch_size=4, max_steps=3,
                                       learning_rate=1e-2))
    trained = loss.loss_state_dict()
    assert any(not torch.equal(start[k], trained[k]) for k in start if "phi" in k), \
        "the trainer optimises the temperature network"
    fresh = make_loss("amcl", build_simcse_model(str(tiny_roberta), "cls_before_pooler"),
                      num_heads=2, projection_dim=8)
    fresh.load_loss_state(result["final_model"])
    for k, v in trained.items():
        torch.testing.assert_close(fresh.loss_state_dict()[k], v)
    with pytest.raises(FileNotFoundError):
        fresh.load_loss_state(tmp_path / "nowhere")


def test_train_simcse_validates_the_data_before_writing_anything(tmp_path, tiny_roberta):
    from datasets import Dataset

    model = build_simcse_model(str(tiny_roberta), "avg", max_seq_length=16)
    loss = make_loss("macl", model)
    config = SimCSEConfig(output_dir=str(tmp_path / "out"), batch_size=4, max_steps=1)
    with pytest.raises(ValueError, match="at least two text columns"):
        train_simcse(model, Dataset.from_dict({"anchor": CORPUS}), loss, config)
    with pytest.raises(ValueError, match="column 'positive' row 1 is empty"):
        train_simcse(model, Dataset.from_dict({"anchor": CORPUS[:3], "positive": ["a", " ", "b"]}),
                     loss, config)
    assert not (tmp_path / "out").exists(), "nothing is written before the input is validated"


def _scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar curve TensorBoard's own event reader finds in ``log_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def test_extra_args_override_the_built_training_arguments(tmp_path, tiny_roberta):
    pytest.importorskip("tensorboard")
    model = build_simcse_model(str(tiny_roberta), "avg", max_seq_length=16)
    loss = make_loss("macl", model)
    # report_to and use_cpu are set by train_simcse too: passing them once used to be a TypeError
    result = train_simcse(model, unsupervised_dataset(CORPUS * 2), loss,
                          SimCSEConfig(output_dir=str(tmp_path), batch_size=4, max_steps=2,
                                       logging_steps=1,
                                       extra_args={"report_to": ["tensorboard"], "use_cpu": True}))
    assert result["global_step"] == 2
    (run,) = (tmp_path / "checkpoints" / "runs").iterdir()  # transformers' default log folder
    assert [step for step, _ in _scalars(run)["train/loss"]] == [1, 2]


def test_tensorboard_dir_gets_the_loss_and_adaptive_curves_through_the_trainer(tmp_path,
                                                                              tiny_roberta):
    pytest.importorskip("tensorboard")
    model = build_simcse_model(str(tiny_roberta), "avg", max_seq_length=16)
    loss = make_loss("macl", model)
    result = train_simcse(model, unsupervised_dataset(CORPUS * 2), loss,
                          SimCSEConfig(output_dir=str(tmp_path / "out"), batch_size=4,
                                       max_steps=3, logging_steps=1),
                          tensorboard_dir=tmp_path / "tb")
    curves = _scalars(tmp_path / "tb")
    logged = [h for h in result["history"] if "loss" in h]
    assert [v for _, v in curves["train/loss"]] == pytest.approx([h["loss"] for h in logged])
    temperature = curves["train/adaptcl/temperature"]
    assert [s for s, _ in temperature] == [1, 2, 3]
    assert [v for _, v in temperature] == pytest.approx(
        [h["adaptcl/temperature"] for h in logged], rel=1e-6)
    assert "train/adaptcl/alignment" in curves
    assert not (tmp_path / "out" / "checkpoints" / "runs").exists()  # only where it was asked


def test_a_run_that_diverges_raises_non_finite_naming_the_step_and_saves_nothing(tmp_path,
                                                                                tiny_bert):
    from adaptcl.plugins.validation import NonFiniteError

    model = build_simcse_model(str(tiny_bert), "cls", max_seq_length=16)
    loss = make_loss("macl", model, projection=training_projection("cls", model))
    with pytest.raises(NonFiniteError, match=r"at step \d+; the last logged loss was ") as err:
        train_simcse(model, unsupervised_dataset(CORPUS * 3), loss,
                     SimCSEConfig(output_dir=str(tmp_path), batch_size=8, max_steps=3,
                                  learning_rate=1e12, logging_steps=1))
    assert err.value.step >= 2  # the first step is finite; a later one meets NaN weights
    # the step that met NaN computed no loss; the one logged before it is named, and earlier
    assert err.value.loss is None
    logged_step = int(str(err.value).rsplit(" at step ", 1)[1])
    assert f"at step {err.value.step}; " in str(err.value) and logged_step < err.value.step
    assert not (tmp_path / "final").exists()
