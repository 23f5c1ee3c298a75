"""``store check``: unreferenced caches, ready records without cache, texts without records, records without
texts, corrupt entries; and ``--repair``."""

from __future__ import annotations

from factories import tiny_text_engine
from kvlink_rag.encodable import find_unencodable
from store.settings import StoreSettings
from kvlink_rag.types import Document
from service.documents import DocumentService
from store.check import check_store
from store.factory import open_store
from store.index.document_index import is_corrupt


def _store(tmp_path):
    queue: list[tuple[str, str, int]] = []
    st = open_store(StoreSettings(home=tmp_path, store_max_bytes=64 << 20, host_cache_bytes=32 << 20),
                    enqueue=lambda *task: queue.append(task))
    return st, tiny_text_engine(tmp_path), queue


def _ingest_ready(st, engine, queue, docs: dict[str, str]) -> dict:
    for doc_id, text in docs.items():
        DocumentService(st).ingest("acme", doc_id, text, metadata={"n": doc_id})
    out = {t[1]: DocumentService(st, engine).precompute(*t) for t in queue}
    queue.clear()
    return out


def _flip(st, db, key: bytes, old: bytes, new: bytes) -> None:
    def write(txn):
        raw = bytes(txn.get(key, db=db))
        assert old in raw
        txn.put(key, raw.replace(old, new), db=db)

    st.blobs.env.write(write)


def test_a_consistent_store_is_clean_and_young_caches_are_left_alone(tmp_path, make_kv):
    st, engine, queue = _store(tmp_path)
    _ingest_ready(st, engine, queue, {"a": "Alpha text about lighthouses.", "b": "Beta text about volcanoes."})
    assert check_store(st, min_age_s=0).problems == 0
    st.blobs.put("0" * 16 + "-" + "0" * 16 + "-" + "0" * 64, make_kv())  # just written: maybe in flight
    assert check_store(st).problems == 0 and check_store(st, min_age_s=0).problems == 1


def test_every_kind_of_problem_is_found_and_repaired(tmp_path, make_kv):
    st, engine, queue = _store(tmp_path)
    texts = {d: f"Document {d} tells of the {w} of the Skerry Point lighthouse, KIWI42."
             for d, w in zip("abcdef", ["keeper", "lamp", "storms", "lens", "tower", "cafe"])}
    ready = _ingest_ready(st, engine, queue, texts)
    orphan = "f" * 16 + "-" + "0" * 16 + "-" + "1" * 64
    st.blobs.put(orphan, make_kv())  # a cache nothing points at
    st.blobs.delete(ready["a"].cache_key)  # ready, cache gone
    st.index.delete("acme", "b")  # text without record (an index that lost it)
    st.texts.delete("acme", "c")  # record without text
    _flip(st, st.texts._db, b"acme\0d", b"KIWI42", b"KIWI92")  # corrupt text
    _flip(st, st.index._rec, b"acme\0e", b'"n": "e"', b'"n": "E"')  # corrupt record (its text is fine)
    _flip(st, st.index._rec, b"acme\0f", b'"n": "f"', b'"n": "F"')
    _flip(st, st.texts._db, b"acme\0f", b"KIWI42", b"KIWI92")  # both corrupt

    report = check_store(st, min_age_s=0)
    # b's record is gone; the corrupt records' caches are still claimed by their (lost) records' entries
    assert [k for k, _ in report.unreferenced_caches] == sorted([orphan, ready["b"].cache_key])
    assert report.unreferenced_bytes == sum(n for _, n in report.unreferenced_caches) > 0
    assert report.missing_caches == [("acme", "a", ready["a"].cache_key)]
    assert report.texts_without_records == [("acme", "b")]
    assert report.records_without_texts == [("acme", "c")]
    assert report.corrupt_texts == [("acme", "d"), ("acme", "f")]
    assert report.corrupt_records == [("acme", "e"), ("acme", "f")]
    assert report.to_dict()["problems"] == report.problems and not report.repaired

    fixed = check_store(st, repair=True, engine=engine, min_age_s=0)
    assert fixed.repaired and fixed.problems == report.problems
    assert queue == [("acme", "a", 1)] and st.index.get("acme", "a").status == "queued"
    b = st.index.get("acme", "b")  # recreated from its text, found its cache through the engine
    assert (b.status, b.cache_key, b.metadata, b.version) == ("ready", ready["b"].cache_key, {"n": "b"}, 1)
    e = st.index.get("acme", "e")
    assert not is_corrupt(e) and e.status == "ready" and e.cache_key == ready["e"].cache_key
    for doc_id in "cdf":
        rec = st.index.get("acme", doc_id)
        assert rec.status == "failed" and "re-ingest the document" in rec.metadata["error"], doc_id
    assert orphan not in st.blobs and ready["b"].cache_key in st.blobs and ready["e"].cache_key in st.blobs
    assert ready["f"].cache_key not in st.blobs  # nothing left to point at it
    assert check_store(st, min_age_s=0).problems == 0
    DocumentService(st, engine).precompute("acme", "a", 1)
    assert st.index.get("acme", "a").status == "ready"
    assert st.catalog.cache_key("acme", Document(texts["a"]), engine) in st.blobs


