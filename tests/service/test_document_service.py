"""Ingest, update (invalidation), delete and precompute through the document service, with a real engine."""

from __future__ import annotations

import pytest
import torch

from factories import tiny_text_engine
from service.settings import Settings
from kvlink_rag.types import Document
from service.documents import DocumentService
from store.factory import open_store

TEXT = "The lighthouse on Skerry Point was built in 1851 and painted red and white."
EDITED = "The lighthouse on Skerry Point was built in 1852 and painted black and white."


def _setup(tmp_path):
    queue: list[tuple[str, str, int]] = []
    settings = Settings(home=tmp_path, model="unused", store_max_bytes=64 << 20, host_cache_bytes=32 << 20)
    st = open_store(settings, enqueue=lambda *task: queue.append(task))
    engine = tiny_text_engine(tmp_path, cache=None)
    engine.cache = st.cache.for_tenant("acme")  # the tests' tenant: its keys are the catalog's for "acme"
    return st, engine, queue


def _drain(st, engine, queue):
    done = [DocumentService(st, engine).precompute(t, d, v) for t, d, v in queue]
    queue.clear()
    return done


def test_same_text_does_nothing_new_text_invalidates_then_serves_the_new_cache(tmp_path):
    st, engine, queue = _setup(tmp_path)
    first = DocumentService(st).ingest("acme", "lh", TEXT, "Lighthouse")
    assert first.queued and first.record.status == "queued" and queue == [("acme", "lh", 1)]
    [ready] = _drain(st, engine, queue)
    old_key = ready.cache_key
    assert ready.status == "ready" and st.blobs.contains(old_key) and ready.num_tokens > 10

    again = DocumentService(st).ingest("acme", "lh", "  " + TEXT + "\n", "Lighthouse")  # same normalised text
    assert not again.queued and not again.changed and queue == []

    upd = DocumentService(st).ingest("acme", "lh", EDITED, "Lighthouse")
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
    DocumentService(st).ingest("acme", "lh", TEXT)
    DocumentService(st).ingest("acme", "lh", EDITED)
    assert queue == [("acme", "lh", 1), ("acme", "lh", 2)]
    v1, v2 = _drain(st, engine, queue)
    assert v1 is None and v2.version == 2  # the outdated task did no work
    assert len(st.blobs.keys()) == 1
    assert DocumentService(st).delete("acme", "lh")
    assert st.index.get("acme", "lh") is None and st.blobs.keys() == [] and st.texts.get("acme", "lh") is None
    assert not DocumentService(st).delete("acme", "lh")


def test_near_duplicates_are_reported_and_tenants_are_separate(tmp_path):
    st, engine, queue = _setup(tmp_path)
    long = (TEXT + " Its keeper, Ann Morrow, kept the lamp lit through the storms of the winter of 1867, "
            "when three ships ran aground on the reef to the north. The tower is 31 metres tall, has 140 steps, "
            "and its lens was made in Paris by Henry-Lepaute. It was automated in 1984 and is now a museum "
            "run by the county, open from April to October, with a small cafe in the old keeper's cottage.")
    DocumentService(st).ingest("acme", "a", long)
    near = DocumentService(st).ingest("acme", "b", long.replace("museum", "gallery"))
    assert [d for d, _ in near.near_duplicates] == ["a"] and near.near_duplicates[0][1] <= 3
    other = DocumentService(st).ingest("globex", "c", long)
    assert other.near_duplicates == []
    # identical text in two documents shares one cache; deleting one keeps it for the other
    _drain(st, engine, queue)
    DocumentService(st).ingest("acme", "twin", long)
    _drain(st, engine, queue)
    key = st.index.get("acme", "a").cache_key
    assert st.index.get("acme", "twin").cache_key == key
    DocumentService(st).delete("acme", "a")
    assert st.blobs.contains(key)


def _meanwhile(engine, action):
    """The engine, running ``action`` while it encodes (a DELETE or PUT arriving mid-precompute)."""
    import copy

    eng = copy.copy(engine)

    def encode(doc):
        action()
        return engine.encode(doc)

    eng.encode = encode
    return eng


