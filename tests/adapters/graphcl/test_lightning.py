"""``GraphCLModule``: GraphCL pre-training under ``pl.Trainer``, at one device and on two gloo ranks.

Tolerance of the one-device comparison with ``train_epoch``: the Lightning step runs the same
operations in the same order (forward, ``zero_grad``, backward, ``Adam.step``) on the same
batches, so on this CPU the per-epoch losses and the final weights agree bit for bit (measured:
difference 0.0). The test allows 1e-6 relative (about 8 float32 ulps), room for a different
reduction order of a CPU kernel between library versions, while a real difference (a step
skipped or taken twice, a batch seen out of order, the loss's statistics reset) moves weights by
about the learning rate, 1e-2.

The two-process test writes a script to a file and runs it with ``subprocess`` (Lightning's
``strategy="ddp"`` relaunches the script for rank 1), as tests/adapters/lightning/test_ddp.py
does; every rank writes what its loss saw to ``rank<r>.json``.
"""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("torch_geometric")
pl = pytest.importorskip("pytorch_lightning")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch_geometric.data import Data  # noqa: E402
from torch_geometric.loader import DataLoader  # noqa: E402

from adaptcl.adapters.graphcl import (  # noqa: E402
    GraphCL,
    Identity,
    NodeDrop,
    TUGINEncoder,
    TwoViewDataset,
    train_epoch,
)
from adaptcl.adapters.graphcl.lightning import GraphCLModule  # noqa: E402
from adaptcl.plugins import DCLLoss  # noqa: E402
from adaptcl.plugins.validation import NonFiniteError  # noqa: E402
from tests._distributed import run_ddp_script  # noqa: E402
from tests.adapters.graphcl._graphs import random_graphs  # noqa: E402


def graphs(num_graphs: int = 17) -> list[Data]:
    return random_graphs(num_graphs)


def pair_loader(num_graphs: int = 20, batch_size: int = 8) -> DataLoader:
    """Shuffled two-view batches (20 graphs in batches of 8: the last one holds 4)."""
    views = TwoViewDataset(graphs(num_graphs), Identity(),
                           NodeDrop(0.2, generator=torch.Generator().manual_seed(1)))
    return DataLoader(views, batch_size=batch_size, shuffle=True,
                      generator=torch.Generator().manual_seed(2))


def fresh_model(loss="macl") -> GraphCL:
    torch.manual_seed(0)
    return GraphCL(TUGINEncoder(4, hidden_channels=16, num_layers=3), loss_fn=loss)


def trainer(max_epochs: int, **kwargs) -> pl.Trainer:
    return pl.Trainer(max_epochs=max_epochs, accelerator="cpu", devices=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, **kwargs)


@pytest.mark.slow  # about 3 s here
def test_one_device_trains_as_train_epoch_does():
    epochs, lr = 3, 1e-2
    reference = fresh_model()
    optimizer = torch.optim.Adam(reference.parameters(), lr=lr)
    stats: dict[str, list] = {}
    loader = pair_loader()
    losses = [train_epoch(reference, loader, optimizer, stats) for _ in range(epochs)]

    module = GraphCLModule(fresh_model(), lr=lr)
    trainer(epochs).fit(module, pair_loader())

    assert len(module.history) == len(stats["loss"]) == 3 * epochs
    assert module.epoch_losses == pytest.approx(losses, rel=1e-6)
    assert [h["temperature"] for h in module.history] == pytest.approx(stats["temperature"],
                                                                       rel=1e-6)
    assert [h["loss"] for h in module.history] == pytest.approx(stats["loss"], rel=1e-6)
    for (name, mine), theirs in zip(module.model.state_dict().items(),
                                    reference.state_dict().values(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7, msg=name)
    assert module.model.loss_fn.gather_distributed is False  # one process: nothing to gather


def test_a_batch_of_one_graph_is_skipped_as_train_epoch_skips_it():
    module = GraphCLModule(fresh_model())
    trainer(1).fit(module, pair_loader(17))  # batches of 8, 8 and 1 graph
    assert [h["step"] for h in module.history] == [1, 2]
    mean = sum(h["loss"] for h in module.history) / 2  # two batches of 8 graphs each
    assert module.epoch_losses == pytest.approx([mean], rel=1e-6)


def test_a_lone_graph_on_a_rank_without_gathering_is_a_clear_error():
    module = GraphCLModule(fresh_model(), gather_distributed=False)
    module._world = 2  # what setup() records under a two-process Trainer
    b0, b1 = next(iter(pair_loader(1, 1)))
    with pytest.raises(ValueError, match="drop_last=True or a loss with gather_distributed"):
        module.training_step((b0, b1), 0)


def test_bf16_mixed_precision_is_the_trainers_and_stays_close_to_float32():
    # tolerance as tests/adapters/graphcl/test_mixed_precision.py: bf16 rounding (~4e-3) / tau
    results = []
    for precision in ("32-true", "bf16-mixed"):
        module = GraphCLModule(fresh_model())
        trainer(1, precision=precision).fit(module, pair_loader())
        results.append(module.history[0]["loss"])
    assert results[1] == pytest.approx(results[0], abs=3e-2) and results[1] != results[0]


class _NaNLoss(nn.Module):
    def forward(self, z0, z1):
        return (z0 * z1).sum() * float("nan")


def test_non_finite_loss_raises_with_its_step_before_the_weights_move():
    module = GraphCLModule(fresh_model(loss=_NaNLoss()), where="MUTAG/macl/seed0")
    before = [p.detach().clone() for p in module.parameters()]
    with pytest.raises(NonFiniteError, match="non-finite loss on MUTAG/macl/seed0 at step 1") \
            as excinfo:
        trainer(1).fit(module, pair_loader())
    assert excinfo.value.step == 1
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))


