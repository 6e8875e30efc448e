"""The data of ``adaptcl moleculenet``: the pre-training's SMILES corpus and each MoleculeNet set
with its scaffold split, featurised once and cached (:mod:`adaptcl.adapters.graphcl.molecules`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adaptcl.recipes.engine.cells import RunLayout
from adaptcl.recipes.engine.errors import RecipeError, warnings_as_notes
from adaptcl.recipes.moleculenet.config import DEFAULT_PRETRAIN_SMILES, MoleculeNetConfig


def corpus_path(cfg: MoleculeNetConfig, data_root: Path) -> Path:
    """The pre-training's SMILES file: ``--pretrain-smiles``, or the default under the root."""
    if cfg.pretrain_smiles is not None:
        return Path(cfg.pretrain_smiles)
    return data_root.joinpath(*DEFAULT_PRETRAIN_SMILES)


def cache_folder(cfg: MoleculeNetConfig) -> Path:
    """Where featurised datasets are cached: ``--cache-dir``, else ``<output-dir>/cache``."""
    return Path(cfg.cache_dir) if cfg.cache_dir else RunLayout(cfg.output_dir).folder("cache")


def load_corpus(cfg: MoleculeNetConfig, data_root: Path) -> Any:
    """The first ``pretrain_molecules`` valid molecules of the corpus (a ``MoleculeDataset``)."""
    from adaptcl.adapters.graphcl.molecules import load_smiles_dataset

    with warnings_as_notes(RuntimeWarning):  # a corrupt featurisation cache, rebuilt
        corpus = load_smiles_dataset(corpus_path(cfg, data_root), cache_dir=cache_folder(cfg),
                                     limit=cfg.pretrain_molecules, progress=cfg.progress)
    if len(corpus) < 2:
        raise RecipeError("the pre-training corpus needs at least 2 valid molecules, "
                          f"{corpus_path(cfg, data_root)} has {len(corpus)}")
    return corpus


def load_split_dataset(cfg: MoleculeNetConfig, name: str,
                       data_root: Path) -> tuple[Any, tuple[list[int], list[int], list[int]]]:
    """A MoleculeNet set (its first ``max_molecules`` rows) and its scaffold split (train, valid,
    test indices); a malformed CSV is one line naming the set and the root."""
    from adaptcl.adapters.graphcl.molecules import load_moleculenet, scaffold_split

    try:
        with warnings_as_notes(RuntimeWarning):  # a corrupt featurisation cache, rebuilt
            dataset = load_moleculenet(name, data_root, cache_dir=cache_folder(cfg),
                                       limit=cfg.max_molecules)
    except (ValueError, KeyError) as err:
        raise RecipeError(f"reading MoleculeNet {name!r} under {data_root}: {err}") from err
    split = scaffold_split(dataset.smiles, cfg.frac_train, cfg.frac_valid,
                           1.0 - cfg.frac_train - cfg.frac_valid)
    return dataset, split
