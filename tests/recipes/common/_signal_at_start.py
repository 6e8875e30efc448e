"""``adaptcl <recipe> ...`` (this script's arguments) in which a signal,
``ADAPTCL_TEST_SIGNAL`` (``SIGTERM`` or ``SIGINT``), goes to the whole process group of a run on
two devices while rank 1 starts, as ``kill -- -PGID``, ``timeout`` or Ctrl-C send it, at
``ADAPTCL_TEST_WHEN``:

* ``spawn``: rank 0 sends it just before Lightning's launcher starts rank 1 (which never gets it);
* ``import``: rank 1 sends it at its first line, before the CLI has its handlers;
* ``importing``: rank 1 sends it while it imports (the CLI's handlers in): as it first imports
  numpy, which torch's C extension does while it initialises, clearing whatever error that
  import raised (issue 54: the stop was lost there);
* ``fit``: rank 1 sends it as it enters ``trainer.fit``, before it joins the process group.

Rank 0 is then certainly waiting for rank 1 to join. The sender writes the time it sent the
signal to ``ADAPTCL_TEST_SENT``. Lightning's launcher starts rank 1 as this script again.
(tests/recipes/common/test_lightning.py)"""

from __future__ import annotations

import os
import signal
import sys
import time


def _signal_the_group() -> None:
    with open(os.environ["ADAPTCL_TEST_SENT"], "w") as sent:
        sent.write(repr(time.time()))
    os.killpg(os.getpgrp(), getattr(signal, os.environ["ADAPTCL_TEST_SIGNAL"]))


# Ctrl-C reaches a command in a terminal's foreground, where SIGINT raises KeyboardInterrupt (a
# pytest in the background hands it down ignored)
signal.signal(signal.SIGINT, signal.default_int_handler)
RANK_1 = os.environ.get("LOCAL_RANK") == "1"
if RANK_1 and os.environ["ADAPTCL_TEST_WHEN"] == "import":
    _signal_the_group()

if RANK_1 and os.environ["ADAPTCL_TEST_WHEN"] == "importing":
    _sent: list[bool] = []

    def _at_numpy(event: str, args: tuple) -> None:
        if event == "import" and args[0] == "numpy" and not _sent:
            _sent.append(True)  # once (a hook stays), as one kill sends one signal
            _signal_the_group()  # its handler runs here, inside the import

    sys.addaudithook(_at_numpy)

from adaptcl import cli  # noqa: E402

if os.environ["ADAPTCL_TEST_WHEN"] == "spawn":
    from pytorch_lightning.strategies.launchers.subprocess_script import (
        _SubprocessScriptLauncher,
    )

    _start = _SubprocessScriptLauncher._call_children_scripts

    def _signalled_start(self):
        _signal_the_group()
        return _start(self)

    _SubprocessScriptLauncher._call_children_scripts = _signalled_start

if os.environ["ADAPTCL_TEST_WHEN"] == "fit":  # (at "import", the recipe imports Lightning later)
    import warnings

    # as cli.main does, before torch-geometric is imported (here, ahead of it)
    warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated",
                            category=FutureWarning)
    import pytorch_lightning as pl

    _fit = pl.Trainer.fit

    def _signalled_fit(self, *args, **kwargs):
        if RANK_1:
            _signal_the_group()
        return _fit(self, *args, **kwargs)

    pl.Trainer.fit = _signalled_fit

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
