"""Readers for SentEval's ``data/downstream`` layout (STS12-16, STS-B, SICK, MR, CR, SUBJ, MPQA,
SST2, TREC, MRPC), reproducing SentEval's own loaders (Conneau & Kiela, 2018,
"SentEval: An Evaluation Toolkit for Universal Sentence Representations", LREC).

Every reader returns sentences the way SentEval hands them to a ``batcher`` and the way SimCSE's
``evaluation.py`` (Gao et al., 2021, "SimCSE: Simple Contrastive Learning of Sentence Embeddings",
EMNLP) turns them back into strings: the line is split on whitespace and re-joined with single
spaces (``' '.join(line.split())``). Encodings follow SentEval: STS, STS-B, SICK, SST and MRPC are
UTF-8; MR, CR, SUBJ, MPQA and TREC are Latin-1 (``TREC/train_5500.label`` holds one Latin-1 byte).
Quirks handled as SentEval does: CRLF line ends in ``SICK_test_annotated.txt`` (stripped), the
UTF-8 BOM of the MRPC files (it sits in the skipped header line), STS pairs without a gold score
(skipped), and empty lines in CR and MPQA (kept, as empty sentences, and counted).

The readers return file order; SentEval's sort by sentence length (which fixes its
cross-validation folds) is applied by :mod:`adaptcl.evaluation.senteval.transfer`.

The root may be any of: the ``downstream`` folder itself, a folder holding ``downstream/``
(SentEval's ``PATH_TO_DATA``), or a folder holding ``senteval/downstream/`` (the project's shared
data root); ``None`` falls back to ``$ADAPTCL_DATA``. A missing file raises ``FileNotFoundError``
naming it.

Example::

    from adaptcl.evaluation.senteval.data import load_sts_year, load_binary

    subsets = load_sts_year("/data", "STS12")       # {"MSRpar": SentencePairs, ...}
    sum(len(s) for s in subsets.values())            # 3108
    mr = load_binary("/data", "MR")                  # LabeledSentences, 10662 sentences
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adaptcl.io import resolve_data_root

# SentEval's subset lists (senteval/sts.py), in SentEval's order.
STS_SUBSETS: dict[str, tuple[str, ...]] = {
    "STS12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    "STS13": ("FNWN", "headlines", "OnWN"),
    "STS14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    "STS15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
    "STS16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}
STS_YEARS: tuple[str, ...] = tuple(STS_SUBSETS)
BINARY_FILES: dict[str, tuple[str, str, str]] = {  # task -> (folder, positive file, negative file)
    "MR": ("MR", "rt-polarity.pos", "rt-polarity.neg"),
    "CR": ("CR", "custrev.pos", "custrev.neg"),
    "SUBJ": ("SUBJ", "subj.objective", "subj.subjective"),
    "MPQA": ("MPQA", "mpqa.pos", "mpqa.neg"),
}
STSB_FILES = {"train": "sts-train.csv", "dev": "sts-dev.csv", "test": "sts-test.csv"}
SICK_FILES = {"train": "SICK_train.txt", "dev": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
SST2_FILES = {"train": "sentiment-train", "dev": "sentiment-dev", "test": "sentiment-test"}
TREC_FILES = {"train": "train_5500.label", "test": "TREC_10.label"}
TREC_CLASSES = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")  # SentEval's tgt2idx order
MRPC_FILES = {"train": "msr_paraphrase_train.txt", "test": "msr_paraphrase_test.txt"}


@dataclass(frozen=True)
class SentencePairs:
    """Sentence pairs with a real-valued gold similarity (STS, STS-B, SICK-R)."""

    name: str
    sentences1: list[str]
    sentences2: list[str]
    scores: np.ndarray  # float64, shape (n,)

    def __len__(self) -> int:
        return len(self.scores)


@dataclass(frozen=True)
class LabeledSentences:
    """Single sentences with an integer class label (MR, CR, SUBJ, MPQA, SST2, TREC)."""

    name: str
    sentences: list[str]
    labels: np.ndarray  # int64, shape (n,)

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class LabeledPairs:
    """Sentence pairs with an integer label (MRPC: 1 = paraphrase)."""

    name: str
    sentences1: list[str]
    sentences2: list[str]
    labels: np.ndarray  # int64, shape (n,)

    def __len__(self) -> int:
        return len(self.labels)


def _tok(text: str) -> str:
    """SentEval splits on whitespace; SimCSE's batcher joins the tokens with single spaces."""
    return " ".join(text.split())


def downstream_dir(data_root: str | os.PathLike | None = None) -> Path:
    """Locate SentEval's ``downstream`` folder under ``data_root`` (or ``$ADAPTCL_DATA``).

    Accepts the ``downstream`` folder itself, its parent (SentEval's ``PATH_TO_DATA``), or a
    folder holding ``senteval/downstream``. Raises ``FileNotFoundError`` listing what was tried.
    """
    root = resolve_data_root(data_root)
    candidates = [root / "senteval" / "downstream", root / "downstream", root]
    for candidate in candidates:
        if candidate.name == "downstream" and candidate.is_dir():
            return candidate
    tried = ", ".join(str(c) for c in candidates[:2])
    raise FileNotFoundError(
        f"no SentEval 'downstream' folder under data root {str(root)!r} (tried {tried}); "
        "pass the folder that holds SentEval's data/downstream"
    )


