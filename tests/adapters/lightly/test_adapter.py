"""Lightly adapter: parity with Lightly's losses, memory bank, distributed gather, ASCL MoCo queue."""

from __future__ import annotations

import io

import pytest
import torch

lightly = pytest.importorskip("lightly")

from lightly.loss import DCLLoss as LightlyDCLLoss  # noqa: E402
from lightly.loss import NTXentLoss as LightlyNTXentLoss  # noqa: E402
from lightly.models.modules.heads import MoCoProjectionHead, SimCLRProjectionHead  # noqa: E402

from adaptcl.adapters.lightly import (  # noqa: E402
    AMCLLoss,
    AMCLProjectionHead,
    ASCLLoss,
    ASCLMoCo,
    DCLLoss,
    MACLLoss,
    NTXentLoss,
    PersistentMemoryBankModule,
)
from tests._distributed import gloo_results  # noqa: E402


def _pair(n=16, d=32, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    z0 = torch.randn(n, d, generator=g, dtype=dtype).requires_grad_()
    z1 = torch.randn(n, d, generator=g, dtype=dtype).requires_grad_()
    return z0, z1


def _value_and_grads(loss_fn, z0, z1):
    loss = loss_fn(z0, z1)
    g0, g1 = torch.autograd.grad(loss, (z0, z1))
    return loss.detach(), g0, g1


def _assert_same(a, b, atol=1e-5):
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, atol=atol, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# parity with lightly.loss
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.07, 0.1, 0.5])
@pytest.mark.parametrize("n", [2, 8, 33])
def test_macl_without_adaptive_parts_equals_lightly_ntxent(temperature, n):
    z0, z1 = _pair(n=n, seed=n)
    ours = MACLLoss(temperature=temperature, alpha=0.0, reweight=False)
    theirs = LightlyNTXentLoss(temperature=temperature)
    _assert_same(_value_and_grads(ours, z0, z1), _value_and_grads(theirs, z0, z1))


def test_ntxent_adapter_equals_lightly_with_lightly_defaults():
    z0, z1 = _pair(n=12, d=20, seed=3)
    _assert_same(_value_and_grads(NTXentLoss(), z0, z1),
                 _value_and_grads(LightlyNTXentLoss(), z0, z1))
    assert NTXentLoss().temperature == LightlyNTXentLoss().temperature == 0.5


@pytest.mark.parametrize("make_ours", [
    lambda t, size: MACLLoss(temperature=t, alpha=0.0, reweight=False, memory_bank_size=size),
    lambda t, size: NTXentLoss(temperature=t, memory_bank_size=size),
])
def test_memory_bank_parity_with_lightly_over_a_sequence_of_batches(make_ours):
    size = (48, 16)
    ours = make_ours(0.2, size)
    theirs = LightlyNTXentLoss(temperature=0.2, memory_bank_size=size)
    with torch.no_grad():  # seed both banks identically
        ours.memory_bank.bank.copy_(theirs.memory_bank.bank)
    for step in range(6):  # 6 x 10 > 48: the pointer wraps around
        z0, z1 = _pair(n=10, d=16, seed=100 + step)
        _assert_same(_value_and_grads(ours, z0, z1), _value_and_grads(theirs, z0, z1))
        torch.testing.assert_close(ours.memory_bank.bank, theirs.memory_bank.bank,
                                   atol=1e-6, rtol=0)
        assert int(ours.memory_bank.bank_ptr) == int(theirs.memory_bank.bank_ptr)


def test_memory_bank_is_not_updated_without_gradient():
    loss_fn = MACLLoss(memory_bank_size=(32, 8))
    before = loss_fn.memory_bank.bank.clone()
    z0, z1 = torch.randn(4, 8), torch.randn(4, 8)
    loss_fn(z0, z1)
    torch.testing.assert_close(loss_fn.memory_bank.bank, before)
    loss_fn(z0.requires_grad_(), z1)
    assert not torch.equal(loss_fn.memory_bank.bank, before)


