"""The scheduler over a KV block pool: blocks freed at once on cancel, a full pool's request waiting (the prefix
tree evicting for it), a request larger than the pool refused by name (tiny model, float32)."""

from __future__ import annotations

import threading
import time

import pytest

from factories import tiny_text_engine
from kvlink_rag.runtime.block_pool import BlockPool, PoolExhausted, configure_pool
from kvlink_rag.runtime.gen_request import GenRequest
from kvlink_rag.runtime.limits import SchedulerLimits
from kvlink_rag.runtime.prefix_tree import PrefixTree
from kvlink_rag.runtime.scheduler import Scheduler
from kvlink_rag.types import Document

DOCS = [Document(f"Document number {i} says the code word is kiwi{i} and other things {i * 7}.", f"T{i}")
        for i in range(6)]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = tiny_text_engine(tmp_path_factory.mktemp("pool"), max_new_tokens=6, kv_dtype="float32")
    yield eng
    configure_pool(eng.lm, 0)


def request(engine, question, docs, **sampling) -> GenRequest:
    return GenRequest(lambda: engine, docs, engine.template.question_ids(engine.lm.tokenizer, question).tolist(),
                      engine.sampling(**sampling), "linked")


def used(pool) -> int:
    return pool.num_blocks - pool.free_blocks


def test_a_cancelled_request_gives_its_blocks_back_in_the_step_it_left(engine):
    pool = configure_pool(engine.lm, 0)
    seen: list[tuple[int, int]] = []
    sched = Scheduler(engine.lm, PrefixTree(0), threading.Lock(), SchedulerLimits())

    def observe(rows, waits):  # after each step: blocks in use against the running requests' tables
        seen.append((used(pool), sum(len(rr.seq.table) for _, rr in list(sched.running) if rr.seq is not None)))

    sched.observe = observe
    try:
        a, b = (sched.submit(request(engine, q, DOCS[i: i + 2], max_new_tokens=40)) for i, q in enumerate(["what?", "who?"]))
        gb = b.tokens()
        next(gb)
        gb.close()  # the client left after one token
        want = engine.answer("what?", DOCS[0:2], max_new_tokens=40).token_ids
        assert list(a.tokens()) == want
        assert seen and all(u == t for u, t in seen)  # never a block held by a request no longer running
        assert used(pool) == 0
    finally:
        sched.close()


def test_a_request_that_does_not_fit_waits_while_the_tree_gives_back_its_blocks(engine):
    pool = configure_pool(engine.lm, 10 * configure_pool(engine.lm, 0).block_bytes)
    sched = Scheduler(engine.lm, PrefixTree(1 << 30), threading.Lock(), SchedulerLimits())
    try:
        cases = [("what is the code word?", DOCS[0:2]), ("which number?", DOCS[2:4]), ("say kiwi", DOCS[4:6])]
        handles = [sched.submit(request(engine, q, d)) for q, d in cases]
        for (q, d), h in zip(cases, handles):  # each needs 7 of the 10 blocks: one at a time, in order
            assert list(h.tokens()) == engine.answer(q, d).token_ids
        assert pool.num_blocks == 10 and sched.tree.evicted_bytes > 0
    finally:
        sched.close()


def test_a_request_larger_than_the_pool_is_refused_with_the_numbers(engine):
    configure_pool(engine.lm, 3 * configure_pool(engine.lm, 0).block_bytes)
    sched = Scheduler(engine.lm, PrefixTree(1 << 30), threading.Lock(), SchedulerLimits())
    try:
        h = sched.submit(request(engine, "what?", DOCS[0:2]))
        with pytest.raises(PoolExhausted, match="free blocks of 3"):
            list(h.tokens())
        assert sched.stats()["running"] == 0 and sched.tree.stats()["pinned_nodes"] == 0
    finally:
        sched.close()


def test_kv_cache_dtype_bfloat16_holds_bfloat16_blocks_and_answers_as_the_one_request_path(tmp_path):
    """KVLINK_RAG_KV_CACHE_DTYPE=bfloat16 on a float32 model: the scheduler's blocks are bfloat16 (half the bytes),
    and a linked answer's logits equal the one-request path's under the same setting (float32 prefill queries over
    the KV widened exactly); they differ from float32 KV only by the KV's rounding."""
    import torch

    from kvlink_rag.runtime.block_pool import kv_pool

    eng = tiny_text_engine(tmp_path, max_new_tokens=3, kv_dtype="float32", kv_cache_dtype="bfloat16")
    eng.lm.kv_cache_dtype = eng.settings.kv_cache_dtype  # load_model's step (tiny_text_engine wraps a model itself)
    assert eng.lm.kv_dtype == torch.bfloat16
    q = "what is the code word?"
    sched = Scheduler(eng.lm, PrefixTree(1 << 30), threading.Lock(), SchedulerLimits(max_step_tokens=16))
    try:
        req = GenRequest(lambda: eng, DOCS[:3], eng.template.question_ids(eng.lm.tokenizer, q).tolist(),
                         eng.sampling(), "linked", keep_logits=True)
        handle = sched.submit(req)
        list(handle.tokens())
        assert kv_pool(eng.lm).dtype == torch.bfloat16
    finally:
        sched.close()
    ctx, _ = eng.link_context(q, DOCS[:3])
    torch.testing.assert_close(handle.result.logits[0], ctx.last_logits, atol=1e-4, rtol=0)
    eng.lm.kv_cache_dtype = "float32"
    wide, _ = eng.link_context(q, DOCS[:3])
    assert not torch.equal(wide.last_logits, ctx.last_logits)
    assert torch.allclose(wide.last_logits, ctx.last_logits, atol=0.05)


def test_the_arenas_a_request_emptied_go_back_once_the_scheduler_idled_past_idle_s(engine):
    lm = engine.lm
    pool = BlockPool(lm.num_layers, lm.config.num_key_value_heads, lm.head_dim, lm.kv_dtype, arena_blocks=1,
                     idle_s=0.3)  # one block an arena: the request's blocks fill several
    lm.kv_pool = pool
    sched = Scheduler(lm, PrefixTree(0), threading.Lock(), SchedulerLimits())
    try:
        want = engine.answer("what?", DOCS[0:2], max_new_tokens=6).token_ids
        assert list(sched.submit(request(engine, "what?", DOCS[0:2], max_new_tokens=6)).tokens()) == want
        grown = pool.num_blocks
        assert grown > 2 and used(pool) == 0
        deadline = time.monotonic() + 10
        while pool.num_blocks > 2 and time.monotonic() < deadline:  # the idle loop trims once a second
            time.sleep(0.05)
        assert pool.num_blocks == 2  # the first arena and one spare stay
    finally:
        sched.close()
        configure_pool(lm, 0)
