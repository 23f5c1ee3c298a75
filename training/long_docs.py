"""The long-document task of ``kvlink-rag eval --task long-docs``: each question's context is ONE document
made of its gold passage and ``--docs - 1`` distractor passages (:mod:`evaluation.long_docs`), answered by
full prefill of that document, by linking it as one block, and by linking it as chunks
(:mod:`kvlink_rag.text.chunking`, link tokens between chunks)."""

from __future__ import annotations

from collections import OrderedDict

from evaluation.long_docs import long_document
from evaluation.nq import NQExample
from kvlink_rag.cache import MemoryCache
from kvlink_rag.engine import Engine
from kvlink_rag.types import Document, DocumentKV

from .modes import FULL_MODES


def chunk_label(mode: str, chunk_tokens: int) -> str:
    """Row label of a linked mode run one block (``"<mode> one-block"``) or chunked (``"<mode> chunks=N"``)."""
    return f"{mode} one-block" if chunk_tokens == 0 else f"{mode} chunks={chunk_tokens}"


class BoundedCache(MemoryCache):
    """A memory cache keeping the most recently put documents within ``max_bytes`` of KV (every question
    has a new long document: an unbounded cache would hold all of them on the device). The newest document
    is always kept."""

    def __init__(self, max_bytes: int = 2 << 30):
        super().__init__()
        self.order: OrderedDict[str, int] = OrderedDict()
        self.max_bytes, self.nbytes = max_bytes, 0

    def put(self, key: str, kv: DocumentKV) -> None:
        self.nbytes -= self.order.pop(key, 0)
        super().put(key, kv)
        self.order[key] = kv.nbytes
        self.nbytes += kv.nbytes
        while self.nbytes > self.max_bytes and len(self.order) > 1:
            old, n = self.order.popitem(last=False)
            self.pop(old, None)
            self.nbytes -= n


def long_doc_engines(engines: dict[str, Engine], chunk_sizes: list[int]) -> dict[str, Engine]:
    """Label -> engine for the task: full modes fully prefill the one block; every other mode once per
    chunk size (0 = one block), labelled by :func:`chunk_label`; all over one :class:`BoundedCache`.

    Raises:
        ValueError: a chunk size neither 0 nor at least 64.
    """
    cache = BoundedCache()
    out: dict[str, Engine] = {}
    for label, eng in engines.items():
        for ct in [0] if label in FULL_MODES else chunk_sizes:
            e = eng.with_chunk_tokens(ct)
            e.cache = cache
            out[label if label in FULL_MODES else chunk_label(label, ct)] = e
    return out


def long_documents(examples: list[NQExample], index: int, n_passages: int, gold_position: str = "random",
                   seed: int = 0) -> tuple[list[Document], int]:
    """``([the long document], gold paragraph index)`` (:func:`evaluation.long_docs.long_document`)."""
    doc, slot = long_document(examples, index, n_passages, gold_position, seed)
    return [doc], slot