def test_a_delete_during_precompute_leaves_no_cache(tmp_path):
    st, engine, queue = _setup(tmp_path)
    DocumentService(st).ingest("acme", "lh", TEXT)
    eng = _meanwhile(engine, lambda: DocumentService(st).delete("acme", "lh"))
    assert DocumentService(st, eng).precompute("acme", "lh", 1) is None
    assert st.blobs.keys() == [] and st.index.get("acme", "lh") is None


def test_an_update_during_precompute_keeps_only_the_new_versions_cache(tmp_path):
    st, engine, queue = _setup(tmp_path)
    DocumentService(st).ingest("acme", "lh", TEXT)
    queue.clear()
    eng = _meanwhile(engine, lambda: DocumentService(st).ingest("acme", "lh", EDITED))
    assert DocumentService(st, eng).precompute("acme", "lh", 1) is None  # v1 lost the race: its cache is dropped
    assert st.blobs.keys() == []
    [ready] = _drain(st, engine, queue)
    assert ready.version == 2 and st.blobs.keys() == [ready.cache_key]
    # an update back to the first text while v3 waits: v2's task is skipped, v3 reuses nothing stale
    DocumentService(st).ingest("acme", "lh", TEXT)
    DocumentService(st).ingest("acme", "lh", EDITED)
    v3, v4 = _drain(st, engine, queue)
    assert v3 is None and v4.version == 4 and v4.cache_key == ready.cache_key  # same text, same key
    assert st.blobs.keys() == [ready.cache_key]


def test_a_delete_just_after_a_precompute_marked_its_record_ready_leaves_no_cache(tmp_path, monkeypatch):
    from store.check import check_store

    st, engine, queue = _setup(tmp_path)
    DocumentService(st).ingest("acme", "lh", TEXT)
    set_status = st.index.set_status

    def then_delete(*args, **fields):  # the DELETE lands between the record turning ready and the cache re-check
        rec = set_status(*args, **fields)
        if rec is not None and rec.status == "ready":
            DocumentService(st).delete("acme", "lh")  # drops the cache: the precompute finds it gone
        return rec

    monkeypatch.setattr(st.index, "set_status", then_delete)
    DocumentService(st, engine).precompute("acme", "lh", 1)
    assert st.index.get("acme", "lh") is None and st.blobs.keys() == []  # not stored again for no record
    assert check_store(st, min_age_s=0).problems == 0


def test_a_requeue_by_a_racing_drop_keeps_the_reference_to_the_cache_a_precompute_restores(tmp_path, monkeypatch):
    """Deleting twin ``a`` drops their shared cache while ``b``'s precompute (which found it stored) turns ``b``
    ready; the drop re-queues ``b`` while that precompute stores the cache again. ``b`` keeps pointing at it, so
    deleting ``b`` before its task runs leaves nothing behind."""
    import threading

    from store.check import check_store

    st, engine, queue = _setup(tmp_path)
    for doc_id in ("a", "b"):
        DocumentService(st).ingest("acme", doc_id, TEXT)  # the same text: one cache key
    _drain(st, engine, queue[:1])
    key, queue[:] = st.index.get("acme", "a").cache_key, []
    main, ready, go_on = threading.current_thread(), threading.Event(), threading.Event()
    find, set_status = st.index.find_by_cache_key, st.index.set_status
    b = threading.Thread(target=lambda: DocumentService(st, engine).precompute("acme", "b", 1))
    checks: list[str] = []

    def find_then_let_b_turn_ready(k):  # the drop's first check finds no user; then b turns ready
        users = find(k)
        if threading.current_thread() is main and not checks:
            checks.append(k)
            b.start()
            assert ready.wait(10)
        return users

    def pausing_set_status(tenant, doc_id, status, /, version=None, **fields):
        if threading.current_thread() is b:  # b's precompute: ready, then paused before it re-checks the cache
            rec = set_status(tenant, doc_id, status, version=version, **fields)
            ready.set()
            assert go_on.wait(10)
            return rec
        go_on.set()  # the drop re-queues b: b's precompute first stores the cache again and finishes
        b.join(10)
        return set_status(tenant, doc_id, status, version=version, **fields)

    monkeypatch.setattr(st.index, "find_by_cache_key", find_then_let_b_turn_ready)
    monkeypatch.setattr(st.index, "set_status", pausing_set_status)
    DocumentService(st).delete("acme", "a")
    assert not b.is_alive() and queue == [("acme", "b", 1)] and st.blobs.keys() == [key]
    assert st.index.get("acme", "b").status == "queued" and st.index.get("acme", "b").cache_key == key
    DocumentService(st).delete("acme", "b")  # before its task ran (an API process, no engine)
    assert st.blobs.keys() == [] and check_store(st, min_age_s=0).problems == 0


