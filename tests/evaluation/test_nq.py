"""NQ data building and the best_subspan_em metric."""

import gzip
import json

import pytest

from evaluation.nq import DataFormatError, NQExample, best_subspan_em, build_documents, load_nq, normalize_answer
from kvlink_rag.types import Document


def test_metric_hand_worked_examples():
    assert normalize_answer("The  Beatles!") == "beatles"
    assert best_subspan_em("It was the Beatles, in 1962.", ["Beatles"]) == 1.0
    assert best_subspan_em("an apple a day", ["The Apple"]) == 1.0  # articles dropped both sides
    assert best_subspan_em("Wilhelm Conrad Röntgen won it", ["wilhelm conrad röntgen"]) == 1.0
    assert best_subspan_em("U.S.A.", ["USA"]) == 1.0  # punctuation removed
    assert best_subspan_em("Paris", ["London", "Rome"]) == 0.0
    assert best_subspan_em("anything", [""]) == 0.0  # an empty gold answer never matches


def _examples(n=30):
    return [NQExample(f"q{i}?", (f"answer{i}",), Document(f"passage {i} mentions answer{i}.", f"T{i}"))
            for i in range(n)]


def test_distractors_never_contain_the_answer_and_gold_goes_where_asked():
    ex = _examples()
    # make some passages mention question 0's answer: they must never be drawn as its distractors
    ex[5] = NQExample("q5?", ("answer5",), Document("this one says answer0 too", "T5"))
    ex[9] = NQExample("q9?", ("answer9",), Document("x", "The ANSWER0"))
    for pos, slot in (("first", 0), ("middle", 5), ("last", 9)):
        docs, got = build_documents(ex, 0, 10, pos, seed=3)
        assert got == slot and docs[slot] == ex[0].gold and len(docs) == 10
        assert all("answer0" not in normalize_answer(d.text + " " + d.title) for i, d in enumerate(docs) if i != slot)
    assert build_documents(ex, 0, 10, "random", seed=3) == build_documents(ex, 0, 10, "random", seed=3)
    with pytest.raises(ValueError, match="gold position"):
        build_documents(ex, 0, 10, "centre")
    with pytest.raises(ValueError, match="distractors"):
        build_documents(ex, 0, 40)


def test_missing_field_gives_a_clear_error(tmp_path):
    p = tmp_path / "bad.jsonl.gz"
    with gzip.open(p, "wt") as f:
        f.write(json.dumps({"question": "q", "answers": ["a"], "ctxs": [{"title": "t", "text": "x"}]}) + "\n")
        f.write(json.dumps({"question": "q", "ctxs": []}) + "\n")
    with pytest.raises(DataFormatError, match="bad.jsonl.gz:2: missing field 'answers'"):
        load_nq(p)
    with pytest.raises(DataFormatError, match="does not exist .*KVLINK_RAG_NQ_PATH=path or make ... NQ=path"):
        load_nq(tmp_path / "nope.jsonl")
    assert len(load_nq(p, limit=1)) == 1
