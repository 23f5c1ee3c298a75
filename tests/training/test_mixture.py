"""The task mixture's sampler: deterministic draws in proportion to the weights, each task's examples as
specified, fixed validation examples, training key-value questions apart from evaluation's."""

from __future__ import annotations

import pytest

from evaluation.nq import NQExample
from kvlink_rag.types import Document
from training import kv_retrieval as kv
from training.mixture import KV_SENTENCE, KV_TRAIN_SEED, Mixture, draw_task, parse_weights, train_sample, val_samples

COLOURS = ["red", "blue", "green", "black", "white", "pink", "gold", "grey", "brown", "cyan", "lime", "teal"]


def _examples(n=40) -> list[NQExample]:
    return [NQExample(f"what colour is thing {i}?", (f"{COLOURS[i % 12]}{i}",),
                      Document(f"Thing {i} is painted {COLOURS[i % 12]}{i} all over.", f"Thing {i}")) for i in range(n)]


def _mix(**kw) -> Mixture:
    return Mixture(**{"weights": (("nq", 1.0), ("kv", 1.0), ("long", 1.0), ("retention", 1.0)), **kw}).check()


def test_tasks_are_drawn_in_proportion_to_their_weights_and_deterministically():
    mix = Mixture(weights=(("nq", 3.0), ("kv", 1.0), ("long", 0.0))).check()
    draws = [draw_task(mix, 0, i) for i in range(4000)]
    assert draws == [draw_task(mix, 0, i) for i in range(4000)]  # a resumed run draws the same
    assert set(draws) == {"nq", "kv"}  # weight 0: never
    assert 0.72 < draws.count("nq") / len(draws) < 0.78
    assert draws != [draw_task(mix, 1, i) for i in range(4000)]  # another seed, another sequence
    assert mix.tasks == ["nq", "kv"]


def test_weights_parse_and_bad_mixtures_are_refused():
    assert parse_weights("nq=1, kv=0.5") == (("nq", 1.0), ("kv", 0.5))
    for bad in ("nq", "nq=x", "nq=1,kv"):
        with pytest.raises(ValueError, match="task=weight"):
            parse_weights(bad)
    with pytest.raises(ValueError, match="unknown task 'squad'"):
        Mixture(weights=(("squad", 1.0),)).check()
    with pytest.raises(ValueError, match="at least one above 0"):
        Mixture(weights=(("nq", 0.0),)).check()
    with pytest.raises(ValueError, match="MIN <= MAX"):
        Mixture(nq_docs=(9, 3)).check()
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        Mixture(retentions=(0.0,)).check()


def test_each_task_builds_its_examples():
    train, mix = _examples(), _mix(nq_docs=(5, 8), long_passages=(3, 4), retentions=(0.4, 0.6), docs=6)
    order = list(range(len(train)))
    by_task: dict[str, list] = {}
    for i in range(200):
        s = train_sample(mix, train, order, 0, i)
        assert s == train_sample(mix, train, order, 0, i)
        by_task.setdefault(s.task, []).append(s)
    assert set(by_task) == {"nq", "kv", "long", "retention"}
    assert {len(s.docs) for s in by_task["nq"]} == {5, 6, 7, 8} and all(s.retention == 1 for s in by_task["nq"])
    for s in by_task["kv"]:
        assert len(s.docs) == 10 and sum(s.answers[0] in d.text for d in s.docs) == 1
    for s in by_task["long"]:  # one document of 3-4 passages, the answer's passage among them
        assert len(s.docs) == 1 and s.docs[0].text.count("\n\n") in (2, 3) and s.answers[0] in s.docs[0].text
    assert {s.retention for s in by_task["retention"]} == {0.4, 0.6}
    assert all(len(s.docs) == 6 for s in by_task["retention"])
    golds = [sum(s.answers[0] in d.text for d in s.docs[:4]) for s in by_task["nq"]]
    assert 0 < sum(golds) < len(golds)  # the gold slot moves (first 4 slots hold it only sometimes)


def test_training_key_value_questions_are_not_evaluation_questions():
    trained = {kv.make_example(i, 10, seed=KV_TRAIN_SEED).key for i in range(300)}
    evaluated = {kv.make_example(i, 10, seed=0).key for i in range(300)}
    assert not trained & evaluated


def test_validation_examples_are_fixed_per_task():
    ex = _examples()
    val, pool = ex[-5:], ex[-5:] + ex[:-5]
    mix = _mix(docs=4, long_passages=(3, 5), retentions=(0.8, 0.4))
    for task in mix.tasks:
        a, b = val_samples(mix, task, val, pool, 3), val_samples(mix, task, val, pool, 3)
        assert a == b and len(a) == 3 and all(s.task == task for s in a)
    assert [len(s.docs) for s in val_samples(mix, "nq", val, pool, 3)] == [4, 4, 4]
    assert {s.retention for s in val_samples(mix, "retention", val, pool, 3)} == {0.4}
    long = val_samples(mix, "long", val, pool, 3)
    assert all(len(s.docs) == 1 and s.docs[0].text.count("\n\n") == 3 for s in long)  # midpoint: 4 passages
    kv_val = {s.question for s in val_samples(mix, "kv", val, pool, 3)}
    kv_train = {train_sample(Mixture(weights=(("kv", 1.0),)), ex, list(range(40)), 0, i).question for i in range(50)}
    assert not kv_val & kv_train


def test_a_pool_makes_kv_and_long_examples_recur_so_their_documents_are_encoded_once():
    train, order = _examples(), list(range(40))
    for task in ("kv", "long"):
        mix = Mixture(weights=((task, 1.0),), pool=3, long_passages=(3, 6)).check()
        a, b = train_sample(mix, train, order, 0, 1), train_sample(mix, train, order, 0, 4)
        assert a.question == b.question and {d.text for d in a.docs} == {d.text for d in b.docs}
        assert train_sample(mix, train, order, 0, 2).question != a.question


def test_kv_sentence_answers_put_the_value_in_a_sentence_first():
    ex = _examples()
    value = Mixture(weights=(("kv", 1.0),)).check()
    sentence = Mixture(weights=(("kv", 1.0),), kv_answer="sentence").check()
    a, b = (train_sample(m, ex, list(range(40)), 0, 3) for m in (value, sentence))
    assert a.question == b.question and a.docs == b.docs and len(a.answers) == 1
    assert b.answers == (f"The corresponding value is {a.answers[0]}.", a.answers[0])
    v = val_samples(sentence, "kv", [], [], 2)
    assert v[0].answers[0] == KV_SENTENCE.format(value=v[0].answers[1]) and len(v[0].answers[1]) == 36
    with pytest.raises(ValueError, match="kv answer 'uuid'"):
        Mixture(kv_answer="uuid").check()
