"""``adaptcl <recipe> ...``: one sub-command per recipe.

Each recipe package's ``recipe`` module exposes ``RECIPE`` (:class:`adaptcl.recipes.engine.Recipe`,
``main(argv, prog) -> int``); only the one being run is imported, so ``--help`` is fast. A user
error prints one line ``adaptcl <recipe>: error: ...`` and exits 2; a crash keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any

from adaptcl import __version__
from adaptcl.recipes.engine import (
    CellsFailedError,
    RecipeError,
    RunStopped,
    distributed_follower,
    storage_error,
    terminal_text,
)

# sub-command -> one-line help (its module: adaptcl.recipes.<name>.recipe)
RECIPES: dict[str, str] = {
    "demo": "short NT-Xent vs MACL run on bundled digits, table + plot",
    "images": "SimCLR/MoCo/SimSiam/Barlow Twins via Lightly on CIFAR-10 or a folder: kNN + linear probe",
    "simcse": "SimCSE on BERT/RoBERTa with a chosen loss, then STS",
    "sts": "SentEval/SimCSE STS12-16, STS-B, SICK-R: cosine Spearman table",
    "transfer": "SentEval transfer tasks (MR..MRPC): logistic regression",
    "tu": "GraphCL pre-training on TU datasets, SVM 10-fold CV, every loss",
    "moleculenet": "GraphCL/MACL pre-training on SMILES, MoleculeNet fine-tuning, ROC-AUC",
    "clip": "CLIP from scratch (small open_clip towers) on CIFAR-10 with prompt captions: zero-shot + R@1",
    "compare": "one table and plot over a setting from result files of one recipe, paired CIs",
}


def _report(prog: str, message: str) -> None:
    """A one-line error, on rank 0 only: every rank of a distributed run meets the same one."""
    if not distributed_follower():
        print(f"{prog}: error: {message}", file=sys.stderr)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the run is, so it stops as on Ctrl-C: the submitted jobs are
    cancelled, the live-run entry removed, the finished runs kept."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    if _stop_here(signum, frame):
        _quiet_children.hold()
        raise Terminated()


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C: Python's ``KeyboardInterrupt``, never raised into an import."""
    if _stop_here(signum, frame):
        raise KeyboardInterrupt


#: the modules whose frames run an import (``import x``, ``importlib.import_module``, an
#: import a C extension makes while it initialises)
_IMPORT_MACHINERY = frozenset({"importlib._bootstrap", "importlib._bootstrap_external"})
_IMPORT_POLL = 0.05  # seconds between two looks at whether the main thread still imports
_waiting: set[int] = set()  # the stop signals sent again once the main thread's import ends


