"""``adaptcl <recipe> ...``: one sub-command per recipe.

Each recipe module exposes ``RECIPE``, a :class:`~adaptcl.recipes.template.recipe.Recipe`
(its ``add_arguments(parser)``, ``main(args) -> int`` and ``example``, shown under ``--help``). Only the module of the sub-command being run is imported,
and recipe modules import nothing heavy at module level, so ``--help`` is instant.

Errors: a user error (a bad option, missing or malformed data, a run that produced no result:
:class:`adaptcl.recipes.template.errors.RecipeError`) prints one line ``adaptcl <recipe>: error: ...``
and exits 2; anything else is a crash and keeps its traceback (exit 1).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import re
import signal
import sys
import threading
import warnings

from adaptcl.recipes.template.errors import RecipeError
from adaptcl.recipes.template.jobs import CellsFailedError
from adaptcl.recipes.template.store import distributed_follower

# sub-command -> (module, one-line help)
RECIPES: dict[str, tuple[str, str]] = {
    "demo": ("adaptcl.recipes.demo", "short NT-Xent vs MACL run on bundled digits, table + plot"),
    "images": ("adaptcl.recipes.images", "SimCLR/MoCo/SimSiam/Barlow Twins via Lightly on CIFAR-10 or a folder: kNN + linear probe"),
    "simcse": ("adaptcl.recipes.simcse", "SimCSE on BERT/RoBERTa with a chosen loss, then STS"),
    "sts": ("adaptcl.recipes.sts", "SentEval/SimCSE STS12-16, STS-B, SICK-R: cosine Spearman table"),
    "transfer": ("adaptcl.recipes.transfer", "SentEval transfer tasks (MR..MRPC): logistic regression"),
    "tu": ("adaptcl.recipes.tu", "GraphCL pre-training on TU datasets, SVM 10-fold CV, every loss"),
    "moleculenet": ("adaptcl.recipes.moleculenet", "GraphCL/MACL pre-training on SMILES, MoleculeNet fine-tuning, ROC-AUC"),
    "compare": ("adaptcl.recipes.compare", "one table and plot over a setting (a sweep) from result files of one recipe, paired CIs"),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line errors: ``adaptcl <recipe>: error: ...`` and exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


class RecipeParser(OneLineParser):
    """A sub-command's parser: it reports its own unrecognised arguments, so the message names
    the recipe (``adaptcl sts: error: unrecognized arguments: --logger``), not ``adaptcl``."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


# What the file system says when the user's disk or folder cannot take the output: the user's
# to fix (one line, exit 2), not a crash of ours. Nothing is half-written: writes are atomic.
_STORAGE_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
                   errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
                   errno.EPERM: "permission denied"}
# torch.save reports a full disk as a RuntimeError of its zip writer
_TORCH_WRITE_FAILURE = re.compile(r"PytorchStreamWriter failed|inline_container\.cc.*unexpected pos")


def storage_error(err: BaseException) -> str | None:
    """The one-line message for an output that the disk or the folder refused, else ``None``."""
    if isinstance(err, OSError) and err.errno in _STORAGE_ERRNOS:
        where = f" writing {err.filename}" if err.filename else ""
        return (f"{_STORAGE_ERRNOS[err.errno]}{where} ({err.strerror or err}); finished runs "
                "are kept, so rerun the same command once there is room")
    if isinstance(err, RuntimeError) and _TORCH_WRITE_FAILURE.search(str(err)):
        return ("writing a checkpoint failed (is the disk full?): "
                f"{str(err).splitlines()[0]}; finished runs are kept, so rerun once there is room")
    return None


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in every valued option's help; the description and example kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.nargs == 0:  # flags, and "unset" defaults
            return action.help or ""
        return super()._get_help_string(action)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("adaptcl")
    except PackageNotFoundError:  # pragma: no cover - a bare checkout
        import adaptcl

        return adaptcl.__version__


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The CLI parser; only the ``selected`` recipe's module is imported (for its options)."""
    parser = OneLineParser(prog="adaptcl", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"adaptcl {_version()}")
    sub = parser.add_subparsers(dest="recipe", metavar="<recipe>", required=True,
                                parser_class=RecipeParser)
    for name, (module, help_text) in RECIPES.items():
        recipe_parser = sub.add_parser(name, help=help_text, description=help_text,
                                       formatter_class=_HelpFormatter)
        recipe_parser.set_defaults(_module=module)
        if name == selected:
            _add_arguments(recipe_parser, module)
    return parser


def _add_arguments(parser: argparse.ArgumentParser, module: str) -> None:
    try:
        recipe = importlib.import_module(module)
    except ImportError as err:
        # Keep the sub-command usable for --help; running it reports the missing extra.
        parser.set_defaults(_import_error=err)
        return
    recipe = recipe.RECIPE
    recipe.add_arguments(parser)
    example = recipe.example
    if example:
        parser.epilog = "example:\n" + "\n".join(f"  {line}" for line in example.strip().splitlines())


def _report(prog: str, message: str) -> None:
    """Print a one-line error, on rank 0 only: the ranks of a distributed run (torchrun's
    ``RANK``, Lightning's ``LOCAL_RANK``) meet the same error, and one line is enough."""
    if not distributed_follower():
        print(f"{prog}: error: {message}", file=sys.stderr)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the run is, so it stops as on Ctrl-C: the submitted jobs are
    cancelled, the live-run entry removed, the finished runs kept."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def _stop_on_sigterm() -> bool:
    """Make SIGTERM (``kill``, ``timeout``, a scheduler's stop) end the run as Ctrl-C does,
    unless someone else already handles it (then it stays theirs). Whether it was set."""
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
        signal.signal(signal.SIGTERM, _raise_terminated)
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    selected = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(selected if selected in RECIPES else None).parse_args(argv)
    prog = f"adaptcl {args.recipe}"
    error = getattr(args, "_import_error", None)
    if error is not None:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2

    # torch-geometric scripts modules at import; torch's deprecation of that is not the user's
    warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated",
                            category=FutureWarning)
    stop_on_sigterm = _stop_on_sigterm()
    try:
        return _run(args, prog)
    finally:
        if stop_on_sigterm:  # the caller's process gets its default back
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run(args: argparse.Namespace, prog: str) -> int:
    try:
        return int(importlib.import_module(args._module).RECIPE.main(args) or 0)
    except RecipeError as err:
        _report(prog, str(err))
        return 2
    except CellsFailedError as err:  # each cell's traceback is in its job's log, named above
        _report(prog, str(err))
        return 1
    except ImportError as err:
        if "pip install" not in str(err):  # a missing extra is the user's to fix; others crash
            raise
        _report(prog, str(err))
        return 2
    except (OSError, RuntimeError) as err:
        message = storage_error(err)
        if message is None:
            raise
        _report(prog, message)
        return 2
    except KeyboardInterrupt as stop:
        out = getattr(args, "output_dir", None)
        kept = f" under {out}/runs" if out else ""
        how = "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted"
        if not distributed_follower():  # every rank is stopped; one line says so
            print(f"\n{prog}: {how}; finished runs are kept{kept}: rerun the same command to "
                  "resume", file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