def test_a_cache_a_query_wrote_for_a_document_deleted_meanwhile_is_dropped(tmp_path):
    st, engine, queue = _setup(tmp_path)
    DocumentService(st).ingest("acme", "lh", TEXT)
    _, doc = st.catalog.document("acme", "lh")
    _, hit = engine.get_or_encode(doc)  # a query encodes it on the spot and stores the cache
    assert not hit and len(st.blobs.keys()) == 1
    assert DocumentService(st).delete("acme", "lh")  # the queued record pointed at no cache yet
    assert DocumentService(st, engine).adopt("acme", "lh", 1, doc) is None
    assert st.blobs.keys() == []
    DocumentService(st).ingest("acme", "lh", TEXT)  # and the usual case: the query's cache becomes the record's
    rec, doc = st.catalog.document("acme", "lh")
    engine.get_or_encode(doc)
    ready = DocumentService(st, engine).adopt("acme", "lh", rec.version, doc)
    assert ready.status == "ready" and st.blobs.keys() == [ready.cache_key]


def test_tenants_get_separate_caches_of_the_same_text(tmp_path):
    st, engine, queue = _setup(tmp_path)
    DocumentService(st).ingest("acme", "lh", TEXT)
    DocumentService(st).ingest("globex", "lh", TEXT)
    a, g = _drain(st, engine, queue)
    assert a.cache_key != g.cache_key and sorted(st.blobs.keys()) == sorted([a.cache_key, g.cache_key])
    assert a.cache_key == engine.cache_key(Document(TEXT)) == st.catalog.cache_key("acme", Document(TEXT), engine)
    DocumentService(st).delete("globex", "lh")
    assert st.blobs.keys() == [a.cache_key]


def test_reposting_a_queued_document_queues_it_again(tmp_path):
    st, engine, queue = _setup(tmp_path)
    DocumentService(st).ingest("acme", "lh", TEXT)
    queue.clear()  # the task was lost (a crash)
    again = DocumentService(st).ingest("acme", "lh", TEXT)
    assert again.queued and not again.changed and queue == [("acme", "lh", 1)]
    _drain(st, engine, queue)
    assert not DocumentService(st).ingest("acme", "lh", TEXT).queued and queue == []  # ready: nothing to do


def test_a_corrupt_text_is_marked_failed_and_reingesting_repairs_it(tmp_path):
    from store.integrity import CorruptEntry

    st, engine, queue = _setup(tmp_path)
    DocumentService(st).ingest("acme", "code", "The door code is KIWI42.")
    key = b"acme\0code"

    def flip(txn):
        txn.put(key, bytes(txn.get(key, db=st.texts._db)).replace(b"KIWI42", b"KIWI92"), db=st.texts._db)

    st.texts.env.write(flip)
    assert _drain(st, engine, queue) == [None] and st.blobs.keys() == []
    rec = st.index.get("acme", "code")
    assert rec.status == "failed" and "corrupt (checksum mismatch); re-ingest" in rec.metadata["error"]
    with pytest.raises(CorruptEntry):
        st.catalog.document("acme", "code")
    again = DocumentService(st).ingest("acme", "code", "The door code is KIWI42.")  # same text: repairs it
    assert again.queued and again.record.version == 2
    [ready] = _drain(st, engine, queue)
    assert ready.status == "ready" and st.catalog.document("acme", "code")[1].text == "The door code is KIWI42."


