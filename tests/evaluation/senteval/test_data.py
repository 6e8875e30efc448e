"""SentEval readers: counts from PROVENANCE-text-vision.md section 1, quirks, and error messages."""

from __future__ import annotations

import numpy as np
import pytest

from adaptcl.evaluation.senteval import data as sd

STS_COUNTS = {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186}
STS_SUBSET_COUNTS = {
    "STS12": {"MSRpar": 750, "MSRvid": 750, "SMTeuroparl": 459, "surprise.OnWN": 750,
              "surprise.SMTnews": 399},
    "STS13": {"FNWN": 189, "headlines": 750, "OnWN": 561},
    "STS14": {"deft-forum": 450, "deft-news": 300, "headlines": 750, "images": 750, "OnWN": 750,
              "tweet-news": 750},
    "STS15": {"answers-forums": 375, "answers-students": 750, "belief": 375, "headlines": 750,
              "images": 750},
    "STS16": {"answer-answer": 254, "headlines": 249, "plagiarism": 230, "postediting": 244,
              "question-question": 209},
}


@pytest.fixture(scope="module")
def root(shared_data):
    return shared_data  # the reader finds senteval/downstream below it


@pytest.mark.parametrize("year", list(STS_COUNTS))
def test_sts_year_counts_match_provenance(root, year):
    subsets = sd.load_sts_year(root, year)
    assert list(subsets) == list(sd.STS_SUBSETS[year])  # SentEval's order
    assert {k: len(v) for k, v in subsets.items()} == STS_SUBSET_COUNTS[year]
    assert sum(len(v) for v in subsets.values()) == STS_COUNTS[year]
    for pairs in subsets.values():
        assert len(pairs.sentences1) == len(pairs.sentences2) == len(pairs.scores)
        assert pairs.scores.min() >= 0.0 and pairs.scores.max() <= 5.0


def test_stsb_and_sick_sizes(root):
    assert [len(sd.load_stsb(root, s)) for s in ("train", "dev", "test")] == [5749, 1500, 1379]
    assert [len(sd.load_sick_relatedness(root, s)) for s in ("train", "dev", "test")] == [
        4500, 500, 4927]
    stsb = sd.load_stsb(root, "test")
    assert stsb.sentences1[0] == "a girl is styling her hair ."
    assert stsb.scores[0] == pytest.approx(2.5)
    sick = sd.load_sick_relatedness(root, "test")  # CRLF file: nothing of the \r may survive
    assert not any("\r" in s for s in sick.sentences1 + sick.sentences2)
    assert 1.0 <= sick.scores.min() and sick.scores.max() <= 5.0


def test_binary_tasks_sizes_and_empty_lines(root):
    expected = {"MR": (10662, 5331, 0), "CR": (3775, 2407, 4), "SUBJ": (10000, 5000, 0),
                "MPQA": (10606, 3312, 3)}
    for task, (n, n_pos, n_empty) in expected.items():
        data = sd.load_binary(root, task)
        assert len(data) == len(data.sentences) == n, task
        assert int(data.labels.sum()) == n_pos, task
        assert sum(1 for s in data.sentences if s == "") == n_empty, task  # SentEval counts them


def test_sst2_trec_mrpc_sizes(root):
    sst = {s: sd.load_sst2(root, s) for s in ("train", "dev", "test")}
    assert [len(v) for v in sst.values()] == [67349, 872, 1821]
    assert [int(v.labels.sum()) for v in sst.values()] == [37569, 444, 909]
    trec_train, trec_test = sd.load_trec(root, "train"), sd.load_trec(root, "test")
    assert (len(trec_train), len(trec_test)) == (5452, 500)
    assert np.bincount(trec_train.labels).tolist() == [86, 1162, 1250, 1223, 835, 896]
    assert trec_train.sentences[0] == "How did serfdom develop in and then leave Russia ?"
    # the one Latin-1 byte of train_5500.label decodes (as SentEval does) instead of failing
    assert any(any(ord(c) > 127 for c in s) for s in trec_train.sentences)
    mrpc_train, mrpc_test = sd.load_mrpc(root, "train"), sd.load_mrpc(root, "test")
    assert (len(mrpc_train), len(mrpc_test)) == (4076, 1725)
    assert (int(mrpc_train.labels.sum()), int(mrpc_test.labels.sum())) == (2753, 1147)
    assert not mrpc_train.sentences1[0].startswith("\ufeff")
    assert mrpc_train.sentences1[0].startswith("Amrozi accused his brother")


def _write(path, text, encoding="utf-8"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode(encoding))


def test_sts_reader_skips_unscored_pairs_and_normalises_whitespace(tmp_path):
    folder = tmp_path / "downstream" / "STS" / "STS13-en-test"
    _write(folder / "STS.input.FNWN.txt", "a  b\tc d\ne f\tg h\n x \t y \n")
    _write(folder / "STS.gs.FNWN.txt", "4.5\n\n1\n")
    pairs = sd.load_sts_subset(tmp_path, "STS13", "FNWN")
    assert pairs.sentences1 == ["a b", "x"] and pairs.sentences2 == ["c d", "y"]
    assert pairs.scores.tolist() == [4.5, 1.0]


def test_root_variants_are_all_accepted(tmp_path):
    down = tmp_path / "senteval" / "downstream"
    _write(down / "MR" / "rt-polarity.pos", "good film\ngreat\n", "latin-1")
    _write(down / "MR" / "rt-polarity.neg", "bad caf\xe9\n", "latin-1")
    for variant in (tmp_path, tmp_path / "senteval", down):
        data = sd.load_binary(variant, "MR")
        assert data.sentences == ["good film", "great", "bad caf\xe9"]
        assert data.labels.tolist() == [1, 1, 0]


def test_missing_file_error_names_the_file(tmp_path):
    folder = tmp_path / "downstream" / "STS" / "STS12-en-test"
    _write(folder / "STS.input.MSRpar.txt", "a\tb\n")
    with pytest.raises(FileNotFoundError, match=r"STS12-en-test/STS\.gs\.MSRpar\.txt"):
        sd.load_sts_year(tmp_path, "STS12")
    with pytest.raises(FileNotFoundError, match=r"SICK_test_annotated\.txt"):
        sd.load_sick_relatedness(tmp_path, "test")
    with pytest.raises(FileNotFoundError, match=r"MRPC/msr_paraphrase_train\.txt"):
        sd.load_mrpc(tmp_path, "train")


def test_missing_downstream_folder_and_bad_arguments(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="downstream"):
        sd.load_binary(tmp_path, "CR")
    monkeypatch.delenv("ADAPTCL_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="ADAPTCL_DATA"):
        sd.downstream_dir(None)
    (tmp_path / "downstream").mkdir()
    with pytest.raises(ValueError, match="split='validation'"):
        sd.load_stsb(tmp_path, "validation")
    with pytest.raises(ValueError, match="year='STS17'"):
        sd.load_sts_year(tmp_path, "STS17")
    with pytest.raises(ValueError, match="task='SST5'"):
        sd.load_binary(tmp_path, "SST5")


def test_data_root_from_environment(root, monkeypatch):
    monkeypatch.setenv("ADAPTCL_DATA", str(root))
    assert len(sd.load_sts_subset(None, "STS13", "FNWN")) == 189
