"""How the ``[A, C]`` row statistics of a loss are computed when its logits are not materialised.

Every loss here is one similarity step and one row-wise log-sum-exp, so a batch too large for
its logits is computed exactly in tiles. This package holds the machinery below the methods,
all of it private (users choose through a loss's ``tile_size`` and the scoped setting
:class:`~adaptcl.plugins.execution.tiling`, and read what ran in ``last_stats.plan``); the
methods describe their math (a term, label targets, a pair temperature) and never name a
backend:

* ``_dispatch``: the dispatcher, planning each loss call once (materialise or a backend, and
  the tile) from the call's problem, the loss's ``tile_size`` and the setting, and running
  every op of the call on the plan's backend; it registers the backends;
* ``_backend``: what a backend is handed (the frozen ``Problem``) and answers (``why_not`` and
  its ops);
* ``_loop``: the PyTorch tile loop, the reference backend and what runs on CPUs (online
  log-sum-exp forward, recomputing backward);
* ``_kernel_backend``, ``_fused``, ``_triton_rowstats``, ``_triton_pairlse``,
  ``_triton_common``, ``_configs``: the fused Triton kernels as a backend, registered as
  :mod:`torch.library` ops and imported on first use only, and their fixed block configurations
  per GPU architecture;
* ``_budget``: the logits budget beyond which a ``tile_size="auto"`` loss takes its tiled path;
* ``_terms``: the typed descriptions of a method's math that the kernels translate.

The precision of the products, one policy for every path, is the core's ground floor
(``adaptcl.plugins._products``), below the candidates and these tiles.
"""