def test_reading_the_steps_once_per_epoch_gives_the_same_history():
    """What an accelerator does by default (``sync_each_step=False``): nothing is read on the
    host during the epoch, and the history is the per-step one."""
    histories = []
    for sync in (True, False):
        module = GraphCLModule(fresh_model(), sync_each_step=sync)
        trainer(2).fit(module, pair_loader())
        histories.append((module.history, module.epoch_losses))
    assert histories[0] == histories[1] and len(histories[0][0]) == 6


def test_a_non_finite_loss_read_at_the_end_of_the_epoch_still_raises_with_a_step():
    module = GraphCLModule(fresh_model(loss=_NaNLoss()), sync_each_step=False)
    with pytest.raises(NonFiniteError, match="non-finite loss on GraphCL pre-training by step 3") \
            as excinfo:
        trainer(1).fit(module, pair_loader())
    assert excinfo.value.step == 3 and len(module.history) == 3


class _NaNAfter(nn.Module):
    """The projections turn NaN from the second step on: the loss's finiteness check raises."""

    def __init__(self):
        super().__init__()
        self.loss = DCLLoss(temperature=0.2, form="cross_view")
        self.calls = 0

    def forward(self, z0, z1):
        self.calls += 1
        return self.loss(z0 * float("nan") if self.calls > 1 else z0, z1)


def test_non_finite_embeddings_name_the_step_of_the_run():
    module = GraphCLModule(fresh_model(loss=_NaNAfter()))
    with pytest.raises(NonFiniteError, match="on GraphCL pre-training at step 2") as excinfo:
        trainer(1).fit(module, pair_loader())
    assert excinfo.value.step == 2 and len(module.history) == 1


def test_arguments_are_checked_by_name():
    with pytest.raises(ValueError, match="optimizer"):
        GraphCLModule(fresh_model(), optimizer="sgd")
    with pytest.raises(ValueError, match="lr"):
        GraphCLModule(fresh_model(), lr=0.0)
    with pytest.raises(ValueError, match="gather_distributed=True needs a loss"):
        GraphCLModule(fresh_model(loss=_NaNLoss()), gather_distributed=True)
    with pytest.raises(TypeError, match="model must be a GraphCL model"):
        GraphCLModule(nn.Linear(2, 2))


def test_history_travels_in_the_checkpoint(tmp_path):
    module = GraphCLModule(fresh_model())
    fit = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     default_root_dir=str(tmp_path))
    fit.fit(module, pair_loader())
    path = tmp_path / "one.ckpt"
    fit.save_checkpoint(str(path))
    restored = GraphCLModule(fresh_model())
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    restored.on_load_checkpoint(checkpoint)
    assert restored.history == module.history and len(restored.history) == 3
    assert restored.epoch_losses == module.epoch_losses
    assert set(checkpoint["state_dict"]) == {f"model.{k}" for k in module.model.state_dict()}


def test_a_run_resumed_from_its_checkpoint_ends_as_the_uninterrupted_run(tmp_path):
    from pytorch_lightning.callbacks import ModelCheckpoint

    def loader() -> DataLoader:  # no random augmentation or shuffle: the same batches again
        return DataLoader(TwoViewDataset(graphs(20), Identity(), NodeDrop(0.0)), batch_size=8)

    whole = GraphCLModule(fresh_model(), lr=1e-2)
    trainer(2).fit(whole, loader())
    first = GraphCLModule(fresh_model(), lr=1e-2)
    pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
               enable_progress_bar=False, enable_model_summary=False,
               callbacks=[ModelCheckpoint(dirpath=str(tmp_path), save_last=True)]).fit(
        first, loader())
    resumed = GraphCLModule(fresh_model(), lr=1e-2)  # fresh weights: all come from the file
    trainer(2).fit(resumed, loader(), ckpt_path=str(tmp_path / "last.ckpt"))
    assert len(resumed.history) == 6 and resumed.epoch_losses == whole.epoch_losses
    assert [h["temperature"] for h in resumed.history] == [h["temperature"]
                                                           for h in whole.history]
    for mine, theirs in zip(resumed.model.state_dict().values(),
                            whole.model.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs)


