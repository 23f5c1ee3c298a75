"""The document catalog: ingest, update with invalidation, delete, and the precompute step.

Ties the index (records and status), the texts, the blob store and the memory tiers together. The
model is not needed here except in :meth:`Catalog.precompute`, which takes the engine as an argument,
so the web process can ingest without loading a model and a worker can precompute.

Update semantics (issue 3): re-ingesting a document id with the same content hash does nothing; with
a different one the record becomes ``stale``, a new precompute is queued, the old cache is never served
(queries key caches by the *current* text) and is deleted once the new one is ready.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvlink_rag.engine import Document
from store.blobs import BlobStore
from store.index import DocumentIndex, DocumentRecord
from store.keys import content_hash, normalize_text, simhash64
from store.texts import TextStore
from store.tiers import TieredCache

Enqueue = Callable[[str, str, int], None]


class DocumentNotFound(KeyError):
    """No such document for this tenant."""


@dataclass
class IngestResult:
    """Outcome of one ingest.

    Attributes:
        record: the index record after the ingest.
        near_duplicates: ``[(doc_id, hamming distance)]`` of the tenant's other documents within 3 bits.
        queued: a precompute was queued.
        changed: the text (or title) differed from the stored version, or the document is new.
    """

    record: DocumentRecord
    near_duplicates: list[tuple[str, int]]
    queued: bool
    changed: bool


class Catalog:
    """Documents of all tenants.

    Args:
        index: the document index (embedded or Redis).
        texts: document texts (LMDB).
        blobs: KV caches (LMDB).
        tiered: memory tiers in front of ``blobs`` (invalidated on update/delete), or None.
        enqueue: called with ``(tenant, doc_id, version)`` to schedule :meth:`precompute`.
    """

    def __init__(self, index: DocumentIndex, texts: TextStore, blobs: BlobStore, tiered: TieredCache | None,
                 enqueue: Enqueue):
        self.index, self.texts, self.blobs, self.tiered, self.enqueue = index, texts, blobs, tiered, enqueue

    def ingest(self, tenant: str, doc_id: str, text: str, title: str = "", metadata: dict | None = None) -> IngestResult:
        """Add or update a document; queue its precompute when new or changed.

        Raises:
            ValueError: empty text, or an invalid tenant/document id.
        """
        norm = normalize_text(text)
        if not norm:
            raise ValueError("document text is empty")
        title = normalize_text(title or "")
        ch, sh = content_hash(norm), simhash64(norm)
        old = self.index.get(tenant, doc_id)
        dups = [(d, dist) for d, dist in self.index.near_duplicates(sh, tenant) if d != doc_id]
        if old is not None and old.content_hash == ch and old.title == title and old.status != "failed":
            return IngestResult(old, dups, queued=False, changed=False)
        version = old.version + 1 if old is not None else 1
        status = "stale" if old is not None and old.status == "ready" else "queued"
        meta = dict(metadata if metadata is not None else (old.metadata if old else {}))
        record = DocumentRecord(doc_id=doc_id, tenant=tenant, title=title, content_hash=ch, simhash=sh,
                                cache_key=old.cache_key if old else "", status=status, version=version,
                                hits=old.hits if old else 0, metadata=meta)
        self.texts.put(tenant, doc_id, version, norm, title)
        record = self.index.upsert(record)
        self.enqueue(tenant, doc_id, version)
        return IngestResult(record, dups, queued=True, changed=True)

    def document(self, tenant: str, doc_id: str) -> tuple[DocumentRecord, Document]:
        """The record and current text of a document.

        Raises:
            DocumentNotFound: unknown id for this tenant.
        """
        rec = self.index.get(tenant, doc_id)
        stored = self.texts.get(tenant, doc_id) if rec is not None else None
        if rec is None or stored is None:
            raise DocumentNotFound(doc_id)
        return rec, Document(stored["text"], stored["title"] or None)

    def precompute(self, tenant: str, doc_id: str, version: int, engine) -> DocumentRecord | None:
        """Encode and store the document's KV if ``version`` is still current; idempotent.

        Returns the ready record, or None when the document is gone or a newer version exists (the task is
        stale and skipped). The old cache of an updated document is deleted once the new one is ready.
        """
        rec = self.index.get(tenant, doc_id)
        stored = self.texts.get(tenant, doc_id)
        if rec is None or stored is None or rec.version != version or stored["version"] != version:
            return None
        doc = Document(stored["text"], stored["title"] or None)
        key = engine.cache_key(doc)
        meta = self.blobs.meta(key)
        if meta is None:
            kv = engine.encode(doc)
            nbytes = self.blobs.put(key, kv, int8=getattr(engine.cache, "int8", False))
            num_tokens = kv.num_tokens
        else:
            nbytes, num_tokens = int(meta["nbytes"]), int(meta["num_tokens"])
        ready = self.index.set_status(tenant, doc_id, "ready", version=version, cache_key=key,
                                      num_tokens=num_tokens, nbytes=nbytes)
        if ready is not None and rec.cache_key and rec.cache_key != key:
            self._drop_cache(rec.cache_key)
        return ready

    def fail(self, tenant: str, doc_id: str, version: int, reason: str) -> None:
        """Mark a precompute of ``version`` as failed (kept for inspection; re-ingest retries)."""
        rec = self.index.get(tenant, doc_id)
        if rec is not None:
            self.index.set_status(tenant, doc_id, "failed", version=version,
                                  metadata={**rec.metadata, "error": reason[:500]})

    def delete(self, tenant: str, doc_id: str) -> bool:
        """Remove record, text and (if no other document uses it) the cache. False if unknown."""
        rec = self.index.get(tenant, doc_id)
        if rec is None:
            return False
        self.index.delete(tenant, doc_id)
        self.texts.delete(tenant, doc_id)
        if rec.cache_key:
            self._drop_cache(rec.cache_key)
        return True

    def _drop_cache(self, key: str) -> None:
        """Delete a cache from LMDB and the tiers unless another document still points at it."""
        if self.index.find_by_cache_key(key):
            return
        self.blobs.delete(key)
        if self.tiered is not None:
            self.tiered.invalidate(key)
