"""sentence-transformers losses: MNRL parity, trainer integration, model card, saved state."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("sentence_transformers")

from sentence_transformers.sentence_transformer.losses import (  # noqa: E402
    MultipleNegativesRankingLoss,
)

from adaptcl.adapters import sentence_transformers as st_losses  # noqa: E402
from adaptcl.adapters.simcse import (  # noqa: E402
    SimCSEConfig,
    build_simcse_model,
    make_loss,
    supervised_dataset,
    train_simcse,
    training_projection,
    unsupervised_dataset,
)

from ._tiny_models import CORPUS, build_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny_roberta(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-roberta"), "roberta")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-bert"), "bert")


def _embeddings(n=8, d=16, columns=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, d, generator=g, requires_grad=True) for _ in range(columns)]


def test_infonce_equals_multiple_negatives_ranking_loss():
    embs = _embeddings()
    theirs = MultipleNegativesRankingLoss(model=None, scale=20.0).compute_loss_from_embeddings(embs, None)
    ours_fn = st_losses.InfoNCELoss(None, temperature=0.05)
    ours = ours_fn.compute_loss_from_embeddings(embs, None)
    torch.testing.assert_close(ours, theirs)
    for a, b in zip(torch.autograd.grad(ours, embs), torch.autograd.grad(theirs, embs), strict=True):
        torch.testing.assert_close(a, b)
    assert ours_fn.temperature == pytest.approx(0.05)


def test_macl_defaults_are_the_simcse_setting_and_reduce_to_infonce():
    macl = st_losses.MACLLoss(None)
    cfg = macl.get_config_dict()
    assert (cfg["temperature"], cfg["alpha"], cfg["a0"], cfg["reweight"]) == (0.05, 2.0, 0.8, False)
    embs = _embeddings(columns=2)
    fixed = st_losses.MACLLoss(None, alpha=0.0).compute_loss_from_embeddings(embs, None)
    torch.testing.assert_close(fixed, st_losses.InfoNCELoss(None).compute_loss_from_embeddings(embs, None))
    assert "Model-Aware Contrastive Learning" in macl.citation
    with pytest.raises(ValueError, match="at least 2 columns"):
        macl.compute_loss_from_embeddings(embs[:1], None)


@pytest.mark.parametrize("pooler", ["cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2"])
def test_poolers_build_and_encode(tiny_roberta, pooler):
    model = build_simcse_model(str(tiny_roberta), pooler, max_seq_length=16)
    emb = model.encode(CORPUS[:3], convert_to_tensor=True)
    assert emb.shape == (3, 32) and torch.isfinite(emb).all()


def test_two_columns_get_different_dropout(tiny_roberta):
    model = build_simcse_model(str(tiny_roberta), "cls_before_pooler", dropout=0.3)
    model.train()
    feats = model.tokenize(CORPUS[:4])
    a = model(dict(feats))["sentence_embedding"]
    b = model(dict(feats))["sentence_embedding"]
    assert not torch.allclose(a, b)  # same sentences, independent dropout masks
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(dict(feats))["sentence_embedding"],
                                   model(dict(feats))["sentence_embedding"])


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


def test_bad_inputs_get_clear_errors(tmp_path, tiny_roberta):
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
    with pytest.raises(ValueError, match="triplet 1 has 2 fields"):
        supervised_dataset([("a", "b", "c"), ("a", "b")])
    with pytest.raises(ValueError, match="no non-empty sentences"):
        unsupervised_dataset(["", "  "])
    with pytest.raises(FileNotFoundError, match="neither a local model folder"):
        build_simcse_model(str(tmp_path / "no-such-model"))
    with pytest.raises(ValueError, match="same shape"):
        loss.compute_loss_from_embeddings([torch.randn(4, 32), torch.randn(3, 32)], None)
    with pytest.raises(ValueError, match="pooler"):
        build_simcse_model(str(tiny_roberta), "max")


def test_cls_pooling_needs_a_cls_token(tmp_path, tiny_bert):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_bert)
    tok.cls_token = None
    copy = tmp_path / "no-cls"
    tok.save_pretrained(copy)
    for f in tiny_bert.iterdir():
        if f.name.startswith(("config", "model")):
            (copy / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ValueError, match="CLS token"):
        build_simcse_model(str(copy), "cls")
    assert build_simcse_model(str(copy), "avg") is not None


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


def test_amcl_bound_warning_steps_reaches_the_core_and_none_disables_it(tiny_bert):
    model = build_simcse_model(str(tiny_bert), "cls_before_pooler", max_seq_length=16)
    assert st_losses.AMCLLoss(model, projection_dim=8).core.bound_warning_steps == 100
    loss = st_losses.AMCLLoss(model, projection_dim=8, bound_warning_steps=None)
    assert loss.core.bound_warning_steps is None


class _StopAfter(st_losses.TrainerCallback):
    """An interruption: training stops after ``step`` (its checkpoint written)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step
        return control


