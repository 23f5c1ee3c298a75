"""The key-value retrieval task: seeded examples, distinct keys, the gold pair at its slot, exact match."""

from __future__ import annotations

import json
import uuid

import pytest

from factories import tiny_text_engine
from training.eval import evaluate
from training.kv_retrieval import build_documents, exact_match, make_example, make_examples


def _pairs(doc) -> dict[str, str]:
    return json.loads(doc.text)


def test_examples_are_deterministic_for_a_seed_and_differ_across_seeds():
    assert make_examples(3, 5, seed=1) == make_examples(3, 5, seed=1)
    assert make_examples(3, 5, seed=1)[0].key != make_examples(3, 5, seed=2)[0].key
    assert make_examples(4, 5)[:2] == make_examples(2, 5)  # question i does not depend on n


def test_documents_hold_distinct_uuid4_pairs_and_the_answer_is_the_gold_value():
    ex = make_example(0, 10, pairs_per_doc=3, seed=7)
    docs, _ = build_documents([ex], 0, 10, "first")
    pairs = [_pairs(d) for d in docs]
    assert all(len(p) == 3 for p in pairs)
    keys = [k for p in pairs for k in p]
    values = [v for p in pairs for v in p.values()]
    assert len(set(keys + values)) == 60  # every key and value distinct
    assert all(uuid.UUID(u).version == 4 for u in keys + values)
    assert _pairs(ex.gold)[ex.key] == ex.answers[0] and len(ex.answers) == 1
    assert sum(ex.key in p for p in pairs) == 1
    assert f'Key: "{ex.key}"' in ex.question and ex.question.endswith("Corresponding value:")


@pytest.mark.parametrize("position, slot", [("first", 0), ("middle", 5), ("last", 9)])
def test_the_gold_pair_is_at_the_requested_slot_and_the_distractors_keep_their_order(position, slot):
    examples = make_examples(2, 10)
    docs, got = build_documents(examples, 1, 10, position)
    assert got == slot and docs[slot] == examples[1].gold and examples[1].key in _pairs(docs[slot])
    assert [d for i, d in enumerate(docs) if i != slot] == list(examples[1].distractors)
    rand = [build_documents(examples, 1, 10, "random", seed=s)[1] for s in range(3)]
    assert rand == [build_documents(examples, 1, 10, "random", seed=s)[1] for s in range(3)]  # seeded


def test_exact_match_needs_the_uuid_verbatim():
    gold = ("0870e15c-2fcd-41b5-924b-ace4307bf326",)
    assert exact_match('The value is "0870e15c-2fcd-41b5-924b-ace4307bf326".', gold) == 1.0
    assert exact_match("0870e15c2fcd41b5924bace4307bf326", gold) == 0.0  # best_subspan_em would count it
    assert exact_match("0870E15C-2FCD-41B5-924B-ACE4307BF326", gold) == 0.0
    assert exact_match("0870e15c-2fcd-41b5-924b", gold) == 0.0


@pytest.mark.parametrize("call, message", [
    (lambda: make_examples(0, 10), "number of questions (0) must be >= 1"),
    (lambda: make_examples(2, 0), "documents (0)"),
    (lambda: make_example(0, 10, pairs_per_doc=0), "pairs per document (0)"),
    (lambda: make_example(-1, 10), "must be >= 0"),
    (lambda: build_documents(make_examples(1, 4), 0, 5), "has 4 documents, not 5"),
    (lambda: build_documents(make_examples(1, 4), 1, 4), "out of range"),
    (lambda: build_documents(make_examples(1, 4), 0, 4, "sideways"), "unknown gold position"),
])
def test_bad_counts_are_clear_errors(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_evaluate_runs_the_task_with_its_documents_and_metric(tmp_path):
    engine = tiny_text_engine(tmp_path)
    examples = make_examples(3, 4, pairs_per_doc=1)
    rows = evaluate({"full": engine, "naive": engine}, examples, 3, 4, ["rotate"], max_new_tokens=2,
                    build=build_documents, metric=lambda answer, answers: 0.25)
    assert [(r["index"], r["gold_position"], r["gold_slot"]) for r in rows[::2]] == [
        (0, "first", 0), (1, "middle", 2), (2, "last", 3)]
    assert all(r["em"] == 0.25 and r["nll"] > 0 for r in rows)
