"""The batching scheduler gives each request what the one-at-a-time path gives (tiny model, float32)."""

from __future__ import annotations

import threading
import time

import pytest

from factories import tiny_text_engine
from kvlink_rag.runtime.gen_request import GenRequest
from kvlink_rag.runtime.prefix_tree import PrefixTree
from kvlink_rag.runtime.limits import QueueFull, SchedulerLimits
from kvlink_rag.runtime.scheduler import Scheduler
from kvlink_rag.types import Document

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
    """Submit ``reqs`` together; ``[(token ids as streamed, GenResult)]``."""
    handles = [sched.submit(r) for r in reqs]
    return [(list(h.tokens()), h.result) for h in handles]


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


def turn_ids(engine, turns):
    from kvlink_rag.text.conversation import Turn, conversation_ids

    return conversation_ids(engine.template, engine.lm.tokenizer, [Turn(r, t) for r, t in turns]).tolist()


def chat(sched, engine, turns, docs=DOCS[:2], **kw):
    req = GenRequest(lambda: engine, docs, turn_ids(engine, turns), engine.sampling(), "linked", keep_logits=True, **kw)
    (toks, res), = run_all(sched, [req])
    return engine.lm.tokenizer.decode(toks, skip_special_tokens=True).strip(), res


def test_a_chat_turn_reuses_the_previous_turn_and_equals_recomputing_it(engine):
    shared, fresh = make_scheduler(engine), make_scheduler(engine, budget=0)
    try:
        a1, r1 = chat(shared, engine, [("user", "what is the code word?")])
        turns = [("user", "what is the code word?"), ("assistant", a1), ("user", "and the number?")]
        a2, r2 = chat(shared, engine, turns)
        b2, s2 = chat(fresh, engine, turns)  # nothing shared: every token of turn 2 recomputed
        assert r2.tree_tokens >= r1.prompt_tokens and s2.tree_tokens == 0
        assert r2.cached_tokens >= r2.tree_tokens  # only what follows turn 1's prompt is computed
        assert r2.token_ids == s2.token_ids and a2 == b2
        assert max(float((x - y).abs().max()) for x, y in zip(r2.logits, s2.logits)) < 1e-4
    finally:
        shared.close(), fresh.close()


def test_an_evicted_conversation_is_recomputed_not_answered_from_a_wrong_prefix(engine):
    sched = make_scheduler(engine, budget=1)  # anything stored is evicted at once
    try:
        a1, _ = chat(sched, engine, [("user", "what is the code word?")])
        turns = [("user", "what is the code word?"), ("assistant", a1), ("user", "and the number?")]
        _, r2 = chat(sched, engine, turns)
        assert r2.tree_tokens == 0 and sched.tree.stats()["bytes"] == 0
        fresh = make_scheduler(engine, budget=0)
        try:
            assert chat(fresh, engine, turns)[1].token_ids == r2.token_ids
        finally:
            fresh.close()
    finally:
        sched.close()


def test_a_request_cancelled_mid_batch_leaves_the_others_unchanged(engine):
    sched = make_scheduler(engine)
    try:
        long = dict(max_new_tokens=40)
        reqs = [request(engine, q, DOCS[i: i + 2], **long) for i, q in enumerate(QUESTIONS[:3])]
        handles = [sched.submit(r) for r in reqs]
        gens = [h.tokens() for h in handles]
        next(gens[1])
        gens[1].close()  # the client left after one token
        outs = []
        for g in (gens[0], gens[2]):
            toks = list(g)
            outs.append(toks)
        for (q, d), toks in zip([(QUESTIONS[0], DOCS[0:2]), (QUESTIONS[2], DOCS[2:4])], outs):
            assert toks == engine.answer(q, d, max_new_tokens=40).token_ids
        assert sched.stats()["running"] == 0 and sched.tree.stats()["pinned_nodes"] == 0
    finally:
        sched.close()


