"""``python -m adaptcl``: the ``adaptcl`` command (:func:`adaptcl.cli.main`), for launchers that
run a module rather than a script, e.g. ``torchrun --nproc-per-node 2 -m adaptcl simcse ...``."""

import sys

from adaptcl.cli import main

if __name__ == "__main__":
    sys.exit(main())
