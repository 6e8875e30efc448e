"""The Lightly adapter's ``loss_fn(out0, out1, labels)`` (SupCon, the core's multi-positive
targets: tests/plugins/test_targets.py checks the formula) with and without a memory bank, and
``DySTreSSLoss`` against the authors' own Lightly loss (``TSNTXentLoss`` of
github.com/sadimanna/DySTreSS, transcribed below: in-batch and memory-bank branches)."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("lightly")

import lightly.loss as lightly_loss  # noqa: E402

import adaptcl.adapters.lightly as ours  # noqa: E402
from adaptcl import plugins  # noqa: E402

LABELS = torch.tensor([0, 1, 1, 0, 2, 2, 0, 1])


def _pair(n=8, d=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, d, generator=g, dtype=dtype).requires_grad_(),
            torch.randn(n, d, generator=g, dtype=dtype).requires_grad_())


# ------------------------------------------------------------------------------------- labels


@pytest.mark.parametrize("make, core", [
    (lambda: ours.NTXentLoss(0.1), lambda: plugins.InfoNCELoss(0.1)),
    (lambda: ours.MACLLoss(0.1, 0.5, reweight=False), lambda: plugins.MACLLoss(0.1, 0.5, reweight=False)),
    (lambda: ours.DySTreSSLoss(0.1, 0.2), lambda: plugins.DySTreSSLoss(0.1, 0.2)),
    (lambda: ours.NTXentLoss(0.1, form="cross_view"), lambda: plugins.InfoNCELoss(0.1, form="cross_view")),
], ids=["ntxent", "macl", "dystress", "ntxent_cross_view"])
def test_labels_reach_the_core_as_class_indices_or_one_hot_rows(make, core):
    z0, z1 = _pair()
    expected = core()(z0, z1, labels=LABELS)
    torch.testing.assert_close(make()(z0, z1, LABELS), expected, rtol=0, atol=0)
    one_hot = torch.nn.functional.one_hot(LABELS).float()  # the form of Lightly's SupCon proposal
    torch.testing.assert_close(make()(z0, z1, one_hot), expected, rtol=0, atol=0)
    torch.testing.assert_close(make()(z0, z1, labels=LABELS), expected, rtol=0, atol=0)


def test_distinct_labels_give_lightlys_ntxent():
    """One positive per anchor is SimCLR: Lightly's own NTXentLoss, value and gradients."""
    z0, z1 = _pair(seed=1)
    a = ours.NTXentLoss(0.5)(z0, z1, torch.arange(8))
    b = lightly_loss.NTXentLoss(0.5)(z0, z1)
    torch.testing.assert_close(a, b)
    for ga, gb in zip(torch.autograd.grad(a, (z0, z1)), torch.autograd.grad(b, (z0, z1)), strict=True):
        torch.testing.assert_close(ga, gb)


def test_memory_bank_labels_keep_step_with_the_bank_across_wrap_arounds():
    """The class of every bank entry is the class of the key stored in it: out1 rows are one-hot
    of the label, so each bank row's argmax must be its stored label, whatever the pointer did
    (batches of 3 into a bank of 7 wrap and drop rows as Lightly's bank does)."""
    loss_fn = ours.NTXentLoss(0.2, memory_bank_size=(7, 5), memory_bank_labels=True)
    assert (loss_fn.label_bank.bank == -1).all()  # Lightly's random initial rows: no class
    g = torch.Generator().manual_seed(2)
    for step in range(6):
        labels = torch.randint(0, 5, (3,), generator=g)
        out1 = torch.nn.functional.one_hot(labels, 5).float() + 0.01
        out0 = torch.randn(3, 5, generator=g, requires_grad=True)
        loss_fn(out0, out1, labels)
        assert int(loss_fn.label_bank.bank_ptr) == int(loss_fn.memory_bank.bank_ptr), step
    stored = loss_fn.label_bank.bank[:, 0].long()
    assert (stored >= 0).all()
    assert torch.equal(loss_fn.memory_bank.bank.argmax(dim=1), stored)