def _require(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"SentEval data file missing: {path}")
    return path


def _read_lines(path: Path, encoding: str) -> list[str]:
    """``io.open(path, encoding=...).read().splitlines()`` as SentEval does."""
    with open(_require(path), encoding=encoding, newline=None) as handle:
        return handle.read().splitlines()


def _check_split(split: str, allowed: dict[str, str], task: str) -> str:
    if split not in allowed:
        raise ValueError(f"split={split!r} is not valid for {task}; choose from {sorted(allowed)}")
    return allowed[split]


# ----------------------------------------------------------------------------------------- STS
def load_sts_subset(data_root: str | os.PathLike | None, year: str, subset: str) -> SentencePairs:
    """One STS12-16 subset (``STS.input.<subset>.txt`` + ``STS.gs.<subset>.txt``).

    As in SentEval, pairs whose gold line is empty are skipped (STS15 and STS16 ship many).
    """
    if year not in STS_SUBSETS:
        raise ValueError(f"year={year!r} is not an STS year; choose from {list(STS_SUBSETS)}")
    folder = downstream_dir(data_root) / "STS" / f"{year}-en-test"
    inputs = _read_lines(folder / f"STS.input.{subset}.txt", "utf-8")
    gold = _read_lines(folder / f"STS.gs.{subset}.txt", "utf-8")
    if len(inputs) != len(gold):
        raise ValueError(
            f"{folder / f'STS.input.{subset}.txt'} has {len(inputs)} lines but its gold file has "
            f"{len(gold)}"
        )
    s1, s2, scores = [], [], []
    for lineno, (line, score) in enumerate(zip(inputs, gold, strict=True), start=1):
        if score.strip() == "":
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(
                f"{folder / f'STS.input.{subset}.txt'} line {lineno}: expected 2 tab-separated "
                f"sentences, found {len(fields)} fields"
            )
        s1.append(_tok(fields[0]))
        s2.append(_tok(fields[1]))
        scores.append(float(score))
    return SentencePairs(f"{year}/{subset}", s1, s2, np.asarray(scores, dtype=np.float64))


def load_sts_year(data_root: str | os.PathLike | None, year: str) -> dict[str, SentencePairs]:
    """All subsets of one STS year, in SentEval's order: ``{subset: SentencePairs}``."""
    if year not in STS_SUBSETS:
        raise ValueError(f"year={year!r} is not an STS year; choose from {list(STS_SUBSETS)}")
    return {subset: load_sts_subset(data_root, year, subset) for subset in STS_SUBSETS[year]}


def load_stsb(data_root: str | os.PathLike | None, split: str = "test") -> SentencePairs:
    """STS Benchmark (``STS/STSBenchmark/sts-<split>.csv``; columns 5, 6 = sentences, 4 = score)."""
    name = _check_split(split, STSB_FILES, "STSBenchmark")
    path = downstream_dir(data_root) / "STS" / "STSBenchmark" / name
    s1, s2, scores = [], [], []
    for lineno, line in enumerate(_read_lines(path, "utf-8"), start=1):
        fields = line.strip().split("\t")
        if len(fields) < 7:
            raise ValueError(f"{path} line {lineno}: expected 7 tab fields, found {len(fields)}")
        s1.append(_tok(fields[5]))
        s2.append(_tok(fields[6]))
        scores.append(float(fields[4]))
    return SentencePairs(f"STSBenchmark/{split}", s1, s2, np.asarray(scores, dtype=np.float64))


def load_sick_relatedness(data_root: str | os.PathLike | None, split: str = "test") -> SentencePairs:
    """SICK relatedness (``SICK/SICK_{train,trial,test_annotated}.txt``; header skipped).

    ``split`` is ``train``, ``dev`` (the trial file) or ``test``; CRLF endings are stripped.
    """
    name = _check_split(split, SICK_FILES, "SICK")
    path = downstream_dir(data_root) / "SICK" / name
    s1, s2, scores = [], [], []
    for lineno, line in enumerate(_read_lines(path, "utf-8")[1:], start=2):
        fields = line.strip().split("\t")
        if len(fields) < 4:
            raise ValueError(f"{path} line {lineno}: expected 5 tab fields, found {len(fields)}")
        s1.append(_tok(fields[1]))
        s2.append(_tok(fields[2]))
        scores.append(float(fields[3]))
    return SentencePairs(f"SICKRelatedness/{split}", s1, s2, np.asarray(scores, dtype=np.float64))


