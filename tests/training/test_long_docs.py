"""The long-document task: one document of passages, engine labels per chunk size, a bounded cache."""

from __future__ import annotations

from factories import random_kv, tiny_text_engine
from evaluation.long_docs import join_passages
from evaluation.nq import NQExample
from kvlink_rag.types import Document
from training.long_docs import BoundedCache, long_doc_engines, long_documents


def test_passages_become_paragraphs_of_one_document_with_the_gold_at_its_slot():
    assert join_passages([Document("a b.", "T1"), Document(" c d. ")]) == Document("T1\na b.\n\nc d.")
    examples = [NQExample(f"q{i}", (f"ans{i}",), Document(f"text {i} ans{i}.", f"Title {i}")) for i in range(6)]
    [doc], slot = long_documents(examples, 2, 4, "last")
    paras = doc.text.split("\n\n")
    assert slot == 3 and len(paras) == 4 and paras[3] == "Title 2\ntext 2 ans2." and doc.title is None


def test_linked_modes_run_once_per_chunk_size_full_modes_once_as_one_block(tmp_path):
    eng = tiny_text_engine(tmp_path)
    out = long_doc_engines({"full": eng, "linked-query-lora": eng}, [0, 512])
    assert list(out) == ["full", "linked-query-lora one-block", "linked-query-lora chunks=512"]
    assert [e.chunker.chunk_tokens for e in out.values()] == [0, 0, 512]
    assert len({id(e.cache) for e in out.values()}) == 1 and isinstance(out["full"].cache, BoundedCache)


def test_the_bounded_cache_forgets_the_oldest_documents():
    kv = random_kv()
    cache = BoundedCache(max_bytes=2 * kv.nbytes)
    for key in "abcc":
        cache.put(key, kv)
    assert cache.get("a") is None and cache.get("b") is not None and cache.get("c") is not None
    assert cache.nbytes == 2 * kv.nbytes and len(cache) == 2
