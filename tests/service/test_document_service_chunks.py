"""A long document in the document service: stored as chunk caches, an update encodes and drops only changed chunks,
delete drops them all, store check sees every chunk."""

from __future__ import annotations

import random

import pytest
import torch

from factories import tiny_text_engine
from kvlink_rag.types import Document
from service.settings import Settings
from service.documents import DocumentService
from store.check import check_store
from store.factory import open_store

WORDS = "harbour lantern granite meadow falcon copper willow ember quarry saddle orchard tidal basalt".split()


def _text(seed: int = 0, n: int = 24) -> str:
    rng = random.Random(seed)
    return "\n\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 40))) + "." for _ in range(n))


def _setup(tmp_path, context: int = 1, store_int8: bool = False, **engine_settings):
    queue: list[tuple[str, str, int]] = []
    st = open_store(Settings(home=tmp_path, model="unused", store_max_bytes=64 << 20, host_cache_bytes=32 << 20,
                             store_int8=store_int8), enqueue=lambda *task: queue.append(task))
    engine = tiny_text_engine(tmp_path, chunk_tokens=128, chunk_context=context, **engine_settings)
    engine.cache = st.cache.for_tenant("acme")
    encoded = []
    encode = engine.encode
    engine.encode = lambda d, before=None: encoded.append(d) or engine.befores.append(before) or encode(d, before)
    engine.befores = []
    return st, engine, queue, encoded


def _drain(st, engine, queue):
    done = [DocumentService(st, engine).precompute(t, d, v) for t, d, v in queue]
    queue.clear()
    return done


@pytest.mark.parametrize("context", [False, True], ids=["alone", "in-context"])
def test_an_update_encodes_and_drops_only_the_changed_chunk(tmp_path, context):
    """Chunks encoded alone: the edited chunk only; in context of one chunk's text: it and the one after it (whose
    key holds the edited text before it)."""
    st, engine, queue, encoded = _setup(tmp_path, int(context), chunk_context_from="text")
    text = _text()
    DocumentService(st).ingest("acme", "notes", text, "Notes")
    [ready] = _drain(st, engine, queue)
    keys = ready.cache_keys
    assert ready.status == "ready" and len(keys) >= 3 and len(encoded) == len(set(keys))
    assert all(st.blobs.contains(k) for k in keys) and st.index.find_by_cache_key(keys[1]) == [("acme", "notes")]
    assert ready.num_tokens == sum(int(st.blobs.meta(k)["num_tokens"]) for k in keys)

    paras = text.split("\n\n")
    paras[12] = "EDITED " + paras[12]
    encoded.clear()
    DocumentService(st).ingest("acme", "notes", "\n\n".join(paras), "Notes")
    [ready2] = _drain(st, engine, queue)
    new, gone = set(ready2.cache_keys) - set(keys), set(keys) - set(ready2.cache_keys)
    edited_after = [(("EDITED" in d.text), "EDITED" in (d.context or "")) for d in encoded]
    assert len(new) == len(gone) == 1 + context
    assert edited_after == ([(True, False), (False, True)] if context else [(True, False)])
    assert not any(st.blobs.contains(k) for k in gone) and all(st.blobs.contains(k) for k in ready2.cache_keys)
    assert check_store(st).problems == 0

    _, doc = st.catalog.document("acme", "notes")
    assert engine.warm(doc)  # every chunk a hit
    assert DocumentService(st).delete("acme", "notes") and st.blobs.keys() == []


def test_chunks_after_their_earlier_chunks_caches_reencode_from_the_edit_on_and_read_the_rest_from_the_store(tmp_path):
    """``chunk_context_from`` 'cache': each chunk encoded once at ingest, reading the chunks before it from what was
    just encoded or stored; an edit re-encodes its chunk and every chunk after it, and nothing before it."""
    st, engine, queue, encoded = _setup(tmp_path, 1)  # the default: from the caches
    text = _text()
    DocumentService(st).ingest("acme", "notes", text, "Notes")
    [ready] = _drain(st, engine, queue)
    keys = ready.cache_keys
    assert len(keys) >= 4 and [d.chunk for d in encoded] == list(range(len(keys)))  # each once, in order
    paras = text.split("\n\n")
    paras[12] = "EDITED " + paras[12]
    encoded.clear()
    DocumentService(st).ingest("acme", "notes", "\n\n".join(paras), "Notes")
    [ready2] = _drain(st, engine, queue)
    first = next(i for i, d in enumerate(engine.chunks(Document("\n\n".join(paras), "Notes"))) if "EDITED" in d.text)
    assert first > 0 and [d.chunk for d in encoded] == list(range(first, len(ready2.cache_keys)))
    assert ready2.cache_keys[:first] == keys[:first] and not set(ready2.cache_keys[first:]) & set(keys)
    assert check_store(st).problems == 0


def test_an_int8_store_encodes_each_chunk_after_what_it_holds_of_the_chunks_before(tmp_path):
    """With ``store_int8`` a chunk is encoded after the stored (quantized) caches of the chunks before it, as an edit
    or a query would read them, not after the exact KV the same precompute just encoded."""
    st, engine, queue, encoded = _setup(tmp_path, 1, store_int8=True, kv_dtype="float32")
    DocumentService(st).ingest("acme", "notes", _text(), "Notes")
    [ready] = _drain(st, engine, queue)
    keys, befores = ready.cache_keys, engine.befores
    assert len(keys) >= 3 and befores[0] is None and [len(b) for b in befores[1:]] == list(range(1, len(keys)))
    stored = [engine.cache.get(k) for k in keys]
    for i, before in enumerate(befores[1:], start=1):
        for j, kv in enumerate(before):
            assert torch.equal(kv.keys, stored[j].keys) and torch.equal(kv.values, stored[j].values), (i, j)
    fresh = engine.encode(engine.chunks(Document(_text(), "Notes"))[0])
    assert not torch.equal(fresh.values, stored[0].values)  # int8 rounds: only reading the store makes paths agree
