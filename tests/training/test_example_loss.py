"""Documents encoded with the training adapter on (doc-side training): a chunk encoded in context is encoded after
the chunk before it, as the engine encodes it; other documents in one batched forward."""

from __future__ import annotations

import pytest
import torch

from factories import tiny_text_engine
from kvlink_rag.model.lora import add_lora, remove_lora
from kvlink_rag.reuse.doc_side import encode_with_adapter
from kvlink_rag.types import Document
from training.example_loss import doc_side_kvs
from training.train_config import TRAIN_ADAPTER


def test_doc_side_encodes_a_chunk_after_its_context_and_the_rest_alone(tmp_path):
    engine = tiny_text_engine(tmp_path)
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


def test_doc_side_refuses_chunks_encoded_after_their_earlier_chunks_caches(tmp_path):
    engine = tiny_text_engine(tmp_path, chunk_context=1, chunk_context_from="cache")
    chunk = Document("It returns at six in the evening.", "Ferry", chunk=1, context="The ferry leaves at noon. ")
    with pytest.raises(ValueError, match="set KVLINK_RAG_CHUNK_CONTEXT_FROM=text"):
        doc_side_kvs(engine, [chunk])