def test_dcl_adapter_equals_lightly_dcl():
    z0, z1 = _pair(n=9, d=24, seed=5)
    _assert_same(_value_and_grads(DCLLoss(temperature=0.1), z0, z1),
                 _value_and_grads(LightlyDCLLoss(temperature=0.1), z0, z1))


def test_macl_adaptive_temperature_and_lightly_argument_alias():
    z0, z1 = _pair(n=16, d=8, seed=1)
    loss_fn = MACLLoss(temperature=0.1, alpha=0.5, A_0=0.2)
    loss_fn(z0, z1)
    stats = loss_fn.last_stats
    alignment = torch.nn.functional.cosine_similarity(z0, z1).mean()
    expected = 0.1 * (1 + 0.5 * (alignment - 0.2))
    torch.testing.assert_close(stats["temperature"], expected.detach().clamp(min=0.01))
    assert {"loss", "plain_loss", "alignment", "temperature", "mean_w"} <= set(stats)
    assert loss_fn.criterion.a0 == 0.2 and loss_fn.temperature == 0.1


def test_argument_validation_is_lightlys_and_ours():
    with pytest.raises(ValueError, match="feature"):
        MACLLoss(memory_bank_size=128)  # Lightly 1.6 needs (num_features, dim); ours on 1.5 too
    with pytest.raises(ValueError, match=r"expected a \(num_features, dim\) tuple"):
        NTXentLoss(memory_bank_size=(128,))
    assert not MACLLoss(memory_bank_size=0).uses_memory_bank
    assert MACLLoss(memory_bank_size=(16, 4)).form == "queue"
    with pytest.raises(ValueError, match="form"):
        MACLLoss(form="queue")
    with pytest.raises(TypeError, match="gather_distributed"):
        NTXentLoss(gather_distributed="yes")
    with pytest.raises(ValueError, match="temperature"):
        NTXentLoss(temperature=0.0)
    with pytest.raises(ValueError, match="alpha"):
        MACLLoss(alpha=-1.0)


def test_cross_view_form_is_one_directional_infonce():
    z0, z1 = _pair(n=6, d=8, seed=2)
    loss = NTXentLoss(temperature=0.3, form="cross_view")(z0, z1)
    logits = torch.nn.functional.normalize(z0, dim=1) @ torch.nn.functional.normalize(z1, dim=1).T
    expected = torch.nn.functional.cross_entropy(logits / 0.3, torch.arange(6))
    torch.testing.assert_close(loss, expected)


# ---------------------------------------------------------------------------------------------
# ASCL and persistent queues
# ---------------------------------------------------------------------------------------------


def test_ascl_with_no_neighbours_is_moco_infonce_on_the_same_bank():
    size = (40, 16)
    ascl = ASCLLoss(temperature=0.1, num_neighbors=0, memory_bank_size=size)
    nt = NTXentLoss(temperature=0.1, memory_bank_size=size)
    with torch.no_grad():
        ascl.memory_bank.bank.copy_(nt.memory_bank.bank)
    for step in range(3):
        z0, z1 = _pair(n=8, d=16, seed=step)
        _assert_same(_value_and_grads(ascl, z0, z1), _value_and_grads(nt, z0, z1))
    ascl_soft = ASCLLoss(memory_bank_size=size)
    ascl_soft(*_pair(n=8, d=16))
    assert 0.0 <= float(ascl_soft.last_stats["confidence"]) <= 1.0


def test_ascl_without_memory_bank_uses_in_batch_keys():
    loss_fn = ASCLLoss(num_neighbors=1)
    loss = loss_fn(*_pair(n=8, d=16))
    assert torch.isfinite(loss) and "confidence" in loss_fn.last_stats


def test_persistent_memory_bank_round_trip():
    bank = PersistentMemoryBankModule(size=(32, 8))
    bank(torch.randn(5, 8), update=True)
    state = bank.state_dict()
    assert set(state) == {"bank", "bank_ptr"} and int(state["bank_ptr"]) == 5
    fresh = PersistentMemoryBankModule(size=(32, 8))
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh.bank, bank.bank)
    # Lightly's own bank is not saved: that is why the persistent one exists
    assert "memory_bank.bank" not in NTXentLoss(memory_bank_size=(32, 8)).state_dict()
    assert "memory_bank.bank" in NTXentLoss(memory_bank_size=(32, 8),
                                            persistent_memory_bank=True).state_dict()


