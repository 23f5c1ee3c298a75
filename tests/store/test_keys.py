"""Content hash, SimHash and cache-key construction."""

from __future__ import annotations

import hashlib

import pytest

from kvlink_rag.encodable import normalize_text
from store.keys import (KEY_RE, cache_key, content_hash, hamming, parse_cache_key, simhash64,
                        tenant_fingerprint, text_key)


def test_normalisation_is_nfc_strip_and_whitespace_collapse():
    assert normalize_text("  Cafe\u0301 au lait\r\nnoir \n") == "Caf\u00e9 au lait\nnoir"
    assert content_hash("  Cafe\u0301 au lait \n") == content_hash("Café au lait")
    assert content_hash("Café  au lait") != content_hash("Café au lait")  # inner whitespace changes the ids
    assert content_hash("Café au lait") == hashlib.sha256("Café au lait".encode()).hexdigest()
    assert content_hash("Café au lait") != content_hash("café au lait")  # case is content


def test_simhash_is_stable_and_whitespace_insensitive(texts):
    # Pinned: a changed value would silently change every cache key.
    assert simhash64(texts.amazon) == 0x3A8FA90765276370
    assert simhash64("one") == 3448262559797783426
    assert simhash64("") == 0
    assert simhash64(texts.amazon.upper()) == simhash64(texts.amazon)
    assert simhash64("  " + texts.amazon.replace(" ", "\n  ")) == simhash64(texts.amazon)


def test_one_word_changed_is_a_near_duplicate_and_other_text_is_not(texts):
    h = simhash64(texts.amazon)
    assert hamming(h, simhash64(texts.amazon.replace("Brazil", "Argentina"))) == 1
    assert hamming(h, simhash64(texts.amazon.replace("seven million", "eight million"))) == 3
    assert hamming(h, simhash64(texts.photosynthesis)) == 22


def test_hamming():
    assert hamming(0, 0) == 0
    assert hamming(0, (1 << 64) - 1) == 64
    assert hamming(0b1011, 0b0001) == 2


def test_cache_key_layout_and_parse(texts):
    ch = content_hash(texts.amazon)
    sh = simhash64(texts.amazon)
    key = cache_key("model-a|anchored|bfloat16|v1", ch, sh)
    fp16 = hashlib.sha256(b"model-a|anchored|bfloat16|v1").hexdigest()[:16]
    assert key == f"{fp16}-3a8fa90765276370-{ch}"
    assert len(key) == 16 + 1 + 16 + 1 + 64
    assert parse_cache_key(key) == (fp16, sh, ch)
    assert text_key("model-a|anchored|bfloat16|v1", texts.amazon) == key
    # Another fingerprint never shares a key; the SimHash part alone never selects a cache.
    assert cache_key("model-b", ch, sh) != key
    assert cache_key("model-a|anchored|bfloat16|v1", content_hash(texts.amazon + "!"), sh) != key


def test_cache_key_rejects_bad_parts():
    with pytest.raises(ValueError):
        cache_key("fp", "not-a-hash", 0)
    with pytest.raises(ValueError):
        cache_key("fp", content_hash("x"), 1 << 64)
    with pytest.raises(ValueError):
        parse_cache_key("abc")


def test_tenants_get_their_own_keys_unless_caches_are_shared():
    text = "The door code is KIWI42."
    a, b = (text_key(tenant_fingerprint("fp", t), text) for t in ("tenant-a", "tenant-b"))
    assert a != b and KEY_RE.match(a) and KEY_RE.match(b)
    assert a.split("-")[1:] == b.split("-")[1:]  # only the fingerprint part differs
    shared = {text_key(tenant_fingerprint("fp", t, shared=True), text) for t in ("tenant-a", "tenant-b")}
    assert shared == {text_key("fp", text)}
    # the single-tenant default keeps the bare fingerprint: its caches are the same under either setting
    assert tenant_fingerprint("fp", "default") == "fp" == tenant_fingerprint("fp", "default", shared=True)
