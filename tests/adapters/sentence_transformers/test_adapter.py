"""sentence-transformers losses: MNRL parity, trainer integration, model card, saved state."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("sentence_transformers")

from sentence_transformers.sentence_transformer.losses import (  # noqa: E402
    MultipleNegativesRankingLoss,
)
from transformers import TrainerCallback  # noqa: E402

from adaptcl.adapters import sentence_transformers as st_losses  # noqa: E402
from adaptcl.adapters.sentence_transformers import (  # noqa: E402
    build_simcse_model,
    make_loss,
    supervised_dataset,
    unsupervised_dataset,
    validate_text_dataset,
)
from tests.adapters._tiny_models import CORPUS  # noqa: E402


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


def test_bad_inputs_get_clear_errors(tmp_path, tiny_roberta):
    from datasets import Dataset

    model = build_simcse_model(str(tiny_roberta), "avg", max_seq_length=16)
    loss = make_loss("macl", model)
    with pytest.raises(ValueError, match="at least two text columns"):
        validate_text_dataset(Dataset.from_dict({"anchor": CORPUS}))
    with pytest.raises(ValueError, match="column 'positive' row 1 is empty"):
        validate_text_dataset(Dataset.from_dict({"anchor": CORPUS[:3], "positive": ["a", " ", "b"]}))
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


def test_amcl_bound_warning_steps_reaches_the_core_and_none_disables_it(tiny_bert):
    model = build_simcse_model(str(tiny_bert), "cls_before_pooler", max_seq_length=16)
    assert st_losses.AMCLLoss(model, projection_dim=8).core.bound_warning_steps == 100
    loss = st_losses.AMCLLoss(model, projection_dim=8, bound_warning_steps=None)
    assert loss.core.bound_warning_steps is None


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


def test_make_loss_takes_the_registry_names_and_old_spellings(tiny_bert):
    import warnings

    from adaptcl.adapters.sentence_transformers import LOSSES

    model = build_simcse_model(str(tiny_bert), "cls_before_pooler", max_seq_length=16)
    built = {"infonce": st_losses.InfoNCELoss, "macl": st_losses.MACLLoss,
             "ascl": st_losses.ASCLLoss, "amcl": st_losses.AMCLLoss}
    assert LOSSES == tuple(built)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in LOSSES:
            assert type(make_loss(name, model)) is built[name]
            assert type(make_loss(name.upper(), model)) is built[name]
    with pytest.warns(FutureWarning, match="loss 'nt_xent' is deprecated; use 'infonce'"):
        old = make_loss("nt_xent", model, temperature=0.1)
    new = make_loss("infonce", model, temperature=0.1)
    assert type(old) is type(new) and old.get_config_dict() == new.get_config_dict()
    assert old.get_config_dict() != make_loss("infonce", model).get_config_dict()
    with pytest.raises(ValueError, match="loss 'dcl' is not available here; choose from "
                                         "infonce, macl, ascl, amcl"):
        make_loss("dcl", model)
    with pytest.raises(ValueError, match="AMCL brings its own projection heads"):
        make_loss("amcl", model, projection=nn.Identity())