def _tiny_backbone():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                               torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())


def test_ascl_moco_queue_survives_checkpoint_round_trip():
    torch.manual_seed(0)
    model = ASCLMoCo(_tiny_backbone(), feature_dim=8, hidden_dim=16, output_dim=8, queue_size=24)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    for _ in range(3):
        xq, xk = torch.randn(6, 3, 8, 8), torch.randn(6, 3, 8, 8)
        model.update_momentum()
        loss = model.training_loss(xq, xk)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert int(model.criterion.memory_bank.bank_ptr) == 18
    assert all(p.grad is None for p in model.backbone_momentum.parameters())
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)

    torch.manual_seed(123)  # a different random queue before loading
    restored = ASCLMoCo(_tiny_backbone(), feature_dim=8, hidden_dim=16, output_dim=8,
                        queue_size=24)
    assert not torch.equal(restored.queue, model.queue)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    torch.testing.assert_close(restored.queue, model.queue)
    assert int(restored.criterion.memory_bank.bank_ptr) == 18
    # the restored model continues exactly like the original
    xq, xk = torch.randn(6, 3, 8, 8), torch.randn(6, 3, 8, 8)
    model.eval(), restored.eval()
    torch.testing.assert_close(restored.training_loss(xq, xk), model.training_loss(xq, xk))


# ---------------------------------------------------------------------------------------------
# AMCL heads and loss
# ---------------------------------------------------------------------------------------------


def test_amcl_heads_and_loss_train_the_temperature_network():
    heads = AMCLProjectionHead.from_lightly(SimCLRProjectionHead, num_heads=3, input_dim=12,
                                            hidden_dim=16, output_dim=8)
    assert heads.num_heads == 3
    x0, x1 = torch.randn(10, 12), torch.randn(10, 12)
    z0, z1 = heads(x0), heads(x1)
    assert z0.shape == (3, 10, 8)
    assert not torch.allclose(z0[0], z0[1])  # independent weights
    loss_fn = AMCLLoss(dim=8, beta=1e-3, negative_term="topk", kappa=2, num_heads=3)
    loss = loss_fn(z0, z1)
    loss.backward()
    assert torch.isfinite(loss)
    assert loss_fn.temperature_net.phi.weight.grad is not None
    assert 1e-5 <= float(loss_fn.last_stats["temperature"]) <= 2.0 + 1e-5
    with pytest.raises(ValueError, match="heads"):
        heads(torch.randn(2, 10, 8))


def test_amcl_loss_with_per_head_memory_banks():
    heads = AMCLProjectionHead.from_lightly(MoCoProjectionHead, num_heads=2, input_dim=12,
                                            hidden_dim=16, output_dim=8)
    loss_fn = AMCLLoss(dim=8, num_heads=2, memory_bank_size=(20, 8))
    q = heads(torch.randn(6, 12))
    with torch.no_grad():
        k = heads(torch.randn(6, 12))
    queues = loss_fn.memory_bank.bank.clone().view(20, 2, 8).transpose(0, 1)  # [heads, K, D]
    loss = loss_fn(q, k)
    # each head is contrasted with its own queue of 20 keys, normalised per head: Lightly's
    # initial bank rows are unit over both heads together, so a head's part is not
    assert not torch.allclose(queues.norm(dim=-1), torch.ones(2, 20))
    unit_queues = torch.nn.functional.normalize(queues, dim=-1)
    torch.testing.assert_close(loss, loss_fn.criterion(q, k, unit_queues))
    assert int(loss_fn.memory_bank.bank_ptr) == 6
    # ... and its keys enter its own queue (the bank row holds the heads side by side)
    stored = loss_fn.memory_bank.bank[:6].view(6, 2, 8).transpose(0, 1)
    torch.testing.assert_close(stored, torch.nn.functional.normalize(k, dim=-1))
    with pytest.raises(ValueError, match="heads"):
        loss_fn(q[:1], k[:1])