def test_a_document_larger_than_the_whole_store_is_marked_failed_with_the_reason(tmp_path):
    from service.documents import CacheTooLarge

    queue: list[tuple[str, str, int]] = []
    st = open_store(Settings(home=tmp_path, model="unused", store_max_bytes=1 << 20),
                    enqueue=lambda *task: queue.append(task))
    engine = tiny_text_engine(tmp_path, layers=8, kv_dtype="float32", cache=None)  # 2 KiB of KV a token
    engine.cache = st.cache.for_tenant("acme")
    DocumentService(st).ingest("acme", "huge", "word " * 700)  # ~1.4 MB of KV, the store holds at most 1 MiB
    with pytest.raises(CacheTooLarge, match=r"does not fit the document store"):  # a ValueError: permanent
        _drain(st, engine, queue)
    rec = st.index.get("acme", "huge")
    assert rec.status == "failed" and "raise KVLINK_RAG_STORE_MAX_BYTES" in rec.metadata["error"]
    assert st.blobs.keys() == []
    kv, hit = engine.get_or_encode(Document("word " * 700))  # the query path: answered from the fresh KV
    assert not hit and kv.num_tokens > 600 and st.blobs.keys() == []


def test_a_storm_of_concurrent_updates_and_deletes_leaves_every_cache_referenced(tmp_path):
    import queue
    import random
    import threading

    from store.check import check_store

    tasks: queue.Queue = queue.Queue()
    settings = Settings(home=tmp_path, model="unused", store_max_bytes=64 << 20, host_cache_bytes=32 << 20)
    st = open_store(settings, enqueue=lambda *task: tasks.put(task))
    engine = tiny_text_engine(tmp_path, cache=None)
    stop = threading.Event()

    def worker():  # two precompute workers racing the updates (as Celery workers do)
        while not (stop.is_set() and tasks.empty()):
            try:
                task = tasks.get(timeout=0.02)
            except queue.Empty:
                continue
            DocumentService(st, engine).precompute(*task)

    workers = [threading.Thread(target=worker) for _ in range(2)]
    for w in workers:
        w.start()
    rng = random.Random(0)
    notices = [f"Notice {i}: the harbour closes at {i + 5} pm." for i in range(4)]  # shared texts: shared keys
    for _ in range(150):
        doc_id = f"d{rng.randrange(3)}"
        if rng.random() < 0.2:
            DocumentService(st).delete("acme", doc_id)
        else:
            DocumentService(st).ingest("acme", doc_id, rng.choice(notices))
    stop.set()
    for w in workers:
        w.join()
    while not tasks.empty():  # anything queued again at the very end
        DocumentService(st, engine).precompute(*tasks.get())
    report = check_store(st, min_age_s=0)
    assert report.problems == 0, report.to_dict()
    recs = st.index.list("acme")
    assert all(r.status == "ready" and r.cache_key in st.blobs for r in recs)
    assert sorted(st.blobs.keys()) == sorted({r.cache_key for r in recs})


def test_a_store_busy_with_an_older_reader_is_transient_not_a_failed_document(tmp_path, monkeypatch):
    from service.documents import CacheTooLarge
    from store.lmdb_env import StoreBusyError

    st, engine, queue = _setup(tmp_path)
    DocumentService(st).ingest("acme", "lh", TEXT)
    real, calls = st.blobs.put_record, []

    def busy_once(key, record):
        calls.append(key)
        if len(calls) == 1:
            raise StoreBusyError("no room for it: pid 7 reads a snapshot older than its eviction")
        return real(key, record)

    monkeypatch.setattr(st.blobs, "put_record", busy_once)
    with pytest.raises(StoreBusyError) as busy:  # not CacheTooLarge (a ValueError: the document marked failed)
        DocumentService(st, engine).precompute(*queue[0])
    assert not isinstance(busy.value, CacheTooLarge) and not isinstance(busy.value, ValueError)
    assert st.index.get("acme", "lh").status == "queued" and st.blobs.keys() == []
    [ready] = _drain(st, engine, queue)  # the retry the queue makes
    assert ready.status == "ready" and st.blobs.contains(ready.cache_key) and len(calls) == 2
