"""What several recipes share: GraphCL training and its devices (``tu``, ``moleculenet``), the
graph recipes' report pieces, the evaluation of a frozen sentence encoder (``sts``,
``transfer``), the CIFAR-10 ``.npz`` copies and CLIP's prompts (``images``, ``clip``)."""
