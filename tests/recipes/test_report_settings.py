"""Every recipe's ``results.md`` names every setting its runs' identities hold, with its value:
what determines a number is in the report, whatever the recipe's own header says (``images
--mini-batch-size 16`` said "batch 64, adam lr 0.001" and nothing of its chunks).

A tiny real run of each recipe built on the engine, some with a setting that enters the
identity beside the config's (the chunk of a cached step where the encoder has BatchNorm, a
tile size); each stored run's
identity is read back and each of its settings looked for in the report's settings paragraph.
A recipe added later fails here until it has a tiny run below.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adaptcl import cli
from tests.recipes.clip.test_clip_run import TINY as CLIP_TINY
from tests.recipes.images.test_images_gradient_cache import TINY as IMAGES_TINY
from tests.recipes.test_setting_refusals import _recipes

BOW = "tests.evaluation._bow:hashed_bow"
#: the parts of an identity that are no setting: the table's row, data, code, versions
NOT_SETTINGS = {"row", "data", "code", "frameworks"}


def _argv(recipe: str, data: Path, out: Path, request: pytest.FixtureRequest) -> list[str]:
    """A run of ``recipe`` small enough for the suite, into ``out``."""
    quiet = ["--no-progress", "--output-dir", str(out)]
    runs = {
        "demo": lambda: ["--epochs", "1", "--seeds", "0"],
        "tu": lambda: ["--data-root", str(data), "--datasets", "MUTAG", "--losses", "macl",
                       "--seeds", "0", "--epochs", "1", "--folds", "2", "--inner-folds", "2",
                       "--tile-size", "64", "--no-plot"],
        "images": lambda: ["--data-root", str(data), *IMAGES_TINY, "--mini-batch-size", "16"],
        "clip": lambda: ["--data-root", str(data), *CLIP_TINY, "--losses", "infonce",
                         "--targets", "pairs", "--seeds", "0", "--mini-batch-size", "16"],
        "simcse": lambda: ["--model", str(request.getfixturevalue("tiny_bert")), "--losses",
                           "macl", "--data-root", str(data), "--max-sentences", "24",
                           "--batch-size", "8", "--eval-steps", "3", "--max-seq-length", "16",
                           "--logging-steps", "1", "--sts-tasks", "STS12", "--threads", "1",
                           "--no-plot"],
        "sts": lambda: ["--model", BOW, "--model-id", "bow", "--tasks", "STS13",
                        "--data-root", str(data), "--cache-dir", str(out / "cache")],
        "transfer": lambda: ["--model", BOW, "--model-id", "bow", "--tasks", "TREC", "--limit",
                             "60", "--kfold", "2", "--classifier", "sklearn", "--data-root",
                             str(data), "--cache-dir", str(out / "cache")],
        "moleculenet": lambda: ["--data-root", str(data), "--datasets", "bbbp", "--inits",
                                "none", "macl", "--seeds", "0", "--pretrain-molecules", "200",
                                "--pretrain-epochs", "1", "--pretrain-batch-size", "64",
                                "--finetune-epochs", "1", "--max-molecules", "400",
                                "--emb-dim", "32", "--num-layers", "3", "--no-plot"],
    }
    assert recipe in runs, f"add a tiny run of adaptcl {recipe} to this test"
    return [recipe, *runs[recipe](), *quiet]


def _text(value: Any) -> str:
    """A value as the command line spells it."""
    if value is None or isinstance(value, bool):
        return {None: "none", True: "true", False: "false"}[value]
    if isinstance(value, list):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    return str(value)


@pytest.mark.slow  # a tiny run of every recipe
@pytest.mark.parametrize("recipe", sorted(_recipes()))
def test_every_setting_of_every_runs_identity_is_in_the_report(recipe, shared_data, tmp_path,
                                                               request, capsys):
    out = tmp_path / "out"
    assert cli.main(_argv(recipe, shared_data, out, request)) == 0
    markdown = (out / "results.md").read_text()
    (paragraph,) = [line for line in markdown.splitlines()
                    if line.startswith("Settings of the runs")]
    tables = markdown.find("\n## ")
    assert tables == -1 or markdown.index(paragraph) < tables  # above the tables
    records = [p for p in (out / "runs").rglob("*.json") if "superseded" not in p.parts
               and not p.name.startswith(".") and ".active" not in p.parts]
    assert records
    for path in records:
        identity = json.loads(path.read_text())["identity"]
        for name, value in identity["settings"].items():
            assert f" {name}={_text(value)}" in paragraph or (
                f" {name}=" in paragraph and not isinstance(value, (str, int, float))), (
                f"{path}: {name}={_text(value)} is not in: {paragraph}")
        for part in set(identity) - NOT_SETTINGS - {"settings"}:
            assert f" {part}=" in paragraph or f" {part}." in paragraph, (part, paragraph)
    if recipe == "images":  # the case: BatchNorm per chunk of a cached step
        assert " mini_batch_size=16" in paragraph
