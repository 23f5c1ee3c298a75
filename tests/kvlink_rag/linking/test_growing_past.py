"""A chunk walk's past grows in place: every past it gives equals :func:`past_prefix`'s bit for bit, earlier pasts
are never written again, a walk that does not continue starts anew, and encoding a document's chunks rotates each
chunk before the last once (not once per chunk after it)."""

from __future__ import annotations

import random

import pytest
import torch

import kvlink_rag.engine_documents as engine_documents
import kvlink_rag.linking.chunk_past as chunk_past_mod
from factories import tiny_text_engine
from kvlink_rag.linking.chunk_past import GrowingPast, chunk_past, chunk_walk, past_prefix
from kvlink_rag.types import Document, DocumentKV


def _chunk_kv(engine, n: int, seed: int) -> DocumentKV:
    """A position-free chunk cache of ``n`` tokens as the store holds it (bfloat16)."""
    lm, g = engine.lm, torch.Generator().manual_seed(seed)
    shape = (lm.num_layers, lm.config.num_key_value_heads, n, lm.head_dim)
    return DocumentKV(keys=torch.randn(shape, generator=g).bfloat16(), values=torch.randn(shape, generator=g).bfloat16(),
                      token_ids=torch.randint(0, 1000, (n,), generator=g), fingerprint="f", encoding="anchored")


def _same(a, b) -> None:
    if a is None or b is None:
        assert a is b
        return
    assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    assert a.token_ids.tolist() == b.token_ids.tolist() and a.text_hash == b.text_hash


@pytest.mark.parametrize("encoding", ["isolated", "anchored"])
def test_every_past_of_a_walk_is_past_prefix_bit_for_bit_and_stays_so(tmp_path, encoding):
    engine = tiny_text_engine(tmp_path, encoding=encoding)
    lm, prefix = engine.lm, engine.prefix if engine.anchored else None
    kvs = [_chunk_kv(engine, n, seed) for seed, n in enumerate([7, 40, 3, 64, 129, 18])]  # grows past its doubling
    walk, given = GrowingPast(), []
    for j in range(len(kvs) + 1):
        got = walk.prefix(lm, prefix, kvs[:j])
        _same(got, past_prefix(lm, prefix, kvs[:j]))
        given.append(got)
    for j, got in enumerate(given):  # the buffer grew and was appended to since: each past given is unchanged
        _same(got, past_prefix(lm, prefix, kvs[:j]))


def test_a_walk_that_does_not_continue_the_last_starts_anew(tmp_path):
    engine = tiny_text_engine(tmp_path)
    lm, prefix = engine.lm, engine.prefix
    kvs = [_chunk_kv(engine, 20 + i, i) for i in range(4)]
    other = _chunk_kv(engine, 11, 99)
    walk = GrowingPast()
    first = walk.prefix(lm, prefix, kvs[:3])
    for before in ([other, *kvs[1:3]], kvs[:2], [*kvs[:2], other], kvs):  # another first chunk, shorter, diverging
        _same(walk.prefix(lm, prefix, before), past_prefix(lm, prefix, before))
    _same(first, past_prefix(lm, prefix, kvs[:3]))  # a new buffer each time: the first past is intact
    twin = _chunk_kv(engine, 20, 0)  # equal content, another object: not taken for the walk's chunk
    _same(walk.prefix(lm, prefix, [twin, kvs[1]]), past_prefix(lm, prefix, [twin, kvs[1]]))


def test_chunk_walk_nests_into_the_open_walk_and_chunk_past_builds_anew_outside(tmp_path):
    engine = tiny_text_engine(tmp_path)
    kvs = [_chunk_kv(engine, 9, i) for i in range(3)]
    with chunk_walk() as outer, chunk_walk() as inner:
        assert inner is outer
        _same(chunk_past(engine.lm, engine.prefix, kvs), past_prefix(engine.lm, engine.prefix, kvs))
    _same(chunk_past(engine.lm, engine.prefix, kvs), past_prefix(engine.lm, engine.prefix, kvs))


def _long_doc(paragraphs: int = 12) -> Document:
    rng = random.Random(3)
    words = "harbour lantern granite meadow falcon copper willow ember quarry saddle orchard".split()
    return Document("\n\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(10, 30))) + "."
                                for _ in range(paragraphs)), "Notes")


def test_encoding_a_documents_chunks_rotates_each_chunk_before_the_last_once(tmp_path, monkeypatch):
    engine = tiny_text_engine(tmp_path, kv_dtype="float32", link_k=2, chunk_tokens=64, chunk_context=1)
    assert engine.settings.chunk_context_from == "cache"  # the default
    chunks = engine.chunks(_long_doc())
    assert len(chunks) >= 5
    rotated, apply_rope = [], chunk_past_mod.apply_rope
    monkeypatch.setattr(chunk_past_mod, "apply_rope", lambda k, cos, sin: rotated.append(k.shape[2]) or
                        apply_rope(k, cos, sin))
    kvs = [engine.get_or_encode(c)[0] for c in reversed(chunks)][::-1]  # the last first: it encodes the chain
    assert sum(rotated) == sum(kv.num_tokens for kv in kvs[:-1])  # built anew per chunk: quadratic in the chunks
    monkeypatch.setattr(chunk_past_mod, "apply_rope", apply_rope)
    monkeypatch.setattr(engine_documents, "chunk_past", past_prefix)  # each past built anew, as before walks
    fresh = tiny_text_engine(tmp_path / "fresh", kv_dtype="float32", link_k=2, chunk_tokens=64, chunk_context=1)
    ref = [fresh.get_or_encode(c)[0] for c in reversed(chunks)][::-1]
    for kv, r in zip(kvs, ref):  # the same caches bit for bit
        assert torch.equal(kv.keys, r.keys) and torch.equal(kv.values, r.values)


def test_a_walks_past_is_detached_from_caches_that_carry_a_graph_as_past_prefix_is(tmp_path):
    """Doc-side training hands the walk caches encoded with the adapter (graph kept): the past enters the next chunk's
    forward detached, as :func:`past_prefix` (no_grad) gives it, so a later append never rewrites a saved tensor."""
    engine = tiny_text_engine(tmp_path)
    lm, prefix = engine.lm, engine.prefix
    kvs = []
    for seed in range(3):
        base = _chunk_kv(engine, 6, seed)
        k = base.keys.float().requires_grad_()
        kvs.append(DocumentKV(keys=k * 1, values=k * 2, token_ids=base.token_ids, fingerprint="f", encoding="anchored"))
    walk = GrowingPast()
    for j in range(1, 4):
        got, want = walk.prefix(lm, prefix, kvs[:j]), past_prefix(lm, prefix, kvs[:j])
        assert not want.keys.requires_grad and not got.keys.requires_grad and not got.values.requires_grad
        _same(got, want)
