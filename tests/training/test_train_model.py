"""bfloat16 GEMMs inside the block only; documents pre-encoded once each."""

from __future__ import annotations

import torch

from factories import tiny_text_engine
from kvlink_rag.types import Document
from training.train_model import bf16_gemms, distinct, frozen_linears, preencode, stored_kv_bytes


def test_bf16_gemms_apply_inside_the_block_only(tmp_path):
    eng = tiny_text_engine(tmp_path)
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    with torch.no_grad():
        ref = eng.lm.model(input_ids=ids).logits
        with bf16_gemms(eng.lm.model):
            fast = eng.lm.model(input_ids=ids).logits
        again = eng.lm.model(input_ids=ids).logits
    assert fast.dtype == torch.float32 and not torch.equal(fast, ref)
    assert (fast - ref).abs().max() < 0.05 * ref.abs().max()
    assert torch.equal(again, ref)  # restored exactly
    assert all("forward" not in m.__dict__ for m in frozen_linears(eng.lm.model))


def test_preencode_encodes_each_distinct_document_once(tmp_path):
    eng = tiny_text_engine(tmp_path)
    a, b = Document("Alpha is first.", "A"), Document("Beta is second.", "B")
    assert preencode(eng.warm, [a, b, a, Document("Alpha is first.", "A")]) == (2, 2)
    assert preencode(eng.warm, [b, a]) == (2, 0)  # already cached


def test_distinct_keeps_first_uses_in_order():
    a, b = Document("Alpha is first.", "A"), Document("Beta is second.", "B")
    assert distinct([a, b, Document("Alpha is first.", "A"), Document("Alpha is first.", "other")]) == [
        a, b, Document("Alpha is first.", "other")]


def test_stored_kv_bytes_equals_the_encoded_caches_bytes(tmp_path):
    eng = tiny_text_engine(tmp_path)
    docs = [Document("Alpha is first.", "A"), Document("Beta is the second document, a little longer.", "B")]
    kvs = [eng.get_or_encode(d)[0] for d in docs]
    assert stored_kv_bytes(eng, docs) == sum(kv.keys.nbytes + kv.values.nbytes for kv in kvs) > 0


def test_preencode_over_a_store_finds_stored_documents_without_reading_them(tmp_path, monkeypatch):
    """A resumed run's pre-encoding asks the store where each document is; it reads none back (host tier of
    0 bytes: documents are only in LMDB, as after a restart)."""
    from store.factory import open_store
    from store.settings import StoreSettings

    eng = tiny_text_engine(tmp_path)
    eng.cache = open_store(StoreSettings(home=tmp_path, store_max_bytes=64 << 20, host_cache_bytes=0)).cache
    docs = [Document("Alpha is first.", "A"), Document("Beta is second.", "B")]
    assert preencode(eng.warm, docs) == (2, 2)
    read = []
    for name in ("get", "iter_layers", "iter_stored_layers", "get_ids"):
        monkeypatch.setattr(type(eng.cache.blobs), name, lambda self, key, *a, _n=name, **k: read.append((_n, key)))
    assert preencode(eng.warm, [*docs, Document("Gamma is third.", "C")]) == (3, 1)
    assert read == []