# ---------------------------------------------------------------------------------------------
# distributed: 2 processes, gloo
# ---------------------------------------------------------------------------------------------


#: classes of the full batch of 12 pairs, each on both ranks (SupCon needs them gathered)
LABELS = torch.tensor([0, 1, 2, 0, 1, 2, 2, 0, 1, 3, 3, 0])


def _labels(name, rows):
    return (LABELS[rows],) if name.startswith("supcon") else ()


def _make_losses():
    from adaptcl.adapters.lightly import DySTreSSLoss

    return {
        "dystress": lambda: DySTreSSLoss(0.1, 0.2, gather_distributed=True),
        "dystress_bank": lambda: DySTreSSLoss(0.1, 0.3, memory_bank_size=(40, 8),
                                              gather_distributed=True),
        "supcon": lambda: NTXentLoss(temperature=0.2, gather_distributed=True),
        "supcon_macl": lambda: MACLLoss(0.1, 0.5, reweight=False, gather_distributed=True),
        # the bank's classes are gathered with its keys by Lightly's bank, as the keys are
        "supcon_bank": lambda: NTXentLoss(temperature=0.2, memory_bank_size=(40, 8),
                                          memory_bank_labels=True, gather_distributed=True),
        "macl": lambda: MACLLoss(temperature=0.1, alpha=0.5, a0=0.0, gather_distributed=True),
        "ntxent": lambda: NTXentLoss(temperature=0.2, gather_distributed=True),
        "dcl": lambda: DCLLoss(temperature=0.1, gather_distributed=True),
        # in-batch ASCL: gathered keys are the negatives and the soft-label candidates
        "ascl": lambda: ASCLLoss(temperature=0.1, sharpen_temperature=0.05, num_neighbors=2,
                                 gather_distributed=True),
        "macl_bank": lambda: MACLLoss(temperature=0.15, alpha=0.5, a0=0.2,
                                      memory_bank_size=(40, 8), gather_distributed=True),
        "ascl_bank": lambda: ASCLLoss(temperature=0.1, sharpen_temperature=0.05,
                                      num_neighbors=2, memory_bank_size=(40, 8),
                                      gather_distributed=True),
        "amcl_bank": lambda: AMCLLoss(dim=8, beta=1e-2, negative_term="topk", kappa=3, memory_bank_size=(40, 8),
                                      gather_distributed=True),
        # the learned pair temperatures see the gathered candidates too (same seed: same net)
        "amcl": lambda: AMCLLoss(dim=8, beta=1e-2, negative_term="topk", kappa=3, gather_distributed=True),
        "amcl_softmax": lambda: AMCLLoss(dim=8, beta=1e-2, negative_term="softmax",
                                         objective="infonce", gather_distributed=True),
    }


#: processes of the distributed test, each with 12 / WORLD rows of the batch
WORLD = 2


def _full_inputs():
    g = torch.Generator().manual_seed(7)
    return torch.randn(12, 8, generator=g), torch.randn(12, 8, generator=g)


def _rank(rank: int) -> bytes:
    """Every loss on ``rank``'s rows (in a gloo process group), saved by ``torch.save``: the
    tensors cross to the parent as bytes, not as shared memory of a process that ended."""
    z0_full, z1_full = _full_inputs()
    n = z0_full.shape[0] // WORLD
    results = {}
    for name, make in _make_losses().items():
        torch.manual_seed(0)  # same initial bank on every rank
        loss_fn = make()
        z0 = z0_full[rank * n:(rank + 1) * n].clone().requires_grad_()
        z1 = z1_full[rank * n:(rank + 1) * n].clone().requires_grad_()
        loss = loss_fn(z0, z1, *_labels(name, slice(rank * n, (rank + 1) * n)))
        g0, g1 = torch.autograd.grad(loss, (z0, z1))
        entry = {"loss": loss.detach(), "g0": g0, "g1": g1,
                 "stats": {k: v.clone() for k, v in loss_fn.last_stats.items()}}
        if getattr(loss_fn, "uses_memory_bank", False):
            entry["bank"] = loss_fn.memory_bank.bank.clone()
            entry["ptr"] = int(loss_fn.memory_bank.bank_ptr)
        if getattr(loss_fn, "label_bank", None) is not None:
            entry["bank_labels"] = loss_fn.label_bank.bank.clone()
        results[name] = entry
    buffer = io.BytesIO()
    torch.save(results, buffer)
    return buffer.getvalue()


