"""Ingest, update (invalidation), delete and precompute through the catalog, with a real engine."""

from __future__ import annotations

import torch

from factories import tiny_text_engine
from kvlink_rag.settings import Settings
from store.factory import open_store

TEXT = "The lighthouse on Skerry Point was built in 1851 and painted red and white."
EDITED = "The lighthouse on Skerry Point was built in 1852 and painted black and white."


def _setup(tmp_path):
    queue: list[tuple[str, str, int]] = []
    settings = Settings(home=tmp_path, model="unused", store_max_bytes=64 << 20, host_cache_bytes=32 << 20)
    st = open_store(settings, enqueue=lambda *task: queue.append(task))
    engine = tiny_text_engine(tmp_path, cache=None)
    engine.cache = st.cache
    return st, engine, queue


def _drain(st, engine, queue):
    done = [st.catalog.precompute(t, d, v, engine) for t, d, v in queue]
    queue.clear()
    return done


def test_same_text_does_nothing_new_text_invalidates_then_serves_the_new_cache(tmp_path):
    st, engine, queue = _setup(tmp_path)
    first = st.catalog.ingest("acme", "lh", TEXT, "Lighthouse")
    assert first.queued and first.record.status == "queued" and queue == [("acme", "lh", 1)]
    [ready] = _drain(st, engine, queue)
    old_key = ready.cache_key
    assert ready.status == "ready" and st.blobs.contains(old_key) and ready.num_tokens > 10

    again = st.catalog.ingest("acme", "lh", "  " + TEXT + "\n", "Lighthouse")  # same normalised text
    assert not again.queued and not again.changed and queue == []

    upd = st.catalog.ingest("acme", "lh", EDITED, "Lighthouse")
    assert upd.queued and upd.record.status == "stale" and upd.record.version == 2
    _, doc = st.catalog.document("acme", "lh")
    assert doc.text == EDITED
    # before the new cache is ready, a query keys by the new text: the old cache is a different key
    assert engine.cache_key(doc) != old_key
    [ready2] = _drain(st, engine, queue)
    assert ready2.status == "ready" and ready2.version == 2 and ready2.cache_key == engine.cache_key(doc)
    assert not st.blobs.contains(old_key)  # deleted once the new one was ready
    kv, hit = engine.get_or_encode(doc)
    assert hit and torch.equal(kv.token_ids, engine.document_ids(doc))


def test_stale_task_is_skipped_and_delete_removes_everything(tmp_path):
    st, engine, queue = _setup(tmp_path)
    st.catalog.ingest("acme", "lh", TEXT)
    st.catalog.ingest("acme", "lh", EDITED)
    assert queue == [("acme", "lh", 1), ("acme", "lh", 2)]
    v1, v2 = _drain(st, engine, queue)
    assert v1 is None and v2.version == 2  # the outdated task did no work
    assert len(st.blobs.keys()) == 1
    assert st.catalog.delete("acme", "lh")
    assert st.index.get("acme", "lh") is None and st.blobs.keys() == [] and st.texts.get("acme", "lh") is None
    assert not st.catalog.delete("acme", "lh")


def test_near_duplicates_are_reported_and_tenants_are_separate(tmp_path):
    st, engine, queue = _setup(tmp_path)
    long = (TEXT + " Its keeper, Ann Morrow, kept the lamp lit through the storms of the winter of 1867, "
            "when three ships ran aground on the reef to the north. The tower is 31 metres tall, has 140 steps, "
            "and its lens was made in Paris by Henry-Lepaute. It was automated in 1984 and is now a museum "
            "run by the county, open from April to October, with a small cafe in the old keeper's cottage.")
    st.catalog.ingest("acme", "a", long)
    near = st.catalog.ingest("acme", "b", long.replace("museum", "gallery"))
    assert [d for d, _ in near.near_duplicates] == ["a"] and near.near_duplicates[0][1] <= 3
    other = st.catalog.ingest("globex", "c", long)
    assert other.near_duplicates == []
    # identical text in two documents shares one cache; deleting one keeps it for the other
    _drain(st, engine, queue)
    st.catalog.ingest("acme", "twin", long)
    _drain(st, engine, queue)
    key = st.index.get("acme", "a").cache_key
    assert st.index.get("acme", "twin").cache_key == key
    st.catalog.delete("acme", "a")
    assert st.blobs.contains(key)