# ------------------------------------------------------------------------------- classification
def load_binary(data_root: str | os.PathLike | None, task: str) -> LabeledSentences:
    """MR, CR, SUBJ or MPQA: positives (label 1) then negatives (label 0), Latin-1.

    For SUBJ SentEval's "positive" file is ``subj.objective``. Empty lines are kept as empty
    sentences (CR has 4, MPQA 3), exactly as SentEval counts them.
    """
    if task not in BINARY_FILES:
        raise ValueError(f"task={task!r} is not a binary task; choose from {list(BINARY_FILES)}")
    folder_name, pos_name, neg_name = BINARY_FILES[task]
    folder = downstream_dir(data_root) / folder_name
    pos = [_tok(line) for line in _read_lines(folder / pos_name, "latin-1")]
    neg = [_tok(line) for line in _read_lines(folder / neg_name, "latin-1")]
    labels = np.asarray([1] * len(pos) + [0] * len(neg), dtype=np.int64)
    return LabeledSentences(task, pos + neg, labels)


def load_sst2(data_root: str | os.PathLike | None, split: str) -> LabeledSentences:
    """SST-2 (``SST/binary/sentiment-<split>``: ``sentence<TAB>label``, UTF-8)."""
    name = _check_split(split, SST2_FILES, "SST2")
    path = downstream_dir(data_root) / "SST" / "binary" / name
    sentences, labels = [], []
    for lineno, line in enumerate(_read_lines(path, "utf-8"), start=1):
        fields = line.strip().split("\t")
        if len(fields) != 2:
            raise ValueError(f"{path} line {lineno}: expected 'sentence<TAB>label'")
        sentences.append(_tok(fields[0]))
        labels.append(int(fields[1]))
    return LabeledSentences(f"SST2/{split}", sentences, np.asarray(labels, dtype=np.int64))


def load_trec(data_root: str | os.PathLike | None, split: str) -> LabeledSentences:
    """TREC coarse question classes (``COARSE:fine question``, Latin-1); labels index
    :data:`TREC_CLASSES`."""
    name = _check_split(split, TREC_FILES, "TREC")
    path = downstream_dir(data_root) / "TREC" / name
    index = {c: i for i, c in enumerate(TREC_CLASSES)}
    sentences, labels = [], []
    for lineno, line in enumerate(_read_lines(path, "latin-1"), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        target, sample = stripped.split(":", 1)
        if target not in index or " " not in sample:
            raise ValueError(f"{path} line {lineno}: unexpected TREC line {stripped[:40]!r}")
        sentences.append(_tok(sample.split(" ", 1)[1]))
        labels.append(index[target])
    return LabeledSentences(f"TREC/{split}", sentences, np.asarray(labels, dtype=np.int64))


def load_mrpc(data_root: str | os.PathLike | None, split: str) -> LabeledPairs:
    """MRPC (``msr_paraphrase_<split>.txt``; the BOM-carrying header is skipped)."""
    name = _check_split(split, MRPC_FILES, "MRPC")
    path = downstream_dir(data_root) / "MRPC" / name
    s1, s2, labels = [], [], []
    for lineno, line in enumerate(_read_lines(path, "utf-8")[1:], start=2):
        fields = line.strip().split("\t")
        if len(fields) != 5:
            raise ValueError(f"{path} line {lineno}: expected 5 tab fields, found {len(fields)}")
        labels.append(int(fields[0]))
        s1.append(_tok(fields[3]))
        s2.append(_tok(fields[4]))
    return LabeledPairs(f"MRPC/{split}", s1, s2, np.asarray(labels, dtype=np.int64))


# ---------------------------------------------------------------------------------- identity
def task_files(data_root: str | os.PathLike | None, task: str) -> list[Path]:
    """The files a task's evaluation reads (for the data fingerprint of a run's identity).

    STS12-16: every subset's input and gold file; ``STSBenchmark``: the dev (used by ``simcse``
    for model selection) and test files; ``SICKRelatedness``: the test file; the transfer tasks
    (MR, CR, SUBJ, MPQA, SST2, TREC, MRPC): every split they read. Raises ``FileNotFoundError``
    naming a missing file, ``ValueError`` for an unknown task.
    """
    root = downstream_dir(data_root)
    if task in STS_SUBSETS:
        folder = root / "STS" / f"{task}-en-test"
        paths = [folder / f"STS.{kind}.{subset}.txt" for subset in STS_SUBSETS[task]
                 for kind in ("input", "gs")]
    elif task == "STSBenchmark":
        paths = [root / "STS" / "STSBenchmark" / STSB_FILES[split] for split in ("dev", "test")]
    elif task == "SICKRelatedness":
        paths = [root / "SICK" / SICK_FILES["test"]]
    elif task in BINARY_FILES:
        folder_name, *names = BINARY_FILES[task]
        paths = [root / folder_name / name for name in names]
    elif task == "SST2":
        paths = [root / "SST" / "binary" / name for name in SST2_FILES.values()]
    elif task == "TREC":
        paths = [root / "TREC" / name for name in TREC_FILES.values()]
    elif task == "MRPC":
        paths = [root / "MRPC" / name for name in MRPC_FILES.values()]
    else:
        raise ValueError(f"task={task!r} has no SentEval files")
    return [_require(path) for path in paths]