@pytest.mark.slow
def test_two_process_gloo_matches_single_process_full_batch():
    world = WORLD
    ranks = [torch.load(io.BytesIO(saved), weights_only=False)
             for _, saved in sorted(gloo_results(_rank, world).items())]

    z0_full, z1_full = _full_inputs()
    n = z0_full.shape[0] // world
    for name, make in _make_losses().items():
        torch.manual_seed(0)
        single = make()
        z0, z1 = z0_full.clone().requires_grad_(), z1_full.clone().requires_grad_()
        loss = single(z0, z1, *_labels(name, slice(None)))
        g0, g1 = torch.autograd.grad(loss, (z0, z1))
        if name == "supcon_bank":  # both ranks stored the classes of all 12 keys, in order
            for r in ranks:
                torch.testing.assert_close(r[name]["bank_labels"][:12, 0], LABELS.float())
        if name.endswith("_bank"):
            # queue form: each rank's anchors meet the same queue (keys of all ranks enter it,
            # gathered by Lightly's bank), so the mean of the ranks is the full-batch loss
            torch.testing.assert_close(ranks[0][name]["bank"], ranks[1][name]["bank"])
            assert ranks[0][name]["ptr"] == ranks[1][name]["ptr"] == 12
            torch.testing.assert_close(ranks[0][name]["bank"][:12],
                                       torch.nn.functional.normalize(z1_full, dim=1))
        # DDP averages the ranks' losses and gradients: that is the full-batch result
        mean_loss = sum(r[name]["loss"] for r in ranks) / world
        torch.testing.assert_close(mean_loss, loss.detach(), atol=1e-5, rtol=1e-5)
        for rank, r in enumerate(ranks):
            sl = slice(rank * n, (rank + 1) * n)
            torch.testing.assert_close(r[name]["g0"] / world, g0[sl], atol=1e-6, rtol=1e-4)
            torch.testing.assert_close(r[name]["g1"] / world, g1[sl], atol=1e-6, rtol=1e-4)
        if name.startswith("macl"):  # one temperature, from the all-reduced alignment
            t0, t1 = (r[name]["stats"]["temperature"] for r in ranks)
            torch.testing.assert_close(t0, t1, atol=0, rtol=0)
            torch.testing.assert_close(t0, single.last_stats["temperature"])


def test_ascl_transform_gives_strong_and_weak_views():
    from PIL import Image

    from adaptcl.adapters.lightly import CIFAR10_NORMALIZE, ASCLTransform

    image = Image.fromarray(torch.randint(0, 255, (32, 32, 3), dtype=torch.uint8).numpy())
    strong, weak = ASCLTransform(input_size=32, gaussian_blur=0.0,
                                 normalize=CIFAR10_NORMALIZE)(image)
    assert strong.shape == weak.shape == (3, 32, 32)
    # the weak view never changes colours: a grey image stays grey
    grey = Image.fromarray(torch.full((32, 32, 3), 128, dtype=torch.uint8).numpy())
    _, weak_grey = ASCLTransform(input_size=32)(grey)
    assert torch.allclose(weak_grey[0], weak_grey[0].flatten()[0])


