"""``adaptcl <recipe> ...``: one sub-command per recipe.

Each recipe module exposes ``add_arguments(parser)`` and ``main(args) -> int``; it is imported
only when its sub-command runs, so ``adaptcl --help`` works with the core alone installed.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# sub-command -> (module, one-line help)
RECIPES: dict[str, tuple[str, str]] = {
    "demo": ("adaptcl.recipes.demo", "short NT-Xent vs MACL run on bundled digits, table + plot"),
    "tu": ("adaptcl.recipes.tu", "GraphCL pre-training on TU datasets, SVM 10-fold CV, every loss"),
    "sts": ("adaptcl.recipes.sts", "SentEval/SimCSE STS12-16, STS-B, SICK-R: cosine Spearman table"),
    "transfer": ("adaptcl.recipes.transfer", "SentEval transfer tasks (MR..MRPC): logistic regression"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="adaptcl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="recipe", metavar="<recipe>", required=True)
    for name, (module, help_text) in RECIPES.items():
        recipe_parser = sub.add_parser(name, help=help_text, description=help_text)
        recipe_parser.set_defaults(_module=module)
        _add_arguments_lazily(recipe_parser, module)
    return parser


def _add_arguments_lazily(parser: argparse.ArgumentParser, module: str) -> None:
    try:
        importlib.import_module(module).add_arguments(parser)
    except ImportError as err:
        # Keep the sub-command visible; running it will raise the informative ImportError.
        parser.set_defaults(_import_error=err)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    error = getattr(args, "_import_error", None)
    if error is not None:
        raise error
    return int(importlib.import_module(args._module).main(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
