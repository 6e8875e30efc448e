"""GraphCL encoders, loss factory and model: shapes, gradients, pooling, parity with GraphCL."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch_geometric")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch_geometric.data import Batch, Data  # noqa: E402
from torch_geometric.loader import DataLoader  # noqa: E402

from adaptcl.adapters.graphcl import (  # noqa: E402
    GraphCL,
    Identity,
    MolGINEncoder,
    MolPropertyModel,
    TUGINEncoder,
    TwoViewDataset,
    graphcl_augmentation,
    graphcl_loss,
)


def random_graphs(num: int, features: int = 5, seed: int = 0) -> list[Data]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num):
        n = int(torch.randint(3, 15, (1,), generator=g))
        ei = torch.randint(0, n, (2, 2 * n), generator=g)
        ei = torch.cat([ei, ei.flip(0)], dim=1)
        out.append(Data(x=torch.rand(n, features, generator=g), edge_index=ei))
    return out


def molecules(smiles: list[str]) -> list[Data]:
    from ogb.utils import smiles2graph

    data = []
    for s in smiles:
        g = smiles2graph(s)
        data.append(Data(x=torch.from_numpy(g["node_feat"]),
                         edge_index=torch.from_numpy(g["edge_index"]),
                         edge_attr=torch.from_numpy(g["edge_feat"]),
                         num_nodes=int(g["num_nodes"])))
    return data


# ----------------------------------------------------------------------------------- encoders


def test_tu_gin_shapes_gradients_and_sum_pooling():
    torch.manual_seed(0)
    graphs = random_graphs(6)
    batch = Batch.from_data_list(graphs)
    enc = TUGINEncoder(in_channels=5)
    assert enc.out_dim == 96
    g, nodes = enc(batch, return_nodes=True)
    assert g.shape == (6, 96) and nodes.shape == (batch.num_nodes, 96)
    g.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in enc.parameters())
    # in eval mode the batch embedding is the stack of per-graph embeddings (sum pooling)
    enc.eval()
    with torch.no_grad():
        together = enc(batch)
        alone = torch.cat([enc(Batch.from_data_list([d])) for d in graphs])
        assert torch.allclose(together, alone, atol=1e-5)
        # sum pooling of every layer, concatenated
        _, nodes = enc(batch, return_nodes=True)
        assert torch.allclose(together[0], nodes[batch.batch == 0].sum(0), atol=1e-5)


def test_tu_gin_without_features_uses_ones_and_custom_depth():
    data = Data(edge_index=torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), num_nodes=3)
    enc = TUGINEncoder(in_channels=1, hidden_channels=8, num_layers=5)
    out = enc(Batch.from_data_list([data, data]))
    assert out.shape == (2, 40)
    assert enc(data).shape == (1, 40)  # a plain Data is one graph


@pytest.mark.parametrize("jk, dim", [("last", 300), ("concat", 1500), ("sum", 300)])
def test_mol_gin_on_real_molecules(jk, dim):
    torch.manual_seed(0)
    mols = molecules(["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "C"])  # "C": no bonds
    batch = Batch.from_data_list(mols)
    enc = MolGINEncoder(jk=jk)
    assert enc.out_dim == dim and enc.num_layers == 5 and enc.emb_dim == 300
    g, nodes = enc(batch, return_nodes=True)
    assert g.shape == (4, dim) and nodes.shape[0] == batch.num_nodes
    g.pow(2).mean().backward()
    missing = [n for n, p in enc.named_parameters() if p.grad is None]
    # every atom/bond embedding table gets a gradient except rows no molecule uses, which
    # still have a (zero) grad tensor; nothing is disconnected
    assert missing == []
    assert all(torch.isfinite(p.grad).all() for p in enc.parameters())


def test_mol_gin_pooling_and_validation():
    mols = molecules(["CCN", "O=C=O"])
    batch = Batch.from_data_list(mols)
    enc = MolGINEncoder(num_layers=2, emb_dim=16, pooling="sum", drop_ratio=0.5).eval()
    assert enc(batch).shape == (2, 16)
    assert MolGINEncoder(num_layers=2, emb_dim=16, pooling="none")(batch).shape == (6, 16)
    with pytest.raises(ValueError):
        MolGINEncoder(num_layers=1)
    with pytest.raises(ValueError):
        MolGINEncoder(jk="max")


# ------------------------------------------------------------------------------------- losses


def graphcl_reference_loss(x: torch.Tensor, x_aug: torch.Tensor, T: float = 0.2) -> torch.Tensor:
    """``simclr.loss_cal`` of GraphCL's unsupervised_TU/gsimclr.py, as a test oracle."""
    n = x.size(0)
    sim = torch.einsum("ik,jk->ij", x, x_aug) / torch.einsum("i,j->ij", x.norm(dim=1),
                                                             x_aug.norm(dim=1))
    sim = torch.exp(sim / T)
    pos = sim[range(n), range(n)]
    return -torch.log(pos / (sim.sum(dim=1) - pos)).mean()