def test_ad_hoc_caches_of_ask_and_demo_are_listed_but_never_problems_or_repaired(tmp_path):
    st, engine, queue = _store(tmp_path)
    _ingest_ready(st, engine, queue, {"a": "Alpha text about lighthouses."})
    adhoc = st.cache.untracked()
    engine.cache = adhoc
    kv, hit = engine.get_or_encode(Document("A file given to kvlink-rag ask, cached for the next run."))
    assert not hit
    key = engine.cache_key(Document("A file given to kvlink-rag ask, cached for the next run."))
    report = check_store(st, min_age_s=0)
    assert report.problems == 0
    assert report.untracked_caches == [(key, st.blobs.meta(key)["nbytes"])]
    repaired = check_store(st, repair=True, engine=engine, min_age_s=0)
    assert repaired.problems == 0 and st.blobs.contains(key)  # the next `ask` still finds it


def test_text_that_is_not_valid_unicode_is_found_and_repaired(tmp_path):
    st, engine, queue = _store(tmp_path)
    ready = _ingest_ready(st, engine, queue, {"a": "Alpha text about lamps.", "m": "Meta text about storms.",
                                              "u": "Unicode text about lenses."})
    # as stored before the API refused them: a lone surrogate in title and metadata, NaN, a text no tokenizer reads
    deep: object = 1
    for _ in range(40):  # deeper than any JSON response encoder goes
        deep = {"a": deep}
    st.index.set_status("acme", "m", "ready", title="T\ud800", metadata={"k": "\ud800", "x": float("nan"), "d": deep})
    st.texts.put("acme", "m", 1, "Meta text about storms.", "T\ud800", {"k": "\ud800"})
    st.texts.put("acme", "u", 1, "Unicode \udfff text about lenses.")
    report = check_store(st, min_age_s=0)
    assert report.unencodable == [("acme", "m"), ("acme", "u")] and report.problems == 2
    assert report.to_dict()["unencodable"] == [["acme", "m"], ["acme", "u"]]

    check_store(st, repair=True, engine=engine, min_age_s=0)
    m = st.index.get("acme", "m")
    assert (m.status, m.title, m.cache_key) == ("ready", "T\ufffd", ready["m"].cache_key)
    assert {k: v for k, v in m.metadata.items() if k != "d"} == {"k": "\ufffd", "x": None}
    assert find_unencodable(m.metadata) is None and m.metadata["d"]["a"]["a"]  # cut where it was too deep
    stored = st.texts.get("acme", "m")
    assert (stored["text"], stored["title"], stored["metadata"]) == ("Meta text about storms.", "T\ufffd", {"k": "\ufffd"})
    u = st.index.get("acme", "u")
    assert u.status == "failed" and u.metadata["error"] == ("stored text is not valid Unicode (lone surrogate U+DFFF "
                                                            "at character 8 (not valid Unicode text)); re-ingest the "
                                                            "document")
    assert st.texts.get("acme", "u") is None and st.index.get("acme", "a").status == "ready"
    assert check_store(st, min_age_s=0).problems == 0
