"""How the ``[A, C]`` row statistics of a loss are computed when its logits are not materialised.

Every loss here is one similarity step and one row-wise log-sum-exp, so a batch too large for
its logits is computed exactly in tiles. This package holds the machinery below the methods;
the methods describe their math (a term, label targets, a pair temperature) and never name a
backend:

* :mod:`~adaptcl.plugins.tiles.dispatch`: the dispatcher above both backends, planning each
  loss call once (materialise, the loop or the kernel, and the tile) from the loss's
  ``tile_size`` and the scoped setting :class:`~adaptcl.plugins.tiling`;
* :mod:`~adaptcl.plugins.tiles.loop`: the PyTorch tile loop, the reference and what runs on
  CPUs (online log-sum-exp forward, recomputing backward);
* :mod:`~adaptcl.plugins.tiles.budget`: the logits budget beyond which a ``tile_size="auto"``
  loss takes its tiled path;
* :mod:`~adaptcl.plugins.tiles.precision`: the precision of the products (bf16 / fp16 inputs
  on tensor cores, float32 by PyTorch's setting, float64 exact) and the one product function
  every path uses;
* :mod:`~adaptcl.plugins.tiles.terms`: the typed descriptions of a method's math that the
  kernels translate;
* ``_fused``, ``_triton_rowstats``, ``_triton_pairlse``, ``_triton_common``, ``_configs``
  (private): the fused Triton kernels, registered as :mod:`torch.library` ops and imported on
  first use only, and their fixed block configurations per GPU architecture.
"""
