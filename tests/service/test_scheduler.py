"""The batching scheduler gives each request what the one-at-a-time path gives (tiny model, float32)."""

from __future__ import annotations

import threading

import pytest

from factories import tiny_text_engine
from kvlink_rag.prefix_tree import PrefixTree
from kvlink_rag.types import Document
from service.gen_request import GenRequest
from service.scheduler import QueueFull, Scheduler, SchedulerLimits

DOCS = [Document(f"Document number {i} says the code word is kiwi{i} and other things {i * 7}.", f"T{i}")
        for i in range(6)]
QUESTIONS = ["what is the code word?", "which number?", "who wrote it and when?", "say kiwi"]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return tiny_text_engine(tmp_path_factory.mktemp("sched"), max_new_tokens=6, kv_dtype="float32")


def make_scheduler(engine, budget=1 << 30, **limits) -> Scheduler:
    return Scheduler(engine.lm, PrefixTree(budget), threading.Lock(), SchedulerLimits(**limits))


def request(engine, question, docs, mode="linked", **sampling) -> GenRequest:
    return GenRequest(lambda: engine, docs, engine.template.question_ids(engine.lm.tokenizer, question).tolist(),
                      engine.sampling(**sampling), mode)


def run_all(sched, reqs):
    handles = [sched.submit(r) for r in reqs]
    out = []
    for h in handles:
        gen = h.tokens()
        toks = []
        while True:
            try:
                toks.append(next(gen))
            except StopIteration as stop:
                out.append((toks, stop.value))
                break
    return out


@pytest.mark.parametrize("mode", ["linked", "full"])
def test_batched_requests_generate_what_single_requests_generate(engine, mode):
    sched = make_scheduler(engine)
    try:
        cases = [(q, DOCS[i: i + 3]) for i, q in enumerate(QUESTIONS)]
        results = run_all(sched, [request(engine, q, d, mode) for q, d in cases])
        for (q, d), (toks, res) in zip(cases, results):
            single = (engine.answer_full if mode == "full" else engine.answer)(q, d)
            assert toks == res.token_ids == single.token_ids
            assert res.finish_reason == single.finish_reason
            assert res.prompt_tokens == single.context_tokens
    finally:
        sched.close()


def test_sampled_requests_keep_their_own_seed(engine):
    sched = make_scheduler(engine)
    try:
        reqs = [request(engine, "what?", DOCS[:2], temperature=1.0, seed=s) for s in (1, 2, 1)]
        results = run_all(sched, reqs)
        single = [engine.answer("what?", DOCS[:2], temperature=1.0, seed=s).token_ids for s in (1, 2, 1)]
        assert [r.token_ids for _, r in results] == single
    finally:
        sched.close()


def test_a_repeated_prompt_is_served_from_the_prefix_tree_with_the_same_answer(engine):
    sched = make_scheduler(engine)
    try:
        (first, r1), = run_all(sched, [request(engine, "what is the code word?", DOCS[:3])])
        (again, r2), = run_all(sched, [request(engine, "what is the code word?", DOCS[:3])])
        assert first == again
        assert r1.tree_tokens == 0 and r2.tree_tokens == r2.prompt_tokens - 1
        assert r2.tree_docs == {engine.cache_key(d) for d in DOCS[:3]}
        (other, r3), = run_all(sched, [request(engine, "which number?", DOCS[:3])])
        assert r3.tree_tokens > engine.prefix.num_tokens and r3.tree_docs == r2.tree_docs
        assert other == engine.answer("which number?", DOCS[:3]).token_ids
    finally:
        sched.close()


def test_a_full_queue_refuses_new_requests(engine):
    sched = make_scheduler(engine, max_waiting=0)
    try:
        with pytest.raises(QueueFull, match="retry in"):
            sched.submit(request(engine, "what?", DOCS[:1]))
    finally:
        sched.close()