def test_memory_bank_labels_make_same_class_entries_positives():
    """The value is the core's queue form with the bank's classes as negative labels."""
    loss_fn = ours.NTXentLoss(0.2, memory_bank_size=(6, 16), memory_bank_labels=True)
    z0, z1 = _pair(seed=3)
    loss_fn(z0, z1, LABELS)  # fills 6 of the bank's rows (the rest of the batch is dropped)
    bank = loss_fn.memory_bank.bank.clone()
    bank_labels = loss_fn.label_bank.bank[:, 0].long().clone()
    y0, y1 = _pair(seed=4)
    core = plugins.InfoNCELoss(0.2, form="queue")
    core.unit_negatives = True
    expected = core(y0, y1, bank, labels=LABELS, negative_labels=bank_labels)
    torch.testing.assert_close(loss_fn(y0, y1, LABELS), expected, rtol=0, atol=0)
    assert not torch.allclose(expected, core(y0, y1, bank))


def test_an_unlabelled_call_stores_no_class():
    loss_fn = ours.MACLLoss(0.1, memory_bank_size=(8, 16), memory_bank_labels=True)
    z0, z1 = _pair(seed=5)
    loss_fn(z0, z1)  # MACL with its reweighting: no labels in this call
    assert (loss_fn.label_bank.bank == -1).all()


def test_the_label_bank_is_saved_with_a_persistent_bank_only():
    persistent = ours.NTXentLoss(memory_bank_size=(8, 16), memory_bank_labels=True,
                                 persistent_memory_bank=True)
    assert "label_bank.bank" in persistent.state_dict()
    assert "label_bank.bank" not in ours.NTXentLoss(memory_bank_size=(8, 16),
                                                     memory_bank_labels=True).state_dict()
    assert not any("label" in k for k in ours.NTXentLoss(memory_bank_size=(8, 16),
                                                          persistent_memory_bank=True).state_dict())


def test_what_labels_need_and_refuse():
    z0, z1 = _pair()
    bank = ours.NTXentLoss(memory_bank_size=(8, 16))
    with pytest.raises(ValueError, match="memory_bank_labels=True"):
        bank(z0, z1, LABELS)
    assert int(bank.memory_bank.bank_ptr) == 0  # refused before the bank was touched
    with pytest.raises(ValueError, match="needs a memory bank"):
        ours.NTXentLoss(memory_bank_labels=True)
    with pytest.raises(ValueError, match="takes no labels"):  # the base every loss shares
        ours.MemoryBankLoss(plugins.FlatNCELoss, (8, 16), memory_bank_labels=True)
    for loss_fn in (ours.FlatNCELoss(), ours.DualTemperatureLoss(), ours.AMCLLoss(dim=16)):
        with pytest.raises(TypeError, match="takes no labels"):
            loss_fn(z0, z1, LABELS)
    with pytest.raises(TypeError):
        ours.DCLLoss()(z0, z1, LABELS)  # DCL's forward is Lightly's (out0, out1)
    with pytest.raises(ValueError, match="one-hot rows"):
        ours.NTXentLoss()(z0, z1, torch.rand(8, 3))
    with pytest.raises(ValueError, match="reweight=False"):
        ours.MACLLoss()(z0, z1, LABELS)
    with pytest.raises(TypeError, match="labels must be an integer tensor"):
        ours.NTXentLoss()(z0, z1, LABELS.float())