def test_graphcl_loss_matches_graphcl_code():
    torch.manual_seed(0)
    z0, z1 = torch.randn(32, 16, dtype=torch.float64), torch.randn(32, 16, dtype=torch.float64)
    loss = graphcl_loss("graphcl")(z0, z1)
    assert torch.allclose(loss, graphcl_reference_loss(z0, z1), atol=1e-8)
    assert torch.allclose(graphcl_loss("dcl", temperature=0.5)(z0, z1),
                          graphcl_reference_loss(z0, z1, 0.5), atol=1e-8)
    # InfoNCE keeps the positive in the denominator, so it is strictly larger
    assert graphcl_loss("infonce")(z0, z1) > loss


def test_macl_loss_adapts_temperature_and_reports_stats():
    torch.manual_seed(0)
    z0 = torch.randn(64, 8)
    z1 = z0 + 0.3 * torch.randn(64, 8)
    loss_fn = graphcl_loss("macl")
    loss = loss_fn(z0, z1)
    stats = loss_fn.last_stats
    a = torch.nn.functional.cosine_similarity(z0, z1).mean()
    assert torch.isfinite(loss)
    assert torch.allclose(stats["alignment"], a, atol=1e-5)
    assert torch.allclose(stats["temperature"], 0.2 * (1 + 0.5 * a), atol=1e-5)
    # alpha = 0 gives back GraphCL's loss exactly
    same = graphcl_loss("macl", alpha=0.0)(z0, z1)
    assert torch.allclose(same, graphcl_loss("graphcl")(z0, z1), atol=1e-6)


def test_dystress_is_graphcls_dcl_loss_with_pair_temperatures():
    """``graphcl_loss("dystress")``: GraphCL's one-direction loss without the positive in the
    denominator, each pair at ``tau(cos)`` in [tau, 2 tau], the temperature detached as in
    the authors' NT-Xent code; at tau_min = tau_max it is GraphCL's own loss."""
    from adaptcl.plugins import DySTreSSLoss

    torch.manual_seed(0)
    z0, z1 = torch.randn(12, 8, dtype=torch.float64), torch.randn(12, 8, dtype=torch.float64)
    loss_fn = graphcl_loss("dystress")
    assert isinstance(loss_fn, DySTreSSLoss)
    assert (loss_fn.min_temperature, loss_fn.max_temperature) == (0.2, 0.4)
    assert loss_fn.form == "cross_view" and not loss_fn.positive_in_denominator
    assert loss_fn.detach_temperature
    assert not graphcl_loss("dystress", detach_temperature=False).detach_temperature
    assert (graphcl_loss("dystress", temperature=0.1).min_temperature,
            graphcl_loss("dystress", temperature=0.1).max_temperature) == (0.1, 0.2)
    flat = graphcl_loss("dystress", max_temperature=0.2)  # tau_min = tau_max = GraphCL's 0.2
    torch.testing.assert_close(flat(z0, z1), graphcl_loss("graphcl")(z0, z1))
    assert not torch.allclose(loss_fn(z0, z1), graphcl_loss("graphcl")(z0, z1))
    assert graphcl_loss("dystress", shape="piecewise").shape == "piecewise"


