"""The document-cache contract: MemoryCache implements every method, resolve/stream give what get gives, and
the engine resolves documents through the contract alone."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from factories import random_kv, tiny_text_engine
from kvlink_rag.cache import DocumentCache, MemoryCache
from kvlink_rag.types import Document

CONTRACT = ("key", "get", "put", "resolve", "stream")


def test_contract_is_the_engines_whole_use_of_a_cache():
    declared = {n for n, v in vars(DocumentCache).items() if callable(v) and not n.startswith("_")}
    assert declared == set(CONTRACT)


def test_memory_cache_implements_the_contract_itself():
    cache = MemoryCache()
    assert isinstance(cache, DocumentCache)
    assert all(name in vars(MemoryCache) for name in CONTRACT)  # none falls through to the Protocol's stub


def test_resolve_and_stream_round_trip_equals_get():
    cache = MemoryCache()
    a, b = random_kv(seed=1, tokens=5), random_kv(seed=2, tokens=7)
    ka, kb = cache.key("fp", "doc a"), cache.key("fp", "doc b")
    assert ka != kb and len(ka) == len(kb) == 64  # sha256 hex, distinct per text
    assert cache.put(ka, a) is None and cache.put(kb, b) is None
    items = cache.resolve([ka, cache.key("fp", "missing"), kb])
    assert items[0] is cache.get(ka) and items[1] is None and items[2] is cache.get(kb)
    stream = cache.stream([ka, items[2]])  # a key or the document itself
    assert stream.num_tokens == [5, 7] and stream.fingerprint == "fp-test"
    layers = list(stream.layers)
    assert len(layers) == a.num_layers
    for i, (k, v) in enumerate(layers):
        assert torch.equal(k, torch.cat([a.keys[i], b.keys[i]], dim=1))
        assert torch.equal(v, torch.cat([a.values[i], b.values[i]], dim=1))


def test_stream_of_a_key_no_longer_stored_is_a_lookup_error():
    with pytest.raises(LookupError):
        MemoryCache().stream(["gone"])


def test_engine_resolves_through_the_contract_encoding_each_missing_key_once(tmp_path, monkeypatch):
    engine = tiny_text_engine(tmp_path)
    a, b = Document("Ada wrote the first algorithm."), Document("Babbage built the engine.")
    encoded = []
    encode = engine.encode
    monkeypatch.setattr(engine, "encode", lambda d: encoded.append(d) or encode(d))
    assert engine.link_context("who?", [a, b, a])[1] == 0 and encoded == [a, b]  # a encoded once
    assert engine.link_context("who?", [a, b, a])[1] == 3 and encoded == [a, b]
    key = engine.cache_key(b)
    engine.cache.put(key, replace(engine.cache.get(key), fingerprint="another model"))
    assert engine.link_context("who?", [a, b])[1] == 1 and encoded == [a, b, b]  # stale fingerprint: a miss
    assert engine.cache.get(key).fingerprint == engine.fingerprint
