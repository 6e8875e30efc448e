"""Lightning DDP on CPU: two gloo processes train SimCLR with ``MACLLoss(gather_distributed=True)``.

The training script is written to a file and run with ``subprocess`` (``strategy="ddp"``:
Lightning relaunches the script for rank 1), which avoids pickling the module for
``ddp_spawn``. Every rank writes what it saw to ``rank<r>.json``.
"""

from __future__ import annotations

import textwrap

import pytest

from tests._distributed import run_ddp_script

pytest.importorskip("lightly")
pytest.importorskip("pytorch_lightning")
torch = pytest.importorskip("torch")

SCRIPT = textwrap.dedent('''
    import json
    import sys

    import pytorch_lightning as pl
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, Dataset

    from adaptcl.adapters.lightly import MACLLoss
    from adaptcl.adapters.lightning.backbones import small_cnn
    from adaptcl.adapters.lightning.modules import SimCLRModule

    torch.set_num_threads(1)
    out_dir = sys.argv[1]


    class TwoViews(Dataset):
        """Random 16x16 images, two noisy views each."""

        def __init__(self, n=64):
            g = torch.Generator().manual_seed(0)
            self.x = torch.rand(n, 3, 16, 16, generator=g)
            self.noise = 0.1 * torch.randn(2, n, 3, 16, 16, generator=g)

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return [self.x[i] + self.noise[0, i], self.x[i] + self.noise[1, i]], i % 10


    class Probe(SimCLRModule):
        """SimCLR that also records this rank's own (local) positive alignment."""

        def training_loss(self, views):
            z0 = self.projection_head(self(views[0]))
            z1 = self.projection_head(self(views[1]))
            self.local_alignment = float((F.normalize(z0, dim=1) * F.normalize(z1, dim=1))
                                         .sum(1).mean().detach())
            self.local_batch_sum = float(views[0].sum())
            return self.criterion(z0, z1)


    class Record(pl.Callback):
        def __init__(self):
            self.steps = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            stats = {k: float(v) for k, v in module.criterion.last_stats.items()
                     if v.numel() == 1}
            self.steps.append(dict(stats, local_alignment=module.local_alignment,
                                   batch_sum=module.local_batch_sum,
                                   loss_out=float(outputs["loss"])))

        def on_train_end(self, trainer, module):
            params = torch.cat([p.detach().flatten() for p in module.parameters()])
            with open(f"{out_dir}/rank{trainer.global_rank}.json", "w") as handle:
                json.dump({"world_size": trainer.world_size, "global_step": trainer.global_step,
                           "steps": self.steps, "param_sum": float(params.double().sum()),
                           "param_abs_sum": float(params.double().abs().sum())}, handle)


    pl.seed_everything(0)
    backbone, dim = small_cnn(width=4)
    module = Probe(backbone, dim, MACLLoss(temperature=0.1, alpha=0.5, a0=0.0,
                                           gather_distributed=True),
                   hidden_dim=32, output_dim=16, lr=1e-2, lr_schedule="constant")
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=2,
                         callbacks=[Record()], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(module, DataLoader(TwoViews(), batch_size=8, shuffle=True))
    # as every distributed script should before it exits: gloo's threads left running abort
    # the interpreter's shutdown now and then (SIGABRT, "terminate called without an active
    # exception")
    torch.distributed.destroy_process_group()
''')


@pytest.mark.slow
def test_two_cpu_ddp_ranks_share_the_macl_temperature(tmp_path):
    ranks = run_ddp_script(SCRIPT, tmp_path, timeout=150)
    for rank in ranks:
        assert rank["world_size"] == 2 and rank["global_step"] == 2
        assert len(rank["steps"]) == 2
    for s0, s1 in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True):
        # the ranks trained on different shards (DistributedSampler) ...
        assert s0["batch_sum"] != pytest.approx(s1["batch_sum"])
        assert s0["local_alignment"] != pytest.approx(s1["local_alignment"], abs=1e-6)
        # ... yet used one temperature, from the all-reduced alignment (mean of the two ranks)
        assert s0["temperature"] == s1["temperature"]
        assert s0["alignment"] == s1["alignment"]
        mean_alignment = 0.5 * (s0["local_alignment"] + s1["local_alignment"])
        assert s0["alignment"] == pytest.approx(mean_alignment, abs=1e-5)
        assert s0["temperature"] == pytest.approx(0.1 * (1 + 0.5 * s0["alignment"]), rel=1e-5)
    # DDP averaged the gradients: both ranks end with the same weights
    assert ranks[0]["param_sum"] == pytest.approx(ranks[1]["param_sum"], rel=1e-6)
    assert ranks[0]["param_abs_sum"] == pytest.approx(ranks[1]["param_abs_sum"], rel=1e-6)
