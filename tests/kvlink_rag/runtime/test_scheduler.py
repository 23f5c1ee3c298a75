"""The batching scheduler gives each request what the one-at-a-time path gives (tiny model, float32); which
requests a step admits is tested in test_waiting.py."""

from __future__ import annotations

import pytest

from factories import tiny_text_engine
from kvlink_rag.runtime.gen_request import GenRequest
from scheduler_helpers import DOCS, QUESTIONS, make_scheduler, request, run_all


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return tiny_text_engine(tmp_path_factory.mktemp("sched"), max_new_tokens=6, kv_dtype="float32")


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
    if engine.lm.device.type != "cpu":  # the GPU script runs this file on CUDA too
        pytest.skip("on CUDA a batched and a single forward round differently (~1e-6), enough to move a draw from "
                    "the tiny random model's near-uniform distribution; on the CPU the two are bit-identical")
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


def test_each_admitted_request_watches_its_own_cancellation(engine, monkeypatch):
    """The cache view of a request stops when *that* request is cancelled, not the last one admitted with it."""
    from kvlink_rag.runtime import scheduler as scheduler_module

    watched, real = [], scheduler_module.cancellable_engine

    def recording(eng, cancelled):
        watched.append(cancelled)
        return real(eng, cancelled)

    monkeypatch.setattr(scheduler_module, "cancellable_engine", recording)
    sched = make_scheduler(engine)
    try:
        handles = [sched.submit(request(engine, q, DOCS[i: i + 2])) for i, q in enumerate(QUESTIONS[:3])]
        for h in handles:
            list(h.tokens())
        handles[-1].cancel()  # after the fact: only its own view sees it
        assert len(watched) == 3 and [c() for c in watched] == [False, False, True]
    finally:
        sched.close()