def test_loss_factory_accepts_modules_and_rejects_unknown_names():
    class Custom(nn.Module):
        def forward(self, z0, z1):
            return (z0 - z1).pow(2).mean()

    custom = Custom()
    assert graphcl_loss(custom) is custom
    with pytest.raises(ValueError):
        graphcl_loss("ntxent-typo")
    with pytest.raises(TypeError):
        graphcl_loss(custom, alpha=1.0)


def _same_loss(a: nn.Module, b: nn.Module) -> bool:
    """Same class and the same constructor state (every attribute but the running stats)."""
    skip = {"last_stats", "training"}
    return type(a) is type(b) and {k: v for k, v in vars(a).items() if k not in skip} == \
        {k: v for k, v in vars(b).items() if k not in skip}


def test_graphcl_loss_takes_the_registry_names_graphcls_alias_and_old_spellings():
    import warnings

    from adaptcl.adapters.graphcl import LOSS_ALIASES, LOSS_NAMES
    from adaptcl.plugins import (
        DCLLoss,
        DySTreSSLoss,
        InfoNCELoss,
        LearnableTemperatureLoss,
        MACLLoss,
        TemperatureScheduleLoss,
    )

    built = {"dcl": DCLLoss, "infonce": InfoNCELoss, "macl": MACLLoss, "dystress": DySTreSSLoss,
             "temperature_schedule": TemperatureScheduleLoss,
             "learnable_temperature": LearnableTemperatureLoss}
    assert LOSS_NAMES == ("dcl", "infonce", "macl", "dystress", "temperature_schedule",
                          "learnable_temperature")
    assert LOSS_NAMES == tuple(built) and LOSS_ALIASES == {"graphcl": "dcl"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # canonical names and GraphCL's alias: no note
        for name in LOSS_NAMES:
            assert type(graphcl_loss(name)) is built[name]
        assert _same_loss(graphcl_loss("graphcl"), graphcl_loss("dcl"))
        assert _same_loss(graphcl_loss("GraphCL", temperature=0.5),
                          graphcl_loss("dcl", temperature=0.5))
    assert not _same_loss(graphcl_loss("dcl", temperature=0.5), graphcl_loss("dcl"))
    with pytest.warns(FutureWarning, match="loss 'nt_xent' is deprecated; use 'infonce'"):
        old = graphcl_loss("nt_xent", temperature=0.3)
    assert _same_loss(old, graphcl_loss("infonce", temperature=0.3))
    with pytest.raises(ValueError, match=r"loss 'ascl' is not available here; choose from "
                                         r"dcl, infonce, macl, dystress, temperature_schedule, "
                                         r"learnable_temperature, graphcl \(= dcl\)"):
        graphcl_loss("ascl")
    with pytest.raises(TypeError, match="loss name"):
        graphcl_loss(3)


# -------------------------------------------------------------------------------------- model


@pytest.mark.parametrize("loss", ["graphcl", "macl", "infonce", "dystress"])
def test_graphcl_model_trains_one_step(loss):
    torch.manual_seed(0)
    graphs = random_graphs(16)
    pairs = TwoViewDataset(graphs, Identity(), graphcl_augmentation("random4", 0.2))
    model = GraphCL(TUGINEncoder(5), loss_fn=loss)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    b0, b1 = next(iter(DataLoader(pairs, batch_size=16)))
    before = [p.detach().clone() for p in model.parameters()]
    value = model(b0, b1)
    value.backward()
    opt.step()
    assert value.dim() == 0 and torch.isfinite(value)
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert "loss" in model.last_stats
    if loss in ("macl", "dystress"):
        assert "temperature" in model.last_stats
    model.eval()
    emb = model.embed(b0)
    assert emb.shape == (16, 96) and not emb.requires_grad  # no projection head, no graph
    assert model.project(b0).shape == (16, 96)


def test_graphcl_model_custom_loss_and_head_and_checks():
    class Mse(nn.Module):
        def forward(self, z0, z1):
            return (z0 - z1).pow(2).mean()

    enc = TUGINEncoder(5, hidden_channels=8, num_layers=2)
    model = GraphCL(enc, loss_fn=Mse(), proj_dim=4, xavier_init=False)
    b = Batch.from_data_list(random_graphs(3))
    assert model.project(b).shape == (3, 4)
    assert model(b, b).dim() == 0
    assert model.last_stats == {}
    with pytest.raises(ValueError):
        model(b, Batch.from_data_list(random_graphs(2)))
    with pytest.raises(ValueError):
        GraphCL(nn.Linear(3, 3))
    # default loss is GraphCL's DCL
    assert type(GraphCL(TUGINEncoder(5)).loss_fn).__name__ == "DCLLoss"


def test_mol_encoder_inside_graphcl_model():
    mols = molecules(["CCO", "c1ccccc1O", "CCN", "CC(C)O"])
    pairs = TwoViewDataset(mols, graphcl_augmentation("dnodes", 0.2),
                           graphcl_augmentation("subgraph", 0.2))
    b0, b1 = next(iter(DataLoader(pairs, batch_size=4)))
    model = GraphCL(MolGINEncoder(num_layers=2, emb_dim=32), loss_fn=graphcl_loss(
        "macl", temperature=0.1), xavier_init=False)
    loss = model(b0, b1)
    loss.backward()
    assert torch.isfinite(loss)


def test_plugins_do_not_import_torch_geometric():
    code = ("import sys, adaptcl.plugins; "
            "assert 'torch_geometric' not in sys.modules, 'plugins imported torch_geometric'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("name", ["graphcl", "infonce", "macl", "dystress"])
def test_tile_size_passes_through_the_loss_factory(name):
    torch.manual_seed(0)
    z0, z1 = torch.randn(9, 16, requires_grad=True), torch.randn(9, 16, requires_grad=True)
    tiled = graphcl_loss(name, tile_size=4)
    assert tiled.tile_size == 4
    torch.testing.assert_close(tiled(z0, z1), graphcl_loss(name)(z0, z1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["graphcl", "macl"])
def test_tile_size_passes_through_the_loss_factory_and_a_budget_switches(name, monkeypatch):
    from adaptcl.plugins import LogitsBudgetWarning, tiling
    from adaptcl.plugins.tiles import _budget as budget

    monkeypatch.setattr(budget, "_SAID", set())  # said once a process: not yet here

    torch.manual_seed(0)
    z0, z1 = torch.randn(90, 16, requires_grad=True), torch.randn(90, 16, requires_grad=True)
    assert graphcl_loss(name, tile_size=16).tile_size == 16
    capped = graphcl_loss(name)
    assert capped.tile_size == "auto"
    with pytest.warns(LogitsBudgetWarning), tiling(max_logits_bytes=1):
        value = capped(z0, z1)
    assert capped.last_stats["auto_tile_size"].item() == 64
    torch.testing.assert_close(value, graphcl_loss(name)(z0, z1), rtol=1e-5, atol=1e-6)


def test_property_model_starts_from_a_graphcl_encoder_and_gives_one_logit_per_task():
    torch.manual_seed(0)
    pretrained = GraphCL(MolGINEncoder(num_layers=2, emb_dim=16), loss_fn="macl")
    model = MolPropertyModel(MolGINEncoder(num_layers=2, emb_dim=16), num_tasks=3)
    model.encoder.load_state_dict(pretrained.encoder.state_dict())
    assert {k.split(".")[0] for k in model.state_dict()} == {"encoder", "head"}
    batch = Batch.from_data_list(molecules(["CCN", "O=C=O", "c1ccccc1"]))
    model.eval()
    logits = model(batch)
    assert logits.shape == (3, 3)
    assert torch.allclose(logits, model.head(pretrained.encoder.eval()(batch)))
    with pytest.raises(ValueError, match="num_tasks must be an integer >= 1, got 0"):
        MolPropertyModel(MolGINEncoder(num_layers=2, emb_dim=16), num_tasks=0)
    with pytest.raises(ValueError, match="out_dim"):
        MolPropertyModel(nn.Linear(3, 3), num_tasks=1)