@pytest.mark.parametrize("make", [
    lambda t: NTXentLoss(0.2, tile_size=t),
    lambda t: MACLLoss(0.1, 0.5, 0.0, tile_size=t),
    lambda t: DCLLoss(0.1, tile_size=t),
    lambda t: MACLLoss(0.1, memory_bank_size=(16, 8), tile_size=t),
])
def test_tile_size_passes_through_and_matches_the_materialised_loss(make):
    torch.manual_seed(0)
    z0, z1 = torch.randn(10, 8, requires_grad=True), torch.randn(10, 8, requires_grad=True)
    tiled, full = make(3), make(None)
    assert tiled.criterion.tile_size == 3
    if tiled.uses_memory_bank:  # Lightly initialises each bank randomly: start from the same one
        full.memory_bank.bank.copy_(tiled.memory_bank.bank)
    a, b = tiled(z0, z1), full(z0, z1)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for ga, gb in zip(torch.autograd.grad(a, (z0, z1)), torch.autograd.grad(b, (z0, z1)), strict=True):
        torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["NTXentLoss", "DCLLoss", "FlatNCELoss", "DualTemperatureLoss",
                                  "MACLLoss", "ASCLLoss", "DySTreSSLoss", "TemperatureScheduleLoss",
                                  "LearnableTemperatureLoss", "AMCLLoss"])
def test_a_budget_switches_every_loss_to_its_tiled_path(name, monkeypatch):
    import adaptcl.adapters.lightly as package
    from adaptcl.plugins import LogitsBudgetWarning, tiling
    from adaptcl.plugins.tiles import _budget as budget

    monkeypatch.setattr(budget, "_SAID", set())  # said once a process: not yet here

    cls = getattr(package, name)
    args = (8,) if name == "AMCLLoss" else ()  # AMCL's projection dimension
    torch.manual_seed(0)
    z0 = torch.randn(*((2,) if name == "AMCLLoss" else ()), 70, 8, requires_grad=True)
    z1 = torch.randn(z0.shape, requires_grad=True)
    capped, full = cls(*args), cls(*args)
    full.load_state_dict(capped.state_dict())  # AMCL's temperature network, ASCL's queue
    assert capped.criterion.tile_size == "auto"
    with pytest.warns(LogitsBudgetWarning), tiling(max_logits_bytes=1):
        a = capped(z0, z1)
    assert capped.last_stats["auto_tile_size"].item() == 64
    b = full(z0, z1)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert "auto_tile_size" not in full.last_stats


def test_package_keeps_every_public_name_and_lightlys_layout():
    import adaptcl.adapters.lightly as package
    from adaptcl.adapters.lightly import ascl_moco, heads, loss, memory_bank, transforms

    # the names the recipes and users import from the former single module
    before_the_split = {
        "NTXentLoss", "DCLLoss", "FlatNCELoss", "DualTemperatureLoss", "MACLLoss", "ASCLLoss",
        "AMCLLoss", "AMCLProjectionHead", "PairTemperature", "PersistentMemoryBankModule",
        "lightly_gather", "ASCLMoCo", "ASCLTransform", "WeakViewTransform", "CIFAR10_NORMALIZE",
    }
    assert before_the_split <= set(package.__all__)
    homes = {loss: "MACLLoss", heads: "AMCLProjectionHead", memory_bank: "lightly_gather",
             ascl_moco: "ASCLMoCo", transforms: "ASCLTransform"}
    for module, name in homes.items():
        assert getattr(package, name) is getattr(module, name)
    # one memory-bank-and-gather path, one attribute for the wrapped core loss
    for name in loss.__all__:
        cls = getattr(loss, name)
        assert issubclass(cls, memory_bank.MemoryBankLoss), name
    assert isinstance(ASCLLoss().criterion, torch.nn.Module)
    assert isinstance(AMCLLoss(dim=4).criterion, torch.nn.Module)


def test_tile_size_reaches_the_core_and_is_the_only_tiling_keyword():
    assert NTXentLoss(tile_size=8).criterion.tile_size == 8
    assert NTXentLoss(tile_size=None).criterion.tile_size is None
    assert MACLLoss().criterion.tile_size == "auto"
    with pytest.raises(ValueError, match="^tile_size must be an int >= 1, 'auto' or None"):
        NTXentLoss(tile_size="big")
    for removed in ("tile_backend", "max_logits_bytes"):
        with pytest.raises(TypeError, match=removed):
            NTXentLoss(**{removed: None})
