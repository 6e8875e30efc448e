"""``adaptcl <recipe> ...``: one sub-command per recipe.

Each recipe module exposes ``add_arguments(parser)`` and ``main(args) -> int``; only the module
of the sub-command being run is imported, so ``adaptcl --help`` is instant and works with the
core alone installed.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# sub-command -> (module, one-line help)
RECIPES: dict[str, tuple[str, str]] = {
    "demo": ("adaptcl.recipes.demo", "short NT-Xent vs MACL run on bundled digits, table + plot"),
    "images": ("adaptcl.recipes.images", "SimCLR/MoCo/SimSiam/Barlow Twins via Lightly on CIFAR-10 or a folder: kNN + linear probe"),
    "simcse": ("adaptcl.recipes.simcse", "SimCSE on BERT/RoBERTa with a chosen loss, then STS"),
    "sts": ("adaptcl.recipes.sts", "SentEval/SimCSE STS12-16, STS-B, SICK-R: cosine Spearman table"),
    "transfer": ("adaptcl.recipes.transfer", "SentEval transfer tasks (MR..MRPC): logistic regression"),
    "tu": ("adaptcl.recipes.tu", "GraphCL pre-training on TU datasets, SVM 10-fold CV, every loss"),
    "moleculenet": ("adaptcl.recipes.moleculenet", "GraphCL/MACL pre-training on SMILES, MoleculeNet fine-tuning, ROC-AUC"),
}


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The CLI parser; only the ``selected`` recipe's module is imported (for its options)."""
    parser = argparse.ArgumentParser(prog="adaptcl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="recipe", metavar="<recipe>", required=True)
    for name, (module, help_text) in RECIPES.items():
        recipe_parser = sub.add_parser(name, help=help_text, description=help_text)
        recipe_parser.set_defaults(_module=module)
        if name == selected:
            _add_arguments(recipe_parser, module)
    return parser


def _add_arguments(parser: argparse.ArgumentParser, module: str) -> None:
    try:
        importlib.import_module(module).add_arguments(parser)
    except ImportError as err:
        # Keep the sub-command usable for --help; running it raises the informative ImportError.
        parser.set_defaults(_import_error=err)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    selected = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(selected if selected in RECIPES else None).parse_args(argv)
    error = getattr(args, "_import_error", None)
    if error is not None:
        raise error
    return int(importlib.import_module(args._module).main(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
