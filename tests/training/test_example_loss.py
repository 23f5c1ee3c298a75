"""Documents encoded with the training adapter on (doc-side training): a chunk encoded in context is encoded after
the chunk before it, as the engine encodes it; other documents in one batched forward."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from factories import tiny_text_engine
from kvlink_rag.model.lora import add_lora, remove_lora
from kvlink_rag.reuse.doc_side import encode_with_adapter
from kvlink_rag.types import Document
from training.example_loss import doc_side_kvs
from training.train_config import TRAIN_ADAPTER


def test_doc_side_encodes_a_chunk_after_its_context_and_the_rest_alone(tmp_path):
    engine = tiny_text_engine(tmp_path, chunk_context_from="text")
    add_lora(engine.lm, TRAIN_ADAPTER, rank=4, alpha=8)
    try:
        plain = Document("The ferry leaves the harbour at noon.", "Ferry")
        chunk = Document("It returns at six in the evening.", "Ferry", chunk=1, context="The ferry leaves at noon. ")
        with torch.no_grad():
            got = doc_side_kvs(engine, [plain, chunk])
            kw = dict(prefix=engine.prefix, kv_dtype=engine.settings.kv_dtype, fingerprint="x")
            want = [encode_with_adapter(engine.lm, engine.document_ids(plain), TRAIN_ADAPTER, **kw),
                    encode_with_adapter(engine.lm, engine.document_ids(chunk), TRAIN_ADAPTER, **kw,
                                        context=engine.document_ids(Document(chunk.context, "Ferry")))]
            alone = encode_with_adapter(engine.lm, engine.document_ids(chunk), TRAIN_ADAPTER, **kw)
    finally:
        remove_lora(engine.lm, TRAIN_ADAPTER)
    for g, w in zip(got, want):
        assert g.keys.shape == w.keys.shape and (g.values.float() - w.values.float()).abs().max() < 1e-2
    assert (got[1].values.float() - alone.values.float()).abs().max() > 1e-2


def test_doc_side_encodes_chunks_after_their_earlier_chunks_caches_as_the_engine_does(tmp_path):
    engine = tiny_text_engine(tmp_path, kv_dtype="float32", chunk_tokens=64)  # defaults: from the caches
    text = "\n\n".join(f"Paragraph {i} says the ferry leaves the harbour at {i} and returns at dusk." for i in range(12))
    chunks = engine.chunks(Document(text, "Ferry"))
    assert len(chunks) >= 3 and engine.settings.chunk_context_from == "cache"
    add_lora(engine.lm, TRAIN_ADAPTER, rank=4, alpha=8)  # B = 0: the adapter changes nothing yet
    try:
        with torch.no_grad():
            got = doc_side_kvs(engine, chunks[1:])  # the first chunk is encoded for the chain, not returned
    finally:
        remove_lora(engine.lm, TRAIN_ADAPTER)
    want = [engine.encode(c) for c in chunks[1:]]
    alone = engine.encode(replace(chunks[-1], context=None, previous=None))
    assert len(got) == len(chunks) - 1
    for g, w in zip(got, want):
        assert (g.keys.float() - w.keys.float()).abs().max() < 1e-4
        assert (g.values.float() - w.values.float()).abs().max() < 1e-4
    assert got[-1].token_ids[-1] == alone.token_ids[-1]  # the same last token, its value computed after the rest
    assert (got[-1].values[:, :, -1].float() - alone.values[:, :, -1].float()).abs().max() > 1e-2


def test_doc_side_refuses_a_chunk_from_the_caches_without_its_chain(tmp_path):
    engine = tiny_text_engine(tmp_path)
    chunk = Document("It returns at six in the evening.", "Ferry", chunk=1, context="The ferry leaves at noon. ")
    with pytest.raises(ValueError, match="make chunks with the engine's chunker"):
        doc_side_kvs(engine, [chunk])



def test_doc_side_chunks_enter_the_later_chunks_past_detached(tmp_path):
    """With grad on, each chunk's cache keeps its own forward's graph, and the caches before a chunk enter its past
    detached (as past_prefix builds it, under no_grad): the last chunk's values do not depend on the first's."""
    engine = tiny_text_engine(tmp_path, kv_dtype="float32", chunk_tokens=64)
    text = "\n\n".join(f"Paragraph {i} says the ferry leaves the harbour at {i} and returns at dusk." for i in range(12))
    chunks = engine.chunks(Document(text, "Ferry"))
    assert len(chunks) >= 3
    add_lora(engine.lm, TRAIN_ADAPTER, rank=4, alpha=8)
    try:
        kvs = doc_side_kvs(engine, chunks)
    finally:
        remove_lora(engine.lm, TRAIN_ADAPTER)
    assert all(kv.values.requires_grad for kv in kvs)  # each through its own forward, graph kept
    first, last = kvs[0], kvs[-1]
    grads = torch.autograd.grad(last.values.sum(), [first.keys, first.values], allow_unused=True)
    assert grads == (None, None)
