"""The recipe template and the modules it drives, one job each.

* :mod:`~adaptcl.recipes.template.recipe`: :class:`Recipe`, the template every recipe fills in.
* :mod:`~adaptcl.recipes.template.options`: the shared command-line vocabulary.
* :mod:`~adaptcl.recipes.template.config`: which config fields make a run's identity; checks.
* :mod:`~adaptcl.recipes.template.errors`: user errors (one line, exit 2) and non-results.
* :mod:`~adaptcl.recipes.template.store`: cells, the run store, :func:`run_grid`.
* :mod:`~adaptcl.recipes.template.jobs`: ``--jobs`` / ``--cluster``: cells as submitit jobs.
* :mod:`~adaptcl.recipes.template.report`: summaries, paired CIs, tables, result files.
* :mod:`~adaptcl.recipes.template.provenance`: hashes, fingerprints, code version, environment.
* :mod:`~adaptcl.recipes.template.torch_env`: threads, device, precision, seeding.
* :mod:`~adaptcl.recipes.template.loggers`, :mod:`~adaptcl.recipes.template.plots`,
  :mod:`~adaptcl.recipes.template.progress`, :mod:`~adaptcl.recipes.template.files`.

Every module imports only the standard library at import time, so ``--help`` stays instant.
"""
