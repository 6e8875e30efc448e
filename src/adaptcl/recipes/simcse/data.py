"""The inputs of ``adaptcl simcse`` (sentences, STS files, model), read and fingerprinted before
any work: the data part of a run's identity."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptcl.recipes.simcse.config import SimCSERecipeConfig

#: the sentence file under the data root when ``--sentences`` is not given: the first 11,914
#: sentences of SimCSE's wiki1m
WIKI_SAMPLE = Path("wiki") / "wiki1m_for_simcse.head11914.txt"


def dataset_name(sentences: str | None) -> str:
    """The table's row: ``wiki`` for the wiki sample, else the sentence file's (path-safe) name."""
    if sentences is None:
        return "wiki"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(sentences).stem).strip("._-") or "sentences"


def read_sentences(path: Path, limit: int | None) -> list[str]:
    """One sentence per line (SimCSE's wiki1m format), empty lines skipped, the first ``limit``."""
    if not path.is_file():
        raise FileNotFoundError(f"sentence file {str(path)!r} does not exist")
    with path.open(encoding="utf-8") as handle:
        return list(itertools.islice((s for s in map(str.strip, handle) if s), limit))


def model_identity(model: str) -> dict[str, str]:
    """A local folder's resolved path and files' fingerprint, or the hub name;
    ``FileNotFoundError`` when ``model`` has no loadable configuration."""
    from transformers import AutoConfig

    from adaptcl.adapters.sentence_transformers.simcse_names import model_unavailable
    from adaptcl.evaluation.senteval.encoders import folder_fingerprint

    try:
        AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as err:
        raise model_unavailable(model, err) from err
    path = Path(model).expanduser()
    return ({"path": str(path.resolve()), "files": folder_fingerprint(path.resolve())}
            if path.is_dir() else {"hub": model})


@dataclass(frozen=True)
class Inputs:
    """What one point reads: the model (an alias resolved), the sentences, their fingerprints."""

    model: str
    sentences: list[str]
    data: dict[str, Any]


def read_inputs(cfg: SimCSERecipeConfig, sentence_file: Path, senteval_root: Path) -> Inputs:
    """One point's inputs: enough sentences for a batch, every STS file (STS-B dev too: the
    checkpoints are chosen on it), a loadable model."""
    from adaptcl.evaluation.senteval.data import task_files
    from adaptcl.evaluation.senteval.encoders import hash_sentences, resolve_model
    from adaptcl.io import fingerprint_files

    sentences = read_sentences(sentence_file, cfg.max_sentences)
    if len(sentences) < cfg.batch_size:
        raise ValueError(f"{len(sentences)} sentences from {sentence_file} do not fill one batch "
                         f"of {cfg.batch_size} (incomplete batches are dropped): lower "
                         "--batch-size or give more sentences")
    sts_files = [path for task in sorted({*cfg.sts_tasks, "STSBenchmark"})
                 for path in task_files(senteval_root, task)]
    model = str(resolve_model(cfg.model))
    return Inputs(model, sentences, {
        "model": model_identity(model), "sentences": hash_sentences(sentences),
        "num_sentences": len(sentences), "sts": fingerprint_files(sts_files, root=senteval_root)})
