"""The scheduler's waiting queue (kvlink_rag.runtime.waiting): a full queue refuses, a step admits within its
adapter budget, one request per new document set, in the admission policy's order (tiny model, float32)."""

from __future__ import annotations

import threading
import time

import pytest

from factories import tiny_text_engine
from kvlink_rag.runtime.gen_request import GenRequest
from kvlink_rag.runtime.limits import QueueFull, SchedulerLimits
from kvlink_rag.runtime.prefix_tree import PrefixTree
from kvlink_rag.runtime.scheduler import Scheduler
from scheduler_helpers import DOCS, QUESTIONS, make_scheduler, request, run_all


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return tiny_text_engine(tmp_path_factory.mktemp("waiting"), max_new_tokens=6, kv_dtype="float32")


def test_a_full_queue_refuses_new_requests(engine):
    sched = make_scheduler(engine, max_waiting=0)
    try:
        with pytest.raises(QueueFull, match="retry in"):
            sched.submit(request(engine, "what?", DOCS[:1]))
    finally:
        sched.close()


def test_requests_for_more_adapters_than_can_be_loaded_wait_for_a_free_one(engine):
    rows: list[int] = []
    sched = make_scheduler(engine, max_adapters=1)
    sched.observe = lambda n, waits: rows.append(n)
    try:
        reqs = [request(engine, "what?", DOCS[:2]), request(engine, "who?", DOCS[:2])]
        reqs[0].adapter, reqs[1].adapter = "a", "b"
        results = run_all(sched, reqs)
        assert [r.token_ids for _, r in results] == [engine.answer(q, DOCS[:2]).token_ids for q in ("what?", "who?")]
        assert max(rows) == 1  # never both at once
    finally:
        sched.close()


def test_requests_over_the_same_documents_compute_their_common_prefix_once(engine):
    sched = make_scheduler(engine)
    try:
        qs = ["what is the code word?", "which number?", "say kiwi"]
        results = run_all(sched, [request(engine, q, DOCS[3:6]) for q in qs])  # submitted together
        trees = sorted(r.tree_tokens for _, r in results)
        assert trees[0] == 0 and trees[1] > 100 and trees[2] > 100  # the 2nd and 3rd reuse the 1st's prefill
        assert [r.token_ids for _, r in results] == [engine.answer(q, DOCS[3:6]).token_ids for q in qs]
        # once computed, requests over those documents are admitted together again (no step lost)
        rows: list[int] = []
        sched.observe = lambda n, waits: rows.append(n)
        with sched._cond:  # all three wait before the scheduler looks
            handles = [sched.submit(request(engine, q, DOCS[3:6])) for q in qs]
        assert [len(list(h.tokens())) for h in handles] and rows[0] == 3
    finally:
        sched.close()


def test_a_cache_aware_admission_policy_changes_the_order_not_the_answers(engine):
    from kvlink_rag.runtime.admission import CacheAwarePolicy

    sched = Scheduler(engine.lm, PrefixTree(1 << 30), threading.Lock(), SchedulerLimits(max_running=1),
                      policy=CacheAwarePolicy())
    try:
        cases = [(q, DOCS[i % 2: i % 2 + 2]) for i, q in enumerate(QUESTIONS)]
        results = run_all(sched, [request(engine, q, d) for q, d in cases])
        for (q, d), (toks, res) in zip(cases, results):
            assert toks == res.token_ids == engine.answer(q, d).token_ids
    finally:
        sched.close()


def test_fair_admission_admits_the_short_tenant_before_the_long_tenants_backlog(engine):
    from kvlink_rag.runtime.fair_admission import FairPolicy

    policy, lock, admitted = FairPolicy(), threading.Lock(), []
    sched = Scheduler(engine.lm, PrefixTree(0), lock, SchedulerLimits(max_running=1), policy=policy)

    def tagged(tenant: str, n: int) -> GenRequest:
        def make():
            admitted.append(f"{tenant}:{n}")  # called at admission, in the scheduler's thread
            return engine
        return GenRequest(make, [], list(range(10, 10 + n)), engine.sampling(max_new_tokens=2), "full",
                          tenant=tenant, cold=True)

    try:
        with lock:  # the first long request is chosen alone; the rest queue while its step waits for the lock
            handles = [sched.submit(tagged("long", 300))]
            while sched.waiting:
                time.sleep(0.001)
            handles += [sched.submit(tagged("long", 300)) for _ in range(2)]
            handles += [sched.submit(tagged("short", 8)) for _ in range(3)]
        for h in handles:
            list(h.tokens())
        # the long tenant was charged 300 while the short one was away; the short one is lifted to that counter,
        # the tie goes to the earlier arrival, and then every short request goes before the long backlog
        assert admitted == ["long:300", "long:300", "short:8", "short:8", "short:8", "long:300"]
        steps = [len(h.result.token_ids) + (h.result.finish_reason == "stop") for h in handles]  # a stop token too
        # counters: 1 per prefill token admitted, 2 per sampling step; the short tenant started at the long one's
        # counter once its first request had finished (the next admission with a free slot)
        assert policy.counters["long"] == 3 * 300 + 2 * sum(steps[:3])
        assert policy.counters["short"] == (300 + 2 * steps[0]) + 3 * 8 + 2 * sum(steps[3:])
    finally:
        sched.close()

