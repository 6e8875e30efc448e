"""``train_epoch``: devices, mixed precision (bf16 / fp16 autocast) and deferred host reads.

Tolerance, on the first step's loss (absolute): under autocast the GIN's linear layers run in
bfloat16 (8-bit mantissa, relative rounding about 4e-3) or float16 (11 bits, about 5e-4), while
the loss core computes cosines, logits and log-sum-exp in float32. An error e in a cosine
becomes e / tau in a logit (tau 0.2 here), so the loss may move by a few times e / tau: 3e-2
for bf16, 1e-2 for fp16 (measured here: about 2e-4 and 2.4e-3 on a loss of 0.356).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch_geometric")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch_geometric.loader import DataLoader  # noqa: E402

from adaptcl.adapters.graphcl import (  # noqa: E402
    GraphCL,
    Identity,
    NodeDrop,
    TUGINEncoder,
    TwoViewDataset,
    train_epoch,
)
from adaptcl.plugins.validation import NonFiniteError  # noqa: E402
from tests.adapters.graphcl._graphs import random_graphs  # noqa: E402


def pair_loader(num_graphs: int = 16, batch_size: int = 8) -> DataLoader:
    graphs = random_graphs(num_graphs)
    views = TwoViewDataset(graphs, Identity(),
                           NodeDrop(0.2, generator=torch.Generator().manual_seed(1)))
    return DataLoader(views, batch_size=batch_size, shuffle=False)


def fresh_model(loss: str = "macl") -> tuple[GraphCL, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GraphCL(TUGINEncoder(4, hidden_channels=16, num_layers=3), loss_fn=loss)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def one_step_loss(precision: str, scaler=None) -> tuple[float, GraphCL]:
    model, opt = fresh_model()
    loss = train_epoch(model, pair_loader(8, 8), opt, precision=precision, scaler=scaler)
    return loss, model


def test_bf16_autocast_step_is_finite_and_close_to_float32():
    ref, _ = one_step_loss("32")
    bf16, model = one_step_loss("bf16-mixed")
    assert torch.isfinite(torch.tensor(bf16))
    assert bf16 == pytest.approx(ref, abs=3e-2)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_fp16_autocast_step_with_grad_scaler_is_finite_and_close_to_float32():
    ref, _ = one_step_loss("32")
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    fp16, model = one_step_loss("16-mixed", scaler=scaler)
    assert fp16 == pytest.approx(ref, abs=1e-2)
    assert scaler.get_scale() == 2.0**10  # finite gradients: the step was taken, scale kept
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_train_epoch_moves_batches_to_the_device_and_records_each_step(device):
    model, opt = fresh_model()
    model.to(device)
    stats: dict[str, list] = {}
    loss = train_epoch(model, pair_loader(), opt, stats, device=device)
    assert isinstance(loss, float) and loss > 0
    assert len(stats["temperature"]) == 2 and all(isinstance(t, float) for t in
                                                  stats["temperature"])


def test_reading_once_per_epoch_gives_the_same_losses_and_stats_as_every_step():
    results = []
    for per_step in (True, False):
        model, opt = fresh_model()
        stats: dict[str, list] = {}
        losses = [train_epoch(model, pair_loader(), opt, stats, sync_each_step=per_step)
                  for _ in range(2)]
        results.append((losses, stats))
    assert results[0] == results[1]


class _NaNLoss(nn.Module):
    def forward(self, z0, z1):
        return (z0 * z1).sum() * float("nan")


@pytest.mark.parametrize("per_step", [True, False])
def test_non_finite_loss_raises_naming_the_run(per_step):
    model, opt = fresh_model(loss=_NaNLoss())
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(NonFiniteError, match="non-finite loss on MUTAG/macl/seed0") as excinfo:
        train_epoch(model, pair_loader(), opt, where="MUTAG/macl/seed0",
                    sync_each_step=per_step)
    err = excinfo.value
    assert err.step == (1 if per_step else 2)  # per step: the first; else read at the end
    if per_step:  # checked before the optimiser step: the model is untouched
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_unknown_precision_is_rejected_by_name():
    model, opt = fresh_model()
    with pytest.raises(ValueError, match=r"precision must be one of 32, bf16-mixed, 16-mixed, "
                                         r"got 'fp8'"):
        train_epoch(model, pair_loader(), opt, precision="fp8")


def test_step_loss_trains_a_single_view_objective_and_counts_its_steps():
    # supervised fine-tuning runs through the same loop: a plain Batch and a custom objective
    torch.manual_seed(0)
    encoder = TUGINEncoder(4, hidden_channels=16, num_layers=2)
    head = nn.Linear(encoder.out_dim, 1)
    model = nn.ModuleDict({"encoder": encoder, "head": head})
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    graphs = [pair[0] for pair in pair_loader(16, 16).dataset]
    loader = DataLoader(graphs + graphs[:1], batch_size=8, shuffle=False)  # last batch: 1 graph
    stats: dict[str, list] = {}
    losses = [train_epoch(model, loader, opt, stats,
                          step_loss=lambda b: (head(encoder(b)) - 1.0).pow(2).mean())
              for _ in range(3)]
    assert len(stats["loss"]) == 6  # two steps per epoch; the single-graph batch is skipped
    assert set(stats) == {"loss"}  # a model without loss_fn contributes no statistics
    assert losses[-1] < losses[0]
