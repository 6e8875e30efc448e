"""Molecule data: OGB featurisation, MoleculeNet CSVs by column name, cache, scaffold split."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import torch

pytest.importorskip("torch_geometric")
pytest.importorskip("ogb")
pytest.importorskip("rdkit")

from adaptcl.adapters.graphcl import molecules as mol  # noqa: E402


@pytest.fixture(scope="module")
def mol_cache(tmp_path_factory):
    """One processed-graph cache for the module, so each CSV is featurised once."""
    return tmp_path_factory.mktemp("molcache")

# ---------------------------------------------------------------------------- featurisation


def test_smiles_to_data_ogb_features_and_invalid_inputs():
    ethanol = mol.smiles_to_data("CCO")
    assert ethanol.num_nodes == 3
    assert ethanol.x.shape == (3, 9) and ethanol.x.dtype == torch.long
    assert ethanol.edge_index.shape == (2, 4) and ethanol.edge_attr.shape == (4, 3)
    assert ethanol.edge_attr.dtype == torch.long
    # atomic number is OGB's first atom feature (index = Z - 1)
    assert ethanol.x[:, 0].tolist() == [5, 5, 7]
    benzene = mol.smiles_to_data("c1ccccc1")
    assert benzene.num_nodes == 6 and benzene.edge_index.size(1) == 12
    assert set(benzene.edge_attr[:, 0].tolist()) == {3}  # OGB bond type 3 = aromatic
    for bad in ("C1CC", "not a smiles", "", "   ", "C(C)(C)(C)(C)C"):
        assert mol.smiles_to_data(bad) is None


def test_featurise_smiles_skips_and_counts_invalid_with_labels():
    smiles = ["CCO", "C1CC", "c1ccccc1", "", "CC(=O)O"]
    labels = torch.tensor([[1.0, math.nan], [0.0, 1.0], [0.0, 0.0], [1.0, 1.0], [math.nan, 1.0]])
    graphs, invalid = mol.featurise_smiles(smiles, labels)
    assert invalid == [1, 3]
    assert [g.num_nodes for g in graphs] == [3, 6, 4]
    assert torch.equal(graphs[0].y.isnan(), torch.tensor([[False, True]]))
    assert graphs[2].y.shape == (1, 2) and graphs[2].y[0, 1] == 1.0
    with pytest.raises(ValueError):
        mol.featurise_smiles(smiles, labels[:3])


def test_graphs_agree_with_torch_geometric_from_smiles(shared_data):
    from torch_geometric.utils import from_smiles

    smiles, _, _ = mol.read_moleculenet_csv("bace", shared_data, limit=60)
    graphs, invalid = mol.featurise_smiles(smiles)
    assert invalid == []
    for s, g in zip(smiles, graphs, strict=True):
        ref = from_smiles(s)
        assert g.num_nodes == ref.num_nodes
        assert g.edge_index.size(1) == ref.edge_index.size(1)
        assert torch.equal(g.x[:, 0] + 1, ref.x[:, 0])  # both store the atomic number


# ------------------------------------------------------------------------------ CSV reading


def test_moleculenet_csvs_read_by_column_name(shared_data):
    smiles, y, tasks = mol.read_moleculenet_csv("bbbp", shared_data)
    assert len(smiles) == 2050 and tasks == ["p_np"] and y.shape == (2050, 1)
    assert smiles[0] == "[Cl].CC(C)NCC(O)COc1cccc2ccccc12"  # quoted names with commas parsed
    assert set(y.flatten().tolist()) == {0.0, 1.0}
    # MUV: chemprop layout (smiles first, no mol_id), gzipped; tasks picked by name
    smiles, y, tasks = mol.read_moleculenet_csv("muv", shared_data, limit=500)
    assert len(tasks) == 17 and tasks[0] == "MUV-466" and y.shape == (500, 17)
    assert y.isnan().any() and not smiles[0].startswith("MUV")
    smiles, y, tasks = mol.read_moleculenet_csv("toxcast", shared_data, limit=50)
    assert len(tasks) == 617 and "smiles" not in tasks
    _, y, tasks = mol.read_moleculenet_csv("hiv", shared_data, limit=50)
    assert tasks == ["HIV_active"]  # the 'activity' text column is not a task
    smiles, y, tasks = mol.read_moleculenet_csv("bace", shared_data, limit=5)
    assert tasks == ["Class"] and "c" in smiles[0].lower()
    _, y, tasks = mol.read_moleculenet_csv("tox21", shared_data)
    assert len(tasks) == 12 and y.shape == (7831, 12) and 0.1 < y.isnan().float().mean() < 0.3
    with pytest.raises(ValueError):
        mol.read_moleculenet_csv("not-a-set", shared_data)
    with pytest.raises(FileNotFoundError):
        mol.read_moleculenet_csv("bbbp", shared_data / "zinc")


def test_read_smiles_file_with_and_without_header(shared_data, tmp_path):
    zinc = mol.read_smiles_file(shared_data / "zinc" / "moses" / "test.csv.gz", limit=5)
    assert len(zinc) == 5 and zinc[0] != "SMILES"
    plain = mol.read_smiles_file(shared_data / "zinc" / "jtvae_zinc250k" / "test.txt", limit=3)
    assert len(plain) == 3 and all(mol.smiles_to_data(s) is not None for s in plain)
    f = tmp_path / "s.csv"
    f.write_text("id,Smiles\n1,CCO\n2,c1ccccc1\n")
    assert mol.read_smiles_file(f) == ["CCO", "c1ccccc1"]
    with pytest.raises(KeyError):
        mol.read_smiles_file(f, column="nope")


# ---------------------------------------------------------------------- dataset and cache


def test_load_moleculenet_counts_invalid_and_caches(shared_data, mol_cache, tmp_path):
    ds = mol.load_moleculenet("bbbp", shared_data, cache_dir=mol_cache)
    assert len(ds) == 2039 and ds.num_invalid == 11 and ds.num_tasks == 1
    assert len(ds) + ds.num_invalid == 2050
    assert len(list(mol_cache.glob("bbbp-*.pt"))) == 1
    again = mol.load_moleculenet("bbbp", shared_data, cache_dir=mol_cache)
    assert again.smiles == ds.smiles and again.rows == ds.rows
    assert again.invalid_rows == ds.invalid_rows
    for i in (0, 500, 2038):
        for key in ("x", "edge_index", "edge_attr"):
            assert torch.equal(getattr(again[i], key), getattr(ds[i], key))
        assert torch.equal(again[i].y, ds[i].y)
    info = ds.info()
    assert info["num_molecules"] == 2039 and 0.7 < info["positive_rate"] < 0.8
    # the row limit is part of the key; a corrupt cache file is rebuilt, not fatal
    cache = tmp_path / "cache"
    small = mol.load_moleculenet("bbbp", shared_data, cache_dir=cache, limit=100)
    assert len(small) + small.num_invalid == 100 and small.smiles == ds.smiles[:len(small)]
    files = list(cache.glob("bbbp-*.pt"))
    assert len(files) == 1 and files[0].name not in {p.name for p in mol_cache.glob("*.pt")}
    files[0].write_bytes(b"garbage")
    with pytest.warns(RuntimeWarning, match=files[0].name):
        rebuilt = mol.load_moleculenet("bbbp", shared_data, cache_dir=cache, limit=100)
    assert rebuilt.smiles == small.smiles
    assert torch.equal(mol.MoleculeDataset.load(files[0])[5].x, small[5].x)


def test_augmenting_an_item_leaves_the_stored_graph_alone():
    from adaptcl.adapters.graphcl import AttrMask, EdgePerturb

    graphs, _ = mol.featurise_smiles(["c1ccccc1CCO", "CC(=O)Nc1ccc(O)cc1"])
    ds = mol.MoleculeDataset(graphs, ["a", "b"], [0, 1], [], [])
    before = [(g.x.clone(), g.edge_index.clone()) for g in ds.graphs]
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        view = EdgePerturb(0.5, generator=gen)(ds[0])
        view = AttrMask(0.5, mode="zero", generator=gen)(view)
        assert not torch.equal(view.x, before[0][0])
    for g, (x, ei) in zip(ds.graphs, before, strict=True):
        assert torch.equal(g.x, x) and torch.equal(g.edge_index, ei)
    sub = ds.subset([1])
    assert len(sub) == 1 and sub.smiles == ["b"] and sub[0].num_nodes == graphs[1].num_nodes


def test_cache_key_changes_with_content(tmp_path):
    f = tmp_path / "a.smi"
    f.write_text("CCO\n")
    k1 = mol.cache_key(f, limit=None)
    assert mol.cache_key(f, limit=None) == k1 and mol.cache_key(f, limit=5) != k1
    f.write_text("CCN\n")
    assert mol.cache_key(f, limit=None) != k1


# ---------------------------------------------------------------------------- scaffold split


def _check_split(smiles, split):
    train, valid, test = split
    n = len(smiles)
    assert sorted(train + valid + test) == list(range(n))  # a partition
    scaff = [mol.murcko_scaffold(s) for s in smiles]
    parts = [{scaff[i] for i in p} for p in split]
    assert not parts[0] & parts[1] and not parts[0] & parts[2] and not parts[1] & parts[2]
    for part, frac in zip(split, (0.8, 0.1, 0.1), strict=True):
        assert abs(len(part) - frac * n) <= 1, (len(part), frac * n)


# sha256 of json.dumps(scaffold_split(BBBP's 2039 RDKit-valid SMILES)) -- the split every run
# must reproduce (RDKit 2026.09; a new RDKit that changes scaffold SMILES would change it).
BBBP_SPLIT_SHA256 = "5fcf9a664c70561ad1654391f76b0662f99d1468e852768249b90c3f8fbcbab4"


@pytest.mark.parametrize("name", ["bbbp", "bace", "clintox"])
def test_scaffold_split_real_data(shared_data, mol_cache, name):
    ds = mol.load_moleculenet(name, shared_data, cache_dir=mol_cache)
    split = mol.scaffold_split(ds.smiles)
    _check_split(ds.smiles, split)
    if name == "bbbp":  # the same split on every run, in every process
        assert [len(p) for p in split] == [1631, 204, 204]
        assert split[2][:5] == [5, 6, 7, 8, 13]
        assert hashlib.sha256(json.dumps(split).encode()).hexdigest() == BBBP_SPLIT_SHA256
        assert mol.scaffold_split(list(ds.smiles)) == split


def test_scaffold_split_hand_example_and_tie_break():
    benz = ["c1ccccc1C", "c1ccccc1CC", "c1ccccc1O", "c1ccccc1N"]       # scaffold c1ccccc1
    hexa = ["C1CCCCC1C", "C1CCCCC1O", "C1CCCCC1N"]                     # C1CCCCC1
    acyc = ["CCO", "CCCN"]                                             # '' (acyclic)
    pyri = ["c1ccncc1"]                                                # c1ccncc1
    smiles = acyc[:1] + benz + hexa + acyc[1:] + pyri                  # indices 0..9
    train, valid, test = mol.scaffold_split(smiles)
    # sets by size: benzene (4) and cyclohexane (3) fill train to 7; the acyclic pair does not
    # fit (9 > 8) and goes to valid (9 <= 9); pyridine (1) still fits train (8 <= 8).
    assert train == [1, 2, 3, 4, 5, 6, 7, 9] and valid == [0, 8] and test == []
    # ties: Hu et al. sort (size, first index) descending -> the later-starting set goes first
    tie = ["CCO", "c1ccccc1C", "C1CCCCC1C", "c1ccccc1O", "C1CCCCC1O", "C1CC1", "C1CC1C",
           "C1CCC1", "C1CCC1C", "C1CCCC1", "C1CCCC1C"]
    n = len(tie)
    tr, va, te = mol.scaffold_split(tie, 0.2, 0.4, 0.4)  # train cutoff 2.2: one pair fits
    # pairs start at 1 (benzene), 2 (cyclohexane), 5, 7, 9: the pair starting at 9 goes first
    assert tr == [9, 10] and sorted(tr + va + te) == list(range(n))
    with pytest.raises(ValueError):
        mol.scaffold_split(tie, 0.8, 0.1, 0.2)


def test_non_numeric_label_names_the_file_line_and_column(tmp_path):
    root = tmp_path / "data"
    raw = root / "moleculenet" / "bbbp" / "raw"
    raw.mkdir(parents=True)
    (raw / "BBBP.csv").write_text("num,name,p_np,smiles\n1,a,1,CCO\n2,b,yes,CCN\n")
    with pytest.raises(ValueError, match=r"label 'yes' at .*BBBP\.csv:3, column 'p_np' is not "
                                         r"a number \(0, 1 or empty\)"):
        mol.read_moleculenet_csv("bbbp", root)


def test_truncated_featurisation_cache_is_named_in_a_warning_and_rebuilt(tmp_path):
    smiles = tmp_path / "s.txt"
    smiles.write_text("CCO\nc1ccccc1\nCC(=O)O\nCCN\n")
    cache = tmp_path / "cache"
    first = mol.load_smiles_dataset(smiles, cache_dir=cache)
    (path,) = cache.glob("*.pt")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # a kill mid-write
    with pytest.warns(RuntimeWarning, match=rf"featurisation cache .*{path.name}.* is corrupt "
                                            r"or truncated.*rebuilding it"):
        rebuilt = mol.load_smiles_dataset(smiles, cache_dir=cache)
    assert rebuilt.smiles == first.smiles
    assert all(torch.equal(a.x, b.x) for a, b in zip(rebuilt, first, strict=True))
    reloaded = mol.MoleculeDataset.load(path)  # the rebuilt cache is whole again
    assert reloaded.smiles == first.smiles
