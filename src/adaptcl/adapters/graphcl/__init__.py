"""GraphCL on torch-geometric with the adaptive losses of :mod:`adaptcl.plugins`.

* augmentations as ``BaseTransform`` subclasses (:mod:`.transforms`): :class:`NodeDrop`,
  :class:`EdgePerturb`, :class:`AttrMask`, :class:`Subgraph`, :class:`RandomChoice`,
  :func:`graphcl_augmentation` (GraphCL's names ``dnodes``/``random2``/...), and
  :class:`TwoViewDataset` for the two views of each graph; node features for graphs without
  them (:mod:`.features`): :class:`ConstantFeatures`, :class:`CappedOneHotDegree`;
* encoders (:mod:`.encoders`): :class:`TUGINEncoder` (GraphCL's TU GIN, 3 x 32, 96-dim) and
  :class:`MolGINEncoder` (Hu et al. 2020, 5 x 300, OGB atom/bond encoders);
* the models (:mod:`.model`): :class:`GraphCL`, the fine-tuning :class:`MolPropertyModel`
  (encoder + linear multi-task head), the loss factory :func:`graphcl_loss`
  (``"dcl"``, also by GraphCL's name ``"graphcl"``, ``"infonce"``, ``"macl"``, ``"dystress"``,
  ``"temperature_schedule"``, ``"learnable_temperature"``, or any ``nn.Module``), and
  :func:`train_epoch` (``device=``, ``precision="32" | "bf16-mixed" | "16-mixed"``);
  the loss names (:mod:`.names`, which imports no framework);
* the same pre-training under PyTorch Lightning, on one device or several (``strategy="ddp"``,
  negatives gathered across ranks): :class:`~adaptcl.adapters.graphcl.lightning.GraphCLModule`
  in :mod:`adaptcl.adapters.graphcl.lightning`, imported from there (this package does not
  import Lightning).

The names are imported from their module on first use (``pip install 'adaptcl[graph]'``).

References: You et al., "Graph Contrastive Learning with Augmentations", NeurIPS 2020;
Hu et al., "Strategies for Pre-training Graph Neural Networks", ICLR 2020; Huang et al.,
"Model-Aware Contrastive Learning: Towards Escaping the Dilemmas", ICML 2023.

Example::

    from torch_geometric.loader import DataLoader
    from adaptcl.adapters.graphcl import (GraphCL, Identity, TUGINEncoder, TwoViewDataset,
                                          graphcl_augmentation)
    pairs = TwoViewDataset(dataset, Identity(), graphcl_augmentation("random2"))
    model = GraphCL(TUGINEncoder(dataset.num_features), loss_fn="macl")
    for b0, b1 in DataLoader(pairs, batch_size=128, shuffle=True):
        loss = model(b0, b1)
"""

from typing import TYPE_CHECKING

from adaptcl.adapters import lazy_exports
from adaptcl.adapters.graphcl.names import LOSS_ALIASES, LOSS_NAMES

if TYPE_CHECKING:  # pragma: no cover - for type checkers; at run time __getattr__ imports them
    from .encoders import MolGINEncoder, TUGINEncoder
    from .features import CappedOneHotDegree, ConstantFeatures
    from .model import GraphCL, MolPropertyModel, graphcl_loss, projection_head, train_epoch
    from .molecules import (
        MoleculeDataset,
        featurise_smiles,
        load_moleculenet,
        load_smiles_dataset,
        murcko_scaffold,
        read_moleculenet_csv,
        scaffold_split,
        smiles_to_data,
    )
    from .transforms import (
        AttrMask,
        EdgePerturb,
        GraphAugmentation,
        Identity,
        NodeDrop,
        RandomChoice,
        Subgraph,
        TwoViewDataset,
        graphcl_augmentation,
        worker_generator,
    )

_EXPORTS = {
    **dict.fromkeys(("MolGINEncoder", "TUGINEncoder"), "encoders"),
    **dict.fromkeys(("CappedOneHotDegree", "ConstantFeatures"), "features"),
    **dict.fromkeys(("GraphCL", "MolPropertyModel", "graphcl_loss", "projection_head",
                     "train_epoch"), "model"),
    **dict.fromkeys(("MoleculeDataset", "featurise_smiles", "load_moleculenet",
                     "load_smiles_dataset", "murcko_scaffold", "read_moleculenet_csv",
                     "scaffold_split", "smiles_to_data"), "molecules"),
    **dict.fromkeys(("AttrMask", "EdgePerturb", "GraphAugmentation", "Identity", "NodeDrop",
                     "RandomChoice", "Subgraph", "TwoViewDataset", "graphcl_augmentation",
                     "worker_generator"), "transforms"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

__all__ = [
    "AttrMask", "CappedOneHotDegree", "ConstantFeatures", "EdgePerturb", "GraphAugmentation",
    "Identity", "NodeDrop", "RandomChoice", "Subgraph", "TwoViewDataset", "graphcl_augmentation",
    "worker_generator",
    "TUGINEncoder", "MolGINEncoder", "GraphCL", "MolPropertyModel", "graphcl_loss", "LOSS_NAMES",
    "LOSS_ALIASES", "projection_head",
    "train_epoch",
    "MoleculeDataset", "featurise_smiles", "load_moleculenet", "load_smiles_dataset",
    "murcko_scaffold", "read_moleculenet_csv", "scaffold_split", "smiles_to_data",
]