def _importing(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside the import of another package's module: its top-level
    code, or what that calls. (adaptcl's own modules swallow nothing: a stop raised in theirs
    unwinds as anywhere else, and their imports of torch or Lightning are the long ones.)"""
    while frame is not None:
        below = frame.f_back
        if (frame.f_code.co_name == "<module>" and below is not None
                and below.f_globals.get("__name__") in _IMPORT_MACHINERY
                and frame.f_globals.get("__name__", "").partition(".")[0] != "adaptcl"):
            return True
        frame = below
    return False


def _stop_here(signum: int, frame: FrameType | None) -> bool:
    """Whether a stop signal landing in ``frame`` may raise there: not inside the import of
    another package's module (:func:`_importing`).

    Raised into a module's top-level code, the stop leaves the module half-imported, and the
    importer may take it for an ``ImportError`` or swallow it: torch's C extension imports numpy
    while it initialises and clears whatever error that import raised, so a SIGTERM landing in
    numpy's import was lost and the run trained on (issue 54: rank 1, importing, trained for
    23 s after rank 0 had stopped and then called it a crash, or died 19 s later of a
    ``RecursionError``). Inside such an import instead:

    - a follower (a non-zero rank, :func:`~adaptcl.recipes.engine.distributed_follower`) ends
      at once, quietly, with status 0, as its stop would (:func:`_handled`): it owns no result,
      lock or entry, and rank 0 got the signal too (the group's, or its launcher's copy) and
      says why;
    - any other process has the signal sent to its main thread again as soon as that thread
      is out of every such import, where it stops as usual (a thread looks every 50 ms).
    """
    if not _importing(frame):
        return True
    if distributed_follower():
        sys.stderr.flush()
        os._exit(0)
    if signum not in _waiting:
        _waiting.add(signum)
        threading.Thread(target=_send_after_imports, args=(signum,), daemon=True,
                         name=f"adaptcl: {signal.Signals(signum).name} after imports").start()
    return False


def _send_after_imports(signum: int) -> None:
    """Send ``signum`` to the main thread once it runs no import of another package's module
    (not if it has ended)."""
    main = threading.main_thread()
    try:
        while _importing(sys._current_frames().get(main.ident)):
            time.sleep(_IMPORT_POLL)
    finally:
        _waiting.discard(signum)
    if main.is_alive():
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            signal.pthread_kill(main.ident, signum)


def _child_ended(signum: int, frame: object) -> None:
    """The SIGCHLD handler while a run stops: nothing to do (see :class:`_QuietChildren`)."""


class _QuietChildren:
    """SIGCHLD left alone while a SIGTERM stops the run.

    ``kill``, ``timeout`` and schedulers send SIGTERM to the whole process group, so DataLoader
    workers die of it beside the run; torch's SIGCHLD handler (``torch.utils.data._utils.
    signal_handling``) then raises "DataLoader worker (pid N) is killed by signal: Terminated"
    wherever the run is unwinding, which replaces the stop and cuts its cleanup short. Once the
    run is stopping nothing waits for a worker, so their deaths are part of the stop: the
    handler is set aside on SIGTERM for one that does nothing, and put back when the CLI
    returns.

    Not ``SIG_DFL``: the SIGCHLD of a worker that died with the SIGTERM may have been received
    (CPython's C handler flagged it) and not yet handled, as Python runs the handlers in signal
    order, SIGTERM (15) before SIGCHLD (17). Finding no Python handler when it gets to that
    flag, CPython writes "OSError: Signal 17 ignored due to race condition" with a traceback
    (``Modules/signalmodule.c``); a Python handler that does nothing takes it quietly.
    """

    def __init__(self) -> None:
        self._held: Callable[..., Any] | None = None

    def hold(self) -> None:
        """Set a Python SIGCHLD handler aside for :func:`_child_ended` (children are still
        reaped by whoever waits for them, as under ``SIG_DFL``); one set from C, or none,
        raises nothing into the run and stays."""
        if self._held is None and hasattr(signal, "SIGCHLD"):
            handler = signal.getsignal(signal.SIGCHLD)
            if callable(handler) and handler is not _child_ended:
                self._held = handler
                signal.signal(signal.SIGCHLD, _child_ended)

    def release(self) -> None:
        if self._held is not None:
            signal.signal(signal.SIGCHLD, self._held)
            self._held = None


_quiet_children = _QuietChildren()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") or argv[0] not in RECIPES:
        parser = argparse.ArgumentParser(
            prog="adaptcl", description=terminal_text(__doc__.splitlines()[0]),
            epilog="recipes:\n" + "\n".join(f"  {n:<12} {h}" for n, h in RECIPES.items())
            + "\n\nadaptcl <recipe> --help shows a recipe's options.",
            formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("--version", action="version", version=f"adaptcl {__version__}")
        parser.add_argument("recipe", metavar="<recipe>", choices=list(RECIPES), help="what to run")
        if argv and not argv[0].startswith("-"):
            parser.exit(2, f"adaptcl: error: unknown recipe {argv[0]!r}; choose from "
                           f"{', '.join(RECIPES)}\n")
        parser.parse_args(argv[:1])  # --help / --version exit here
        parser.exit(2, "adaptcl: error: name a recipe; see adaptcl --help\n")
    name, rest = argv[0], argv[1:]
    prog = f"adaptcl {name}"
    # torch-geometric scripts modules at import; torch's deprecation of that is not the user's
    warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated",
                            category=FutureWarning)
    # SIGTERM (kill, timeout, a scheduler) ends the run as Ctrl-C does, unless someone else
    # already handles it (then it stays theirs); both stop outside imports (_stop_here)
    main = threading.current_thread() is threading.main_thread()
    on_sigterm = main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    on_sigint = main and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if on_sigterm:
        signal.signal(signal.SIGTERM, _raise_terminated)
    if on_sigint:
        signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        return _handled(prog, lambda: _run(name, rest, prog))
    finally:
        _close_process_group()
        if on_sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if on_sigterm:  # the caller's process gets its default back
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _quiet_children.release()


def _run(name: str, rest: list[str], prog: str) -> int:
    """The recipe's ``main``, with SIGINT and SIGTERM unblocked first: Lightning's launcher
    starts the other ranks of a run on several devices with both blocked
    (:mod:`adaptcl.recipes.common.ddp`), so that one sent before this process has its handlers
    waits for them instead of killing it (whose death Lightning's observer answers by
    SIGKILLing rank 0); here they are in."""
    if threading.current_thread() is threading.main_thread() and hasattr(signal,
                                                                          "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    return int(importlib.import_module(f"adaptcl.recipes.{name}.recipe").RECIPE.main(rest, prog)
               or 0)


def _close_process_group() -> None:
    """Destroy torch.distributed's default group if the run started one (Lightning's DDP, or
    torchrun): PyTorch asks each process to before it exits, and gloo's threads left running
    abort the interpreter's shutdown now and then (SIGABRT, "terminate called without an
    active exception"), after the results are written. The CLI owns the process, so it closes
    the group; a recipe run from Python leaves it to its caller."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _handled(prog: str, call: Callable[[], int]) -> int:
    """``call()`` with every error a user meets as one line and its exit code."""
    try:
        return call()
    except (RecipeError, CellsFailedError) as err:  # a failed cell's traceback is in its log
        _report(prog, str(err))
        return 2 if isinstance(err, RecipeError) else 1
    except ImportError as err:
        if "pip install" not in str(err):  # a missing extra is the user's to fix; others crash
            raise
        _report(prog, str(err))
        return 2
    except RunStopped as stop:  # every rank says it: the one that would speak may be gone
        print(f"{prog}: {stop}; finished runs are kept{_kept(stop)}: rerun the same command to "
              "resume", file=sys.stderr)
        return 1
    except (OSError, RuntimeError) as err:
        message = storage_error(err)
        if message is None:
            raise
        _report(prog, message)
        return 2
    except KeyboardInterrupt as stop:
        terminated = isinstance(stop, Terminated)
        if distributed_follower():  # every rank is stopped; rank 0's line and status say so
            # a SIGTERM or a Ctrl-C stops every rank at one point (recipes.common.lightning),
            # so a follower exits 0: Lightning's launcher SIGKILLs rank 0 when a rank it
            # started ends with another status, which would cut rank 0's line and its 143 short
            return 0
        how = "terminated (SIGTERM)" if terminated else "interrupted"
        print(f"\n{prog}: {how}; finished runs are kept{_kept(stop)}: rerun the same command "
              "to resume", file=sys.stderr)
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)


def _kept(stop: BaseException) -> str:
    """`` under <output dir>/runs``: where the recipe that stopped keeps its finished runs."""
    output_dir = getattr(stop, "output_dir", None)  # set by the recipe that was running
    return f" under {output_dir}/runs" if output_dir else ""


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
