"""The document catalog's store half: records, texts, cache keys and the one way a cache is dropped.

Ties the index (records and status), the texts and the document cache (blob store and memory tiers,
written only through :meth:`store.doc_cache.StoreCache.write`) together. The lifecycle that acts on them
(ingest, update, delete, precompute, recovery) is :class:`service.documents.DocumentService`; what is
here keeps two invariants of its own: no cache is dropped while a record points at it
(:meth:`Catalog.drop_cache`), and none is stored again once no record does (:meth:`Catalog.restore_cache`).
Caches are keyed per tenant (:meth:`Catalog.cache_key`) unless shared across tenants.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from kvlink_rag.cache import DocumentCache
from kvlink_rag.types import Document, DocumentKV
from store.doc_cache import StoreCache
from store.index.document_index import DocumentIndex, DocumentRecord, is_corrupt
from store.integrity import CorruptEntry
from store.texts import TextStore

Enqueue = Callable[[str, str, int], None]


class DocumentNotFound(KeyError):
    """No such document for this tenant."""


class CacheKeying(Protocol):
    """What names a document's caches (``kvlink_rag.engine.Engine``): its fingerprint and prompt text."""

    def cache_key(self, doc: Document, cache: DocumentCache | None = None) -> str:
        """The key of ``doc``'s (unchunked) cache in ``cache``'s view of the store."""

    def cache_keys(self, doc: Document, cache: DocumentCache | None = None) -> list[str]:
        """The keys of ``doc``'s chunk caches, in order."""


class Catalog:
    """Documents of all tenants.

    Args:
        index: the document index (embedded or Redis).
        texts: document texts (LMDB).
        cache: the store's :class:`~store.doc_cache.StoreCache` (KV caches in the blob store, memory tiers
            in front invalidated on update/delete); its :meth:`~StoreCache.for_tenant` views key each
            tenant's caches, and its :meth:`~StoreCache.write` is how caches are written.
        enqueue: called with ``(tenant, doc_id, version)`` to schedule a precompute (by the lifecycle
            above, and here when a dropped cache turns out to be still in use).
    """

    def __init__(self, index: DocumentIndex, texts: TextStore, cache: StoreCache, enqueue: Enqueue):
        self.index, self.texts, self.cache, self.enqueue = index, texts, cache, enqueue
        self.blobs, self.tiered = cache.blobs, cache.tiered

    def cache_key(self, tenant: str, doc: Document, engine: CacheKeying) -> str:
        """The key of ``doc``'s cache for ``tenant``: the engine's fingerprint and prompt text, keyed by the
        tenant's view of the store (tenant folded in unless caches are shared)."""
        return engine.cache_key(doc, self.cache.for_tenant(tenant))

    def cache_keys(self, tenant: str, doc: Document, engine: CacheKeying) -> list[str]:
        """The keys of ``doc``'s chunk caches for ``tenant`` (:meth:`cache_key` of each chunk, in order)."""
        return engine.cache_keys(doc, self.cache.for_tenant(tenant))

    def stored_text(self, tenant: str, doc_id: str) -> dict | None:
        """The stored text entry, or None when absent or corrupt (the record is then marked failed)."""
        try:
            return self.texts.get(tenant, doc_id)
        except CorruptEntry as e:
            self.mark_corrupt(tenant, doc_id, e)
            return None

    def mark_corrupt(self, tenant: str, doc_id: str, err: Exception) -> DocumentRecord | None:
        """Mark the record ``failed`` with ``err`` (a corrupt stored text) so that it is reported, and
        re-ingesting it repairs it; the record after (None when there is none)."""
        rec = self.index.get(tenant, doc_id)
        if rec is None or is_corrupt(rec) or rec.status == "failed":
            return rec
        return self.index.set_status(tenant, doc_id, "failed", version=rec.version,
                                     metadata={**rec.metadata, "error": str(err)}) or rec

    def verified(self, tenant: str, doc_id: str) -> tuple[DocumentRecord | None, dict | None]:
        """``(record, stored text)``; a corrupt text gives ``(record marked failed, None)``, a corrupt
        record a failed :class:`~store.index.document_index.CorruptDocumentRecord` (and None)."""
        rec = self.index.get(tenant, doc_id)
        if rec is None or is_corrupt(rec):
            return rec, None
        try:
            return rec, self.texts.get(tenant, doc_id)
        except CorruptEntry as e:
            return self.mark_corrupt(tenant, doc_id, e), None

    def document(self, tenant: str, doc_id: str) -> tuple[DocumentRecord, Document]:
        """The record and current text of a document.

        Raises:
            DocumentNotFound: unknown id for this tenant.
            store.integrity.CorruptEntry: the record or the text is corrupt (the record is marked failed).
        """
        rec, stored = self.verified(tenant, doc_id)
        if rec is None:
            raise DocumentNotFound(doc_id)
        if is_corrupt(rec):
            raise CorruptEntry(f"index record of document {doc_id!r}", rec.reason)
        if stored is None and rec.status == "failed":
            raise CorruptEntry(f"document {doc_id!r}", str(rec.metadata.get("error", "text unreadable")))
        if stored is None:
            raise DocumentNotFound(doc_id)
        return rec, Document(stored["text"], stored["title"] or None)

    def fail(self, tenant: str, doc_id: str, version: int, reason: str) -> None:
        """Mark a precompute of ``version`` as failed (kept for inspection; re-ingest retries)."""
        rec = self.index.get(tenant, doc_id)
        if rec is not None and not is_corrupt(rec):
            self.index.set_status(tenant, doc_id, "failed", version=version,
                                  metadata={**rec.metadata, "error": reason[:500]})

    def drop_cache(self, key: str, kv: DocumentKV | None = None) -> None:
        """Delete a cache from LMDB and the tiers unless a record still points at it.

        A precompute may point a record at the cache between the check and the delete (it found the cache
        stored, so it did not encode): the references are checked again after the delete and the cache is
        put back (``kv``, the document's KV if the caller has it: :meth:`restore_cache`) or those documents are
        queued again, still pointing at it (the queued precompute stores it; a delete or an update meanwhile
        drops it through that reference). A precompute that sets its record ready after this second check finds
        the cache gone itself and restores it.
        """
        if self.index.find_by_cache_key(key):
            return
        self.blobs.delete(key)
        self.tiered.invalidate(key)
        users = self.index.find_by_cache_key(key)
        if users and kv is not None:
            self.restore_cache(key, kv)
            return
        for tenant, doc_id in users:
            rec = self.index.get(tenant, doc_id)
            if rec is not None and key in rec.cache_keys and rec.status == "ready" and key not in self.blobs:
                if self.index.set_status(tenant, doc_id, "queued", version=rec.version):
                    self.enqueue(tenant, doc_id, rec.version)

    def restore_cache(self, key: str, kv: DocumentKV) -> bool:
        """Write a cache a concurrent :meth:`drop_cache` deleted while a record came to point at it, then keep
        it only if a record still does: the check comes after the write, so a delete or update that removed the
        last reference meanwhile (its own drop found nothing to delete yet) leaves no unreferenced cache. True
        when kept.

        Raises:
            store.lmdb_env.StoreFullError, ValueError: as :meth:`StoreCache.write` (nothing was written).
        """
        self.cache.write(key, kv, fill_tiers=False)
        if self.index.find_by_cache_key(key):
            return True
        self.drop_cache(key)
        return False