def test_a_request_that_fails_while_sampling_fails_alone(engine, monkeypatch):
    from kvlink_rag.runtime import running

    real_step = running.RunningRequest.step

    def step(self, logits):
        if self.params.seed == 13:
            raise RuntimeError("sampling exploded")
        return real_step(self, logits)

    monkeypatch.setattr(running.RunningRequest, "step", step)
    sched = make_scheduler(engine)
    try:
        bad, good = sched.submit(request(engine, "what?", DOCS[:2], seed=13)), sched.submit(request(engine, "who?", DOCS[:2]))
        with pytest.raises(RuntimeError, match="sampling exploded"):
            list(bad.tokens())
        assert list(good.tokens()) == engine.answer("who?", DOCS[:2]).token_ids
        assert sched.stats()["running"] == 0
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


@pytest.mark.parametrize("mode", ["linked", "full"])
def test_a_prefill_split_into_chunks_generates_what_one_forward_generates(engine, mode):
    """max_step_tokens 16 splits every prompt (~60-120 tokens) into chunks computed over several steps, next
    to the other requests' decode tokens; the answers are the one-request path's."""
    sched = make_scheduler(engine, max_step_tokens=16)
    try:
        cases = [(q, DOCS[i: i + 3]) for i, q in enumerate(QUESTIONS)]
        results = run_all(sched, [request(engine, q, d, mode) for q, d in cases])
        assert min(res.prompt_tokens for _, res in results) > 16  # every prefill really was chunked
        for (q, d), (toks, res) in zip(cases, results):
            single = (engine.answer_full if mode == "full" else engine.answer)(q, d)
            assert toks == res.token_ids == single.token_ids
    finally:
        sched.close()


def test_a_long_prefill_shares_its_steps_with_a_short_request(engine):
    """A short request admitted while a long prefill is under way finishes before the long one: the long
    prefill runs in chunks beside it instead of stalling it for its whole length."""
    sched = make_scheduler(engine, max_step_tokens=32)
    try:
        long_req = request(engine, " ".join(QUESTIONS * 8), DOCS, "full", max_new_tokens=2)
        short_req = request(engine, "say kiwi", DOCS[:1], max_new_tokens=2)
        long_h = sched.submit(long_req)
        short_h = sched.submit(short_req)
        for h in (short_h, long_h):
            list(h.tokens())
        assert long_h.result.prompt_tokens > 4 * 32  # several chunks
        assert short_h.result.timings["ttft_s"] < long_h.result.timings["ttft_s"]
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


def test_a_request_decodes_over_one_piece_and_lends_its_prompt_to_the_tree(engine, monkeypatch):
    """A request whose prefix-tree match is short (the anchor prefix) copies it into its own KV; after its
    prefill the tree takes views of its buffers (nothing held twice) and its decode steps attend over that
    one contiguous piece; a second request with the same prompt is served from the tree with the same answer."""
    from kvlink_rag.runtime import model_runner

    pieces_per_decode: list[int] = []
    real = model_runner.attend

    def counting(q, pieces, mask, scale, causal=False):
        if q.shape[1] == 1:
            pieces_per_decode.append(len(pieces))
        return real(q, pieces, mask, scale, causal)

    monkeypatch.setattr(model_runner, "attend", counting)
    sched = make_scheduler(engine)
    try:
        (warm, _), = run_all(sched, [request(engine, "say kiwi", DOCS[:1])])  # the anchor prefix enters the tree
        pieces_per_decode.clear()
        (first, r1), = run_all(sched, [request(engine, "who wrote it and when?", DOCS[1:3])])
        assert 0 < r1.tree_tokens <= 256 and set(pieces_per_decode) == {1}
        before = sched.tree.stats()["bytes"]
        (again, r2), = run_all(sched, [request(engine, "who wrote it and when?", DOCS[1:3])])
        assert again == first and r2.tree_tokens == r2.prompt_tokens - 1
        assert sched.tree.stats()["bytes"] >= before  # the first request's prompt and answer stayed in the tree
        assert first == engine.answer("who wrote it and when?", DOCS[1:3]).token_ids
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
