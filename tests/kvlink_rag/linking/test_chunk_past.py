"""Chunks encoded after the stored caches of the chunks before them (``chunk_context_from`` 'cache'): each chunk's
KV equals its rows in one transformers forward over the document's chunks in order, keys differ from the 'text'
encoding, the chain is required and the setting is refused where it would do nothing."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from factories import tiny_text_engine
from kvlink_rag.linking.chunk_past import fitting
from kvlink_rag.linking.rope import remove_rope, rope_cos_sin
from kvlink_rag.linking.kvcache import cache_tensors
from kvlink_rag.text.chunking import chunks_before
from kvlink_rag.types import Document

WORDS = "harbour lantern granite meadow falcon copper willow ember quarry saddle orchard tidal basalt".split()


def _long_doc(seed: int = 0, paragraphs: int = 10) -> Document:
    rng = random.Random(seed)
    text = "\n\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 30))) + "." for _ in range(paragraphs))
    return Document(text, "Notes")


def _engine(home, **overrides):
    return tiny_text_engine(home, kv_dtype="float32", link_k=2, chunk_tokens=64, chunk_context=1,
                            chunk_context_from="cache", **overrides)


def _reference(engine, ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys before RoPE and values ``[layers, kv_heads, n, head_dim]`` of transformers' forward over the anchor
    prefix (anchored) and ``ids`` at positions from 0, the rows from ``start`` on."""
    lm = engine.lm
    prefix = engine.prefix.token_ids if engine.anchored else torch.zeros(0, dtype=torch.long)
    full = torch.cat([prefix, ids]).to(lm.device)
    pos = torch.arange(full.numel(), device=lm.device)
    with torch.no_grad():
        out = lm.decoder(input_ids=full[None], position_ids=pos[None], use_cache=True)
    k, v = cache_tensors(out.cache)  # [layers, kv_heads, tokens, head_dim], keys rotated
    p = int(prefix.numel())
    cos, sin = rope_cos_sin(lm.rotary_emb, pos[p + start:], torch.float32)
    return remove_rope(k[:, :, p + start:].float(), cos, sin), v[:, :, p + start:].float()


@pytest.mark.parametrize("encoding", ["isolated", "anchored"])
def test_each_chunk_holds_its_rows_of_one_forward_over_the_chunks_before_it(tmp_path, encoding):
    engine = _engine(tmp_path, encoding=encoding, chunk_frames="first")
    chunks = engine.chunks(_long_doc())
    assert len(chunks) >= 4
    ids = [engine.document_ids(c) for c in chunks]
    kvs = [engine.get_or_encode(c)[0] for c in reversed(chunks)][::-1]  # the last first: it encodes the chain
    k_ref, v_ref = _reference(engine, torch.cat(ids), 0)
    at = 0
    for kv, chunk_ids in zip(kvs, ids):
        n = int(chunk_ids.numel())
        assert kv.token_ids.tolist() == chunk_ids.tolist()
        assert torch.allclose(kv.keys, k_ref[:, :, at: at + n], atol=1e-4), at
        assert torch.allclose(kv.values, v_ref[:, :, at: at + n], atol=1e-4), at
        at += n


def test_keys_differ_from_the_text_encoding_and_the_first_chunk_is_shared(tmp_path):
    cache, text = _engine(tmp_path / "c"), tiny_text_engine(tmp_path / "t", kv_dtype="float32", link_k=2,
                                                            chunk_tokens=64, chunk_context=1, chunk_context_from="text")
    chunks = cache.chunks(_long_doc())
    assert chunks[-1].context == "".join(c.text for c in chunks[:-1])  # every chunk before, not one
    assert cache.cache_key(chunks[0]) == text.cache_key(chunks[0])
    assert all(cache.cache_key(c) != text.cache_key(t) for c, t in zip(chunks[1:], text.chunks(_long_doc())[1:]))
    one = tiny_text_engine(tmp_path / "w", kv_dtype="float32", link_k=2, chunk_tokens=64, chunk_context=64,
                           chunk_context_from="text")
    assert cache.cache_key(chunks[-1]) != one.cache_key(one.chunks(_long_doc())[-1])  # same text before, other encode


def test_an_edit_changes_the_keys_of_its_chunk_and_every_chunk_after_it(tmp_path):
    engine = _engine(tmp_path)
    doc = _long_doc()
    paragraphs = doc.text.split("\n\n")
    paragraphs[3] = paragraphs[3].replace(".", " saddle.")
    before, after = engine.chunks(doc), engine.chunks(Document("\n\n".join(paragraphs), "Notes"))
    changed = [engine.cache_key(a) != engine.cache_key(b) for a, b in zip(before, after)]
    first = changed.index(True)
    assert first > 0 and all(changed[first:])


def test_a_chunk_without_its_chain_is_refused_and_the_window_drops_whole_early_chunks(tmp_path):
    engine = _engine(tmp_path)
    chunks = engine.chunks(_long_doc())
    assert [c.chunk for c in chunks_before(chunks[3])] == [0, 1, 2]
    with pytest.raises(ValueError, match="does not carry the chunks before it"):
        engine.encode(replace(chunks[2], previous=None))
    kvs = [engine.get_or_encode(c)[0] for c in chunks[:3]]
    sizes = [kv.num_tokens for kv in kvs]
    assert fitting(kvs, sum(sizes)) == kvs
    assert fitting(kvs, sum(sizes) - 1) == kvs[1:]
    assert fitting(kvs, sizes[2] - 1) == []


def test_cache_from_is_refused_without_chunks_in_context(tmp_path):
    with pytest.raises(ValueError, match="KVLINK_RAG_CHUNK_CONTEXT_FROM=cache applies to chunks encoded in context"):
        tiny_text_engine(tmp_path, link_k=2, chunk_tokens=64, chunk_context=0, chunk_context_from="cache")


def test_the_defaults_read_the_caches_and_chunks_in_context_0_are_alone_framed_and_linked(tmp_path):
    default = tiny_text_engine(tmp_path / "d", kv_dtype="float32", link_k=2, chunk_tokens=64)
    assert (default.settings.chunk_context_from, default.settings.chunk_links, default.settings.chunk_frames) == (
        "cache", "last", "first")
    explicit = _engine(tmp_path / "c")
    assert default.cache_key(default.chunks(_long_doc())[-1]) == explicit.cache_key(explicit.chunks(_long_doc())[-1])
    alone = tiny_text_engine(tmp_path / "a", kv_dtype="float32", link_k=2, chunk_tokens=64, chunk_context=0)
    chunks = alone.chunks(_long_doc())
    assert all(c.context is None and alone.framed(c) for c in chunks) and alone.joins(chunks) is None
