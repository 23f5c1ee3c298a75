"""Which documents a query reads: those named by id, or the tenant's BM25 matches, each verified.

Documents read by id come from the text store (LMDB), not the index, so a query over cached documents
still answers while a Redis index is down.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvlink_rag.types import Document
from service.errors import ServiceError, redis_errors
from store.keys import content_hash

if TYPE_CHECKING:
    from service.settings import Settings
    from service.retrieval import Retrieval
    from store.factory import Store
    from store.index.document_index import DocumentRecord


@dataclass
class QueryDoc:
    """A document chosen for a query: id, current version and text, BM25 score when retrieved; ``chunk``: the
    index of the one chunk retrieved (``document`` is then that chunk, as the engine caches it)."""

    doc_id: str
    version: int
    document: Document
    score: float | None = None
    chunk: int | None = None
    whole_hash: str = ""  # a chunk's document's content hash

    @property
    def content_hash(self) -> str:
        """sha256 hex of the document's text (the whole document's for a chunk)."""
        return self.whole_hash or content_hash(self.document.text)


class DocumentChoice:
    """Picks and loads a query's documents.

    Args:
        store: the texts (what is served), the index (which documents exist) and the catalog (marks
            corrupt ones).
        retrieval: BM25 over the tenant's documents.
        settings: ``max_query_documents``, ``max_top_k``.
    """

    def __init__(self, store: Store, retrieval: Retrieval, settings: Settings):
        self.store, self.retrieval, self.settings = store, retrieval, settings

    def by_ids(self, tenant: str, ids: list[str]) -> list[QueryDoc]:
        """The documents ``ids`` (duplicates dropped, order kept).

        Raises:
            ServiceError: 422 empty or too many ids, 404 unknown ids, 409 a corrupt document.
        """
        ids = list(dict.fromkeys(ids))
        if not ids:
            raise ServiceError(422, "invalid_request", "document_ids is empty (omit it to retrieve with top_k)")
        if len(ids) > self.settings.max_query_documents:
            raise ServiceError(422, "too_many_documents", f"{len(ids)} document ids; the limit is "
                               f"{self.settings.max_query_documents} (KVLINK_RAG_MAX_QUERY_DOCUMENTS)")
        found = [self.load(tenant, i) for i in ids]
        missing = [i for i, d in zip(ids, found, strict=True) if d is None]
        if missing:
            raise ServiceError(404, "document_not_found", f"unknown document id(s): {', '.join(missing)}")
        return found

    def retrieve(self, tenant: str, question: str, top_k: int, required: bool = True,
                 cutoff: tuple[float | None, float | None] = (None, None)) -> list[QueryDoc]:
        """The ``top_k`` BM25 matches of ``question`` (documents, or chunks of chunked ones: only the chunk is
        linked) that can be served (corrupt or deleted ones skipped) and
        pass the score cut-off (``KVLINK_RAG_RETRIEVAL_MIN_RELATIVE_SCORE`` of the best, at least
        ``KVLINK_RAG_RETRIEVAL_MIN_SCORE``; ``cutoff`` overrides them: ``(relative, floor)``, None keeps a
        setting); without ``required`` none is an empty list (a plain chat).

        Raises:
            ServiceError: 422 ``top_k`` out of range, 404 nothing matches (with ``required``).
            redis.exceptions.ConnectionError: the BM25 index needed the Redis index and it is down.
        """
        if not 1 <= top_k <= self.settings.max_top_k:
            raise ServiceError(422, "top_k_out_of_range", f"top_k must be within 1..{self.settings.max_top_k} "
                               f"(KVLINK_RAG_MAX_TOP_K), got {top_k}")
        from service.retrieval import above_cutoff

        docs = []
        s, (relative, floor) = self.settings, cutoff
        relative = s.retrieval_min_relative_score if relative is None else relative
        hits = above_cutoff(self.retrieval.search(tenant, question, top_k), relative,
                            s.retrieval_min_score if floor is None else floor)
        for doc_id, score, chunk in hits:
            d = self.load(tenant, doc_id, strict=False)  # None: deleted since the index was built, or corrupt
            if d is not None and chunk is not None:
                d = self._chunk(d, chunk)
            if d is not None:
                d.score = score
                docs.append(d)
        if not docs and required:
            if self.store.index.count(tenant) == 0:
                raise ServiceError(404, "no_documents", "this tenant has no documents yet; ingest some first "
                                   "(POST /v1/documents, or kvlink-rag ingest)")
            raise ServiceError(404, "no_matching_documents", "no document of this tenant shares a word with the "
                               "question (BM25); name the documents to use instead (document_ids; --doc-id in "
                               "the CLI)")
        return docs

    def _chunk(self, d: QueryDoc, chunk: int) -> QueryDoc | None:
        """``d`` narrowed to its chunk ``chunk``; None when its current text has no such chunk (changed since
        the BM25 index was built: the next rebuild indexes the new chunks)."""
        piece = self.retrieval.chunk_of(d.document, chunk)
        if piece is None:
            return None
        return replace(d, document=piece, chunk=chunk, whole_hash=d.content_hash)

    def load(self, tenant: str, doc_id: str, strict: bool = True) -> QueryDoc | None:
        """The document's current text (verified), or None when unknown.

        The index must hold the document: a text whose record the index lost is not served. While the index
        is unreachable the text store alone decides, so queries over cached documents survive a Redis outage.

        Raises:
            ServiceError: 409 ``document_corrupt`` when its stored text or index record failed its checksum,
                409 ``document_unreadable`` when its stored text or title is not valid Unicode (with
                ``strict``; else None).
        """
        from kvlink_rag.encodable import find_unencodable
        from store.index.document_index import is_corrupt
        from store.integrity import CorruptEntry

        try:
            stored = self.store.texts.get(tenant, doc_id)
            rec = self._index_record(tenant, doc_id) if stored is not None else None
            if is_corrupt(rec):
                raise CorruptEntry(f"index record of document {doc_id!r}", rec.reason)
        except CorruptEntry as e:
            with contextlib.suppress(*redis_errors()):
                self.store.catalog.mark_corrupt(tenant, doc_id, e)
            if not strict:
                return None
            raise ServiceError(409, "document_corrupt", f"document {doc_id!r} cannot be served: {e}") from None
        if stored is None or rec is None:
            return None
        if find_unencodable([stored["text"], stored["title"]]):  # stored before the API refused such text
            if not strict:
                return None
            raise ServiceError(409, "document_unreadable", f"document {doc_id!r} cannot be served: its stored text "
                               "or title is not valid Unicode; run `kvlink-rag store check --repair` or re-ingest it")
        return QueryDoc(doc_id, int(stored["version"]), Document(stored["text"], stored["title"] or None))

    def _index_record(self, tenant: str, doc_id: str) -> DocumentRecord | bool | None:
        """The index record, or ``True`` (unknown, but do not refuse) while the index is unreachable."""
        try:
            return self.store.index.get(tenant, doc_id)
        except redis_errors():
            return True