def test_supervised_simclr_trains_on_a_labelled_loader():
    """The loop of docs/guides/lightly.md's supervised example: a step with labels moves the
    model, and the loss differs from the unsupervised one on the same batch."""
    from lightly.models.modules import SimCLRProjectionHead

    from adaptcl.adapters.lightning.backbones import small_cnn

    torch.manual_seed(0)
    backbone, dim = small_cnn(width=4)
    head = SimCLRProjectionHead(dim, dim, 8)
    x0, x1 = torch.randn(8, 3, 16, 16), torch.randn(8, 3, 16, 16)
    criterion = ours.NTXentLoss(temperature=0.1)
    z0, z1 = head(backbone(x0)), head(backbone(x1))
    supervised, unsupervised = criterion(z0, z1, LABELS), criterion(z0, z1)
    assert torch.isfinite(supervised) and not torch.isclose(supervised, unsupervised)
    supervised.backward()
    assert all(torch.isfinite(p.grad).all() for p in head.parameters())


# ------------------------------------------------------------------- DySTreSS, the authors' loss


def _authors_ts_ntxent(out0, out1, min_temp, max_temp, negatives=None):
    """``TSNTXentLoss.forward`` of github.com/sadimanna/DySTreSS (imagenet/ts_ntx_ent_loss.py),
    single process: ``logits / get_temp(logits.detach())`` with the cosine ``get_temp``."""
    def get_temp(cossim):
        return min_temp + 0.5 * (max_temp - min_temp) * (1 + torch.cos((1 + cossim) * math.pi))

    out0 = torch.nn.functional.normalize(out0, dim=1)
    out1 = torch.nn.functional.normalize(out1, dim=1)
    if negatives is not None:
        sim_pos = torch.einsum("nc,nc->n", out0, out1).unsqueeze(-1)
        sim_neg = torch.einsum("nc,kc->nk", out0, negatives)
        logits = torch.cat([sim_pos, sim_neg], dim=1)
        logits = logits / get_temp(logits.detach())
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
    else:
        batch_size = out0.shape[0]
        diag_mask = torch.eye(batch_size, dtype=torch.bool)
        logits_00 = torch.einsum("nc,mc->nm", out0, out0)[~diag_mask].view(batch_size, -1)
        logits_01 = torch.einsum("nc,mc->nm", out0, out1)
        logits_10 = torch.einsum("nc,mc->nm", out1, out0)
        logits_11 = torch.einsum("nc,mc->nm", out1, out1)[~diag_mask].view(batch_size, -1)
        logits = torch.cat([torch.cat([logits_01, logits_00], dim=1),
                            torch.cat([logits_10, logits_11], dim=1)], dim=0)
        logits = logits / get_temp(logits.detach())
        labels = torch.arange(batch_size).repeat(2)
    return torch.nn.functional.cross_entropy(logits, labels)


@pytest.mark.parametrize("bank", [False, True])
def test_dystress_equals_the_authors_lightly_loss(bank):
    z0, z1 = _pair(seed=6, dtype=torch.float64)
    loss_fn = ours.DySTreSSLoss(0.1, 0.2, memory_bank_size=(10, 16) if bank else 0).double()
    negatives = loss_fn.memory_bank.bank.clone() if bank else None  # Lightly's random unit rows
    value = loss_fn(z0, z1)
    expected = _authors_ts_ntxent(z0, z1, 0.1, 0.2, negatives)
    torch.testing.assert_close(value, expected)
    for a, b in zip(torch.autograd.grad(value, (z0, z1)),
                    torch.autograd.grad(expected, (z0, z1)), strict=True):
        torch.testing.assert_close(a, b)


def test_dystress_temperatures_are_settable_and_kept_ordered():
    loss_fn = ours.DySTreSSLoss(0.1, 0.2)
    loss_fn.max_temperature = 0.3
    loss_fn.min_temperature = 0.05
    assert (loss_fn.criterion.min_temperature, loss_fn.criterion.max_temperature) == (0.05, 0.3)
    with pytest.raises(ValueError, match="min_temperature must be <= max_temperature"):
        loss_fn.min_temperature = 0.5
    with pytest.raises(ValueError, match="min_temperature must be <= max_temperature"):
        ours.DySTreSSLoss(0.3, 0.2)
    assert ours.DySTreSSLoss(0.04, 0.05, shape="piecewise").criterion.shape == "piecewise"
