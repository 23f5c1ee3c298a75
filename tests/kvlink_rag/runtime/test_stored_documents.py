"""Documents read from LMDB into a request's KV blocks: importance-ordered records arrive in their stored order
with their positions as data, written straight into the blocks (read on the consumer's thread) or through a
reader thread; either way the request holds the host tier's rotated KV, row for row, and answers the same."""

from __future__ import annotations

import pytest
import torch

from factories import tiny_text_engine
from kvlink_rag.runtime.request_layout import fill_cached, linked_layout, new_sequence
from scheduler_helpers import DOCS, make_scheduler, request, run_all
from store.factory import open_store
from store.settings import StoreSettings
from store.tiers import prefetch

QUESTION = "what is the code word?"


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    home = tmp_path_factory.mktemp("stored")
    st = open_store(StoreSettings(home=home, store_max_bytes=64 << 20, host_cache_bytes=32 << 20))
    engine = tiny_text_engine(home, max_new_tokens=5, kv_dtype="float32")
    engine.cache = st.cache
    docs = DOCS[:4]
    for d in docs:
        engine.get_or_encode(d)
    return engine, st, docs


def _filled(engine, docs, source):
    """``(seq, layout, first item to compute)`` after the cached items of a linked layout over ``docs``."""
    q_ids = engine.template.question_ids(engine.lm.tokenizer, QUESTION).tolist()
    lay = linked_layout(engine.prefix.token_ids.tolist(), [engine.cache_key(d) for d in docs],
                        [int(engine.document_ids(d).numel()) for d in docs], engine.link_tokens.k, q_ids,
                        engine.anchored)
    seq = new_sequence(engine.lm, [], lay.num_tokens + 1)
    return seq, lay, fill_cached(engine.lm, lay, 0, seq, engine.prefix, source)


@pytest.mark.parametrize("depth", [0, 2])
def test_stored_order_fills_the_blocks_with_the_host_tiers_rotated_kv(stored, depth):
    engine, st, docs = stored
    keys = [engine.cache_key(d) for d in docs]
    host = [st.cache.get(k) for k in keys]  # whole documents in position order
    seq_h, lay_h, n_h = _filled(engine, docs, host)
    source = prefetch.prefetch_layers(st.blobs, keys, depth=depth)
    assert (source.fill is not None) == (depth == 0) and source.positions is not None
    seq_s, lay_s, n_s = _filled(engine, docs, source)
    assert n_h == n_s
    pos_h, pos_s = lay_h.storage_positions(0, n_h), lay_s.storage_positions(0, n_s)
    assert not torch.equal(pos_h, pos_s)  # the stored order, carried as positions
    assert torch.equal(torch.sort(pos_h).values, torch.sort(pos_s).values)
    (k_h, v_h), (k_s, v_s) = seq_h.own_kv(), seq_s.own_kv()  # [layers, kv_heads, tokens, head_dim]
    by_h, by_s = torch.argsort(pos_h), torch.argsort(pos_s)
    assert torch.equal(k_h[:, :, by_h], k_s[:, :, by_s]) and torch.equal(v_h[:, :, by_h], v_s[:, :, by_s])


@pytest.mark.parametrize("depth", [0, 2])
def test_a_query_over_documents_only_in_lmdb_answers_as_from_the_host_tier(stored, monkeypatch, depth):
    engine, st, docs = stored
    keys = [engine.cache_key(d) for d in docs]
    sched = make_scheduler(engine)
    try:
        (want, _), = run_all(sched, [request(engine, QUESTION, docs)])
    finally:
        sched.close()
    for k in keys:
        st.tiered.invalidate(k)
    assert all(isinstance(it, str) for it in st.cache.resolve(keys))
    monkeypatch.setattr(prefetch, "reader_depth", lambda: depth)
    sched = make_scheduler(engine)  # a new prefix tree: nothing of the first run is reused
    try:
        (got, res), = run_all(sched, [request(engine, QUESTION, docs)])
    finally:
        sched.close()
    assert got == want and res.tree_tokens == 0