class _LossStateAtFirstStep(st_losses.TrainerCallback):
    def __init__(self, loss) -> None:
        self.loss, self.state = loss, None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.state is None:
            self.state = {k: v.clone() for k, v in self.loss.loss_state_dict().items()}
        return control


def _amcl_run(path, output_dir, *, seed, callbacks=(), resume=None, **extra_args):
    """AMCL through SentenceTransformerTrainer: 2 steps at batch 4, a checkpoint every step."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer.training_args import (
        SentenceTransformerTrainingArguments,
    )

    model = build_simcse_model(str(path), "avg", max_seq_length=16)
    torch.manual_seed(seed)  # the loss's heads and temperature network
    loss = st_losses.AMCLLoss(model, num_heads=2, projection_dim=8)
    probe = _LossStateAtFirstStep(loss)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=4, max_steps=2, learning_rate=1e-2,
        save_strategy="steps", save_steps=1, report_to="none", use_cpu=True, disable_tqdm=True,
        seed=0, **extra_args)
    pairs = Dataset.from_dict({"anchor": CORPUS, "positive": [s.replace(" .", " !") for s in CORPUS]})
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=pairs, loss=loss,
                                         callbacks=[st_losses.LossStateCallback(loss), probe, *callbacks])
    trainer.train(resume_from_checkpoint=resume)
    return model, loss, probe.state


@pytest.mark.slow
def test_amcl_heads_restored_when_trainer_resumes(tmp_path, tiny_bert):
    """``train(resume_from_checkpoint=True)`` restores AMCL's heads and temperature network from
    the checkpoint (they are not part of the model), and the resumed run ends where an
    uninterrupted one does."""
    model, loss, _ = _amcl_run(tiny_bert, tmp_path / "whole", seed=0)
    _amcl_run(tiny_bert, tmp_path / "cut", seed=0, callbacks=[_StopAfter(1)])
    saved = torch.load(tmp_path / "cut" / "checkpoint-1" / st_losses.LOSS_STATE_FILE,
                       weights_only=True)["state"]
    # resumed in a new process: fresh heads (another seed), the trainer restores the rest
    resumed_model, resumed_loss, at_resume = _amcl_run(tiny_bert, tmp_path / "cut", seed=1, resume=True)
    assert at_resume.keys() == saved.keys() and any("heads" in k for k in saved)
    for k, v in saved.items():
        torch.testing.assert_close(at_resume[k], v, rtol=0, atol=0, msg=k)
    for k, v in loss.loss_state_dict().items():
        torch.testing.assert_close(resumed_loss.loss_state_dict()[k], v, msg=k)
    for (name, a), b in zip(model.named_parameters(), resumed_model.parameters(), strict=True):
        torch.testing.assert_close(b, a, msg=name)


def test_resuming_without_saved_loss_state_raises(tmp_path, tiny_bert):
    """No silent fresh heads: a resumed run whose checkpoint lacks the loss state raises; a
    checkpoint outside ``output_dir`` is found through ``args.resume_from_checkpoint``."""
    import shutil

    _amcl_run(tiny_bert, tmp_path / "run", seed=0, callbacks=[_StopAfter(1)])
    elsewhere = tmp_path / "moved" / "checkpoint-1"
    shutil.copytree(tmp_path / "run" / "checkpoint-1", elsewhere)
    (tmp_path / "run" / "checkpoint-1" / st_losses.LOSS_STATE_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=r"resumes at step 1 .*adaptcl_loss_state\.pt"):
        _amcl_run(tiny_bert, tmp_path / "run", seed=0, resume=True)
    saved = torch.load(elsewhere / st_losses.LOSS_STATE_FILE, weights_only=True)["state"]
    _, _, at_resume = _amcl_run(tiny_bert, tmp_path / "other", seed=1, resume=str(elsewhere),
                                resume_from_checkpoint=str(elsewhere))
    for k, v in saved.items():
        torch.testing.assert_close(at_resume[k], v, rtol=0, atol=0, msg=k)
