"""``adaptcl <recipe> ...`` (this script's arguments) in which rank 0 of a run on two devices,
at its 20th training step, waits a second and then sends SIGTERM to the whole process group:
rank 1 is then waiting in the step's first collective (the loss's all-gather) while rank 0 is
in Python, where a SIGTERM handler that runs a collective of its own (Lightning's) meets the
other rank's. Lightning's launcher starts rank 1 as this script again.
(tests/recipes/common/test_lightning.py)"""

from __future__ import annotations

import os
import signal
import sys
import time
import warnings

# as cli.main does, before torch-geometric is imported (here, ahead of it)
warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated",
                        category=FutureWarning)

from adaptcl import cli  # noqa: E402
from adaptcl.adapters.graphcl.lightning import GraphCLModule  # noqa: E402

_training_step = GraphCLModule.training_step


def _step(self, batch, batch_idx):
    if self.trainer.global_rank == 0 and self.trainer.global_step == 20:
        time.sleep(1.0)
        os.killpg(os.getpgrp(), signal.SIGTERM)
    return _training_step(self, batch, batch_idx)


GraphCLModule.training_step = _step

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
