"""Recovery: unfinished documents are queued again; a lost index is rebuilt from the stored texts."""

from __future__ import annotations

from factories import tiny_text_engine
from store.settings import StoreSettings
from service.documents import DocumentService
from store.factory import open_store
from store.recovery import index_lost, rebuild_index, requeue_unfinished


def test_unfinished_documents_are_queued_again(tmp_path):
    queue: list = []
    st = open_store(StoreSettings(home=tmp_path, store_max_bytes=64 << 20),
                    enqueue=lambda *task: queue.append(task))
    engine = tiny_text_engine(tmp_path)
    DocumentService(st).ingest("acme", "done", "A document already precomputed.")
    DocumentService(st, engine).precompute("acme", "done", 1)
    DocumentService(st).ingest("acme", "done", "A document updated since: stale.")
    DocumentService(st).ingest("acme", "new", "A document still queued.")
    DocumentService(st).ingest("globex", "other", "Another tenant's queued document.")
    DocumentService(st).ingest("acme", "ok", "A ready one.")
    DocumentService(st, engine).precompute("acme", "ok", 1)
    again: list = []
    assert requeue_unfinished(st, lambda *task: again.append(task)) == 3
    assert sorted(again) == [("acme", "done", 2), ("acme", "new", 1), ("globex", "other", 1)]


def test_a_lost_index_is_rebuilt_from_the_texts(tmp_path):
    queue: list = []
    st = open_store(StoreSettings(home=tmp_path, store_max_bytes=64 << 20),
                    enqueue=lambda *task: queue.append(task))
    engine = tiny_text_engine(tmp_path)
    DocumentService(st).ingest("acme", "lh", "The lighthouse keeper.", "Lighthouse", {"src": "memo"})
    DocumentService(st).ingest("acme", "lh", "The lighthouse keeper, Ann.", "Lighthouse", {"src": "memo"})  # version 2
    ready = DocumentService(st, engine).precompute("acme", "lh", 2)
    DocumentService(st).ingest("globex", "v", "The volcano.")  # never precomputed
    before = {(r.tenant, r.doc_id): r for t in ("acme", "globex") for r in st.index.list(t)}
    for tenant, doc_id in before:
        st.index.delete(tenant, doc_id)  # the index lost everything (e.g. Redis restarted empty)
    assert index_lost(st)
    queue.clear()

    report = rebuild_index(st, engine)
    assert report.ready == [("acme", "lh")] and report.queued == [("globex", "v")] and report.kept == 0
    lh = st.index.get("acme", "lh")
    assert (lh.status, lh.cache_key, lh.version, lh.title, lh.metadata, lh.num_tokens) == (
        "ready", ready.cache_key, 2, "Lighthouse", {"src": "memo"}, ready.num_tokens)
    assert lh.content_hash == before[("acme", "lh")].content_hash and lh.simhash == before[("acme", "lh")].simhash
    assert st.index.get("globex", "v").status == "queued" and queue == [("globex", "v", 1)]
    assert not index_lost(st) and rebuild_index(st, engine).kept == 2  # nothing lost: nothing to do
