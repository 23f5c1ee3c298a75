"""Chunks of one document linked without link tokens between them (``chunk_links`` 'last'): which slots join, the
scheduler's answer equals the one-request reference for plain linking, retention and CacheBlend, and the fit
check counts the link tokens that remain."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from factories import tiny_text_engine
from kvlink_rag.runtime.gen_request import GenRequest
from kvlink_rag.runtime.limits import SchedulerLimits
from kvlink_rag.runtime.prefix_tree import PrefixTree
from kvlink_rag.runtime.scheduler import Scheduler
from kvlink_rag.text.chunking import continues
from kvlink_rag.types import Document

WORDS = "harbour lantern granite meadow falcon copper willow ember quarry saddle orchard tidal basalt".split()
Q = "what is the code word?"


def _long_doc(seed: int = 0, paragraphs: int = 10) -> Document:
    rng = random.Random(seed)
    text = "\n\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 30))) + "." for _ in range(paragraphs))
    return Document(text, "Notes")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """Joined chunks, each framed (``chunk_frames`` 'each'), encoded after the caches before it (the default)."""
    return tiny_text_engine(tmp_path_factory.mktemp("joined"), max_new_tokens=4, kv_dtype="float32", link_k=2,
                            chunk_tokens=64, chunk_context=1, chunk_links="last", chunk_frames="each")


def test_only_the_chunk_after_its_context_joins_and_each_keeps_link_tokens(engine):
    chunks = engine.chunks(_long_doc())
    assert len(chunks) >= 3 and all(continues(a, b) for a, b in zip(chunks, chunks[1:]))
    other = Document("a short note.", "Other")
    assert engine.joins(chunks + [other]) == [True] * (len(chunks) - 1) + [False, False]
    assert engine.joins([chunks[0], chunks[2]]) is None  # a retrieved chunk without the one before it
    assert not continues(chunks[1], chunks[0])
    each = tiny_text_engine(engine.settings.home, link_k=2, chunk_tokens=64, chunk_context=1, chunk_links="each")
    assert each.joins(chunks) is None
    for layout in ({"chunk_links": "last"}, {"chunk_frames": "first"}):  # chunks encoded alone: it would do nothing
        with pytest.raises(ValueError, match="set KVLINK_RAG_CHUNK_CONTEXT to 1 or more"):
            tiny_text_engine(engine.settings.home, link_k=2, chunk_tokens=64, chunk_context=0, **layout)


def test_the_fit_count_holds_the_link_tokens_of_documents_not_of_chunks(engine):
    doc = _long_doc()
    sizes = [int(engine.document_ids(c).numel()) for c in engine.chunks(doc)]
    assert engine.linked_tokens(doc) == sum(sizes)
    q = 9
    room = engine.lm.max_positions - engine.prefix.num_tokens - sum(sizes) - 2 - q
    engine.check_fits([doc], q, new_tokens=room)  # exactly fits: K=2 after the last chunk only
    with pytest.raises(ValueError, match="link tokens 2,"):
        engine.check_fits([doc], q, new_tokens=room + 1)


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """Joined chunks without frames after the first: the document's text in one run of slots (the defaults)."""
    return tiny_text_engine(tmp_path_factory.mktemp("bare"), max_new_tokens=4, kv_dtype="float32", link_k=2,
                            chunk_tokens=64, chunk_context=1, chunk_links="last", chunk_frames="first")


def test_chunks_after_the_first_are_bare_text_and_read_as_the_whole_document(bare, engine):
    doc = _long_doc()
    chunks = bare.chunks(doc)
    assert "".join(bare.document_text(c) for c in chunks) == bare.document_text(doc)
    assert bare.document_text(chunks[0]).startswith("Document (Title: Notes) ")
    assert not any(bare.document_text(c).startswith("Document") for c in chunks[1:])
    # the text a chunk is encoded after (from the text, one chunk back) is framed as it sits in the prompt: chunk 0
    # framed, later ones bare
    text = tiny_text_engine(bare.settings.home, kv_dtype="float32", link_k=2, chunk_tokens=64, chunk_context=1,
                            chunk_context_from="text")
    tok = text.lm.tokenizer
    assert tok.decode(text.context_ids(chunks[1])).startswith("Document (Title: Notes) ")
    assert not tok.decode(text.context_ids(chunks[2])).startswith("Document")
    assert bare.cache_key(chunks[0]) == engine.cache_key(chunks[0])
    assert all(bare.cache_key(c) != engine.cache_key(c) for c in chunks[1:])
    loose = Document("The code word is kiwi.", "Short")
    assert bare.document_text(loose) == engine.document_text(loose)  # a document that is not chunked keeps its frame


@pytest.mark.parametrize("which,reuse", [("engine", {}), ("engine", {"retention": 0.6}),
                                         ("engine", {"recompute_ratio": 0.3}), ("bare", {}), ("bare", {"retention": 0.6})])
def test_joined_chunks_in_the_scheduler_equal_the_one_request_context(request, which, reuse):
    """Joined chunks (framed, or bare past the first) through the batching scheduler, in chunked prefill steps: the
    one-request context's logits and last-layer KV, slot for slot, and its greedy tokens."""
    eng = request.getfixturevalue(which)
    docs = [_long_doc(1, 6), Document("The code word is kiwi.", "Short")]
    sched = Scheduler(eng.lm, PrefixTree(1 << 30), threading.Lock(), SchedulerLimits(max_step_tokens=16))
    try:
        ids = eng.template.question_ids(eng.lm.tokenizer, Q).tolist()
        h = sched.submit(GenRequest(lambda: eng, docs, ids, eng.sampling(), "linked", keep_logits=True, **reuse))
        toks, res = list(h.tokens()), h.result
    finally:
        sched.close()
    ctx, _ = eng.link_context(Q, docs, retention=reuse.get("retention", 1.0),
                              recompute_ratio=reuse.get("recompute_ratio", 0.0))
    assert [s.kind for s in ctx.segments].count("link") == 2 and len(eng.chunks(docs[0])) >= 2
    assert torch.allclose(res.logits[0], ctx.last_logits, atol=1e-4)
    layer = ctx.cache.layers[-1]
    assert torch.allclose(res.last_layer_kv[0], layer.keys[0], atol=1e-4)
    assert torch.allclose(res.last_layer_kv[1], layer.values[0], atol=1e-4)
    assert toks == eng.answer(Q, docs, **reuse).token_ids