SCRIPT = textwrap.dedent('''
    import json
    import sys

    import pytorch_lightning as pl
    import torch
    from torch_geometric.loader import DataLoader

    from adaptcl.adapters.graphcl import GraphCL, Identity, NodeDrop, TUGINEncoder, TwoViewDataset
    from adaptcl.adapters.graphcl.lightning import GraphCLModule
    from adaptcl.plugins import MACLLoss

    from tests.adapters.graphcl.test_lightning import graphs

    torch.set_num_threads(1)
    out_dir = sys.argv[1]


    class Probe(MACLLoss):
        """MACL that records, per call, its local anchors and the keys it compared them with."""

        seen = []

        def candidates(self, z0, z1, negatives):
            cands = super().candidates(z0, z1, negatives)
            self.seen.append({"anchors": int(cands[0].anchors.shape[0]),
                              "keys": int(cands[0].keys.shape[0])})
            return cands


    class Record(pl.Callback):
        def on_train_end(self, trainer, module):
            params = torch.cat([p.detach().flatten() for p in module.parameters()])
            with open(f"{out_dir}/rank{trainer.global_rank}.json", "w") as handle:
                json.dump({"world_size": trainer.world_size, "global_step": trainer.global_step,
                           "seen": Probe.seen, "history": module.history,
                           "gather": module.model.loss_fn.gather_distributed,
                           "epoch_losses": module.epoch_losses,
                           "param_sum": float(params.double().sum())}, handle)


    pl.seed_everything(0)
    loss = Probe(temperature=0.1, alpha=0.5, a0=0.0, reweight=False, form="cross_view",
                 positive_in_denominator=False)
    model = GraphCL(TUGINEncoder(4, hidden_channels=16, num_layers=2), loss_fn=loss)
    views = TwoViewDataset(graphs(18), Identity(), NodeDrop(0.2))
    module = GraphCLModule(model, lr=1e-2)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2,
                         callbacks=[Record()], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, DataLoader(views, batch_size=4, shuffle=True))
    # as every distributed script should before it exits: gloo's threads left running abort
    # the interpreter's shutdown now and then (SIGABRT, "terminate called without an active
    # exception")
    torch.distributed.destroy_process_group()
''')


@pytest.mark.slow
def test_two_gloo_ranks_train_and_the_loss_sees_the_gathered_batch(tmp_path):
    ranks = run_ddp_script(SCRIPT, tmp_path, timeout=240)
    for rank in ranks:
        # 18 graphs / 2 ranks = 9 a rank in batches of 4, 4 and 1: three steps per epoch
        assert rank["world_size"] == 2 and rank["global_step"] == 6 and rank["gather"] is True
        # the keys are both ranks' projections: 2 x 4, and 2 x 1 for the batches of one graph,
        # which under DDP have negatives (the other rank's graph) and take their step
        assert rank["seen"] == [{"anchors": 4, "keys": 8}] * 2 + [{"anchors": 1, "keys": 2}] + \
            [{"anchors": 4, "keys": 8}] * 2 + [{"anchors": 1, "keys": 2}]
        assert len(rank["history"]) == 6
    for h0, h1 in zip(ranks[0]["history"], ranks[1]["history"], strict=True):
        # MACL's temperature comes from the alignment averaged over the ranks: one value
        assert h0["temperature"] == h1["temperature"] and h0["alignment"] == h1["alignment"]
        assert h0["loss"] != pytest.approx(h1["loss"])  # ... on different shards of the data
    assert ranks[0]["epoch_losses"] == ranks[1]["epoch_losses"]  # summed over the ranks
    assert ranks[0]["param_sum"] == pytest.approx(ranks[1]["param_sum"], rel=1e-6)


def test_the_module_imports_no_part_of_the_vision_adapter():
    """The checkpoint hook GraphCLModule shares with the image methods lives in the framework-free
    ``adaptcl.adapters.lightning.resume``: the graph extra needs no Lightly, and importing the
    module loads neither Lightly nor the image methods' modules."""
    import subprocess
    import sys

    from tests.recipes._process import env_with_src

    code = ("import sys, adaptcl.adapters.graphcl.lightning\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'lightly' "
            "or m in ('adaptcl.adapters.lightning.base', 'adaptcl.adapters.lightning.modules', "
            "'adaptcl.adapters.lightning.backbones', 'adaptcl.adapters.lightning.features', "
            "'adaptcl.adapters.lightning.factory')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env_with_src(), check=True)
    assert done.stdout.strip() == "[]"
