"""sentence-transformers losses: MNRL parity, trainer integration, model card, saved state."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("sentence_transformers")

from sentence_transformers.sentence_transformer.losses import (  # noqa: E402
    MultipleNegativesRankingLoss,
)

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


def test_make_loss_takes_the_registry_names_and_old_spellings(tiny_bert):
    import warnings

    from adaptcl.adapters.sentence_transformers import LOSSES

    model = build_simcse_model(str(tiny_bert), "cls_before_pooler", max_seq_length=16)
    built = {"infonce": st_losses.InfoNCELoss, "macl": st_losses.MACLLoss,
             "ascl": st_losses.ASCLLoss, "amcl": st_losses.AMCLLoss,
             "dystress": st_losses.DySTreSSLoss,
             "temperature_schedule": st_losses.TemperatureScheduleLoss,
             "learnable_temperature": st_losses.LearnableTemperatureLoss}
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
                                         "infonce, macl, ascl, amcl, dystress, "
                                         "temperature_schedule, learnable_temperature$"):
        make_loss("dcl", model)
    with pytest.raises(ValueError, match="AMCL brings its own projection heads"):
        make_loss("amcl", model, projection=nn.Identity())


def test_tile_size_reaches_the_core_and_the_config_unless_auto():
    loss = st_losses.MACLLoss(None, tile_size=5)
    assert loss.core.tile_size == 5 and loss.get_config_dict()["tile_size"] == 5
    assert st_losses.MACLLoss(None, tile_size=None).get_config_dict()["tile_size"] is None
    assert "tile_size" not in st_losses.MACLLoss(None).get_config_dict()
    with pytest.raises(ValueError, match="^tile_size must be"):
        st_losses.InfoNCELoss(None, tile_size="cuda")
    with pytest.raises(TypeError, match="tile_backend"):
        st_losses.InfoNCELoss(None, tile_backend="torch")
