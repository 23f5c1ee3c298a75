"""The document catalog: ingest, update with invalidation, delete, and the precompute step.

Ties the index (records and status), the texts and the document cache (blob store and memory tiers,
written only through :meth:`store.doc_cache.StoreCache.write`) together. The
model is not needed here except in :meth:`Catalog.precompute`, which takes the engine as an argument,
so the web process can ingest without loading a model and a worker can precompute.

Update semantics (issue 3): re-ingesting a document id with the same content hash does nothing (but
queues the precompute again while the document is still ``queued``/``stale``: its task may have been
lost in a crash); with a different one the record becomes ``stale``, a new precompute is queued, the old
cache is never served (queries key caches by the *current* text) and is deleted once the new one is
ready.

No cache outlives the record that points to it: a precompute (or a query that encoded a document on the
spot) whose document was deleted or changed meanwhile drops the cache it wrote unless another record
uses it, and a delete drops the cache of exactly the record it removed (:meth:`DocumentIndex.pop`).
Caches are keyed per tenant (:meth:`Catalog.cache_key`) unless shared across tenants.

A document longer than ``chunk_tokens`` is stored as chunks (:mod:`kvlink_rag.chunking`), each a cache
keyed by its own text; its record points at all of them (:attr:`DocumentRecord.cache_keys`). An update
encodes only the chunks whose key is not stored yet and drops only the old keys the new version does
not use, so the chunks an edit left alone stay stored and keep serving as cache hits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from kvlink_rag.types import Document
from store.doc_cache import StoreCache, too_large_reason
from store.index import DocumentIndex, DocumentRecord, is_corrupt
from store.integrity import CorruptEntry
from store.keys import content_hash, normalize_text, simhash64
from store.lmdb_env import StoreFullError
from store.texts import TextStore

log = logging.getLogger(__name__)
Enqueue = Callable[[str, str, int], None]


class DocumentNotFound(KeyError):
    """No such document for this tenant."""


class CacheTooLarge(ValueError):
    """A document's KV cache is larger than the whole store (permanent until the limit is raised)."""


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
        cache: the store's :class:`~store.doc_cache.StoreCache` (KV caches in the blob store, memory tiers
            in front invalidated on update/delete); its :meth:`~StoreCache.for_tenant` views key each
            tenant's caches, and its :meth:`~StoreCache.write` is how caches are written.
        enqueue: called with ``(tenant, doc_id, version)`` to schedule :meth:`precompute`.
    """

    def __init__(self, index: DocumentIndex, texts: TextStore, cache: StoreCache, enqueue: Enqueue):
        self.index, self.texts, self.cache, self.enqueue = index, texts, cache, enqueue
        self.blobs, self.tiered = cache.blobs, cache.tiered

    def cache_key(self, tenant: str, doc: Document, engine) -> str:
        """The key of ``doc``'s cache for ``tenant``: the engine's fingerprint and prompt text, keyed by the
        tenant's view of the store (tenant folded in unless caches are shared)."""
        return engine.cache_key(doc, self.cache.for_tenant(tenant))

    def cache_keys(self, tenant: str, doc: Document, engine) -> list[str]:
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
        record a failed :class:`~store.index.CorruptDocumentRecord` (and None)."""
        rec = self.index.get(tenant, doc_id)
        if rec is None or is_corrupt(rec):
            return rec, None
        try:
            return rec, self.texts.get(tenant, doc_id)
        except CorruptEntry as e:
            return self.mark_corrupt(tenant, doc_id, e), None

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
        if is_corrupt(old):
            old = None  # rewritten from scratch (the index drops the lost record's secondary entries)
        stored = self.texts.get_intact(tenant, doc_id)  # a corrupt one is rewritten below
        dups = [(d, dist) for d, dist in self.index.near_duplicates(sh, tenant) if d != doc_id]
        intact = old is not None and stored is not None and stored["version"] == old.version
        if intact and old.content_hash == ch and old.title == title and old.status != "failed":
            if old.status in ("queued", "stale"):  # its task may have been lost (crash): queue it again
                self.enqueue(tenant, doc_id, old.version)
            return IngestResult(old, dups, queued=old.status in ("queued", "stale"), changed=False)
        # versions continue past the text's, so a task of a lost record's version never matches
        version = max(old.version if old else 0, stored["version"] if stored else 0) + 1
        status = "stale" if old is not None and old.status == "ready" else "queued"
        meta = dict(metadata if metadata is not None else (old.metadata if old else {}))
        record = DocumentRecord(doc_id=doc_id, tenant=tenant, title=title, content_hash=ch, simhash=sh,
                                cache_key=old.cache_key if old else "", status=status, version=version,
                                hits=old.hits if old else 0, metadata=meta)
        self.texts.put(tenant, doc_id, version, norm, title, meta)
        record, replaced = self.index.swap(record)
        for key in set(replaced.cache_keys if replaced is not None else ()) - set(record.cache_keys):
            self.drop_cache(key)  # a worker made it ready after our read: no record keeps it now
        self.enqueue(tenant, doc_id, version)
        return IngestResult(record, dups, queued=True, changed=True)

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

    def precompute(self, tenant: str, doc_id: str, version: int, engine) -> DocumentRecord | None:
        """Encode and store the document's KV if ``version`` is still current; idempotent.

        Returns the ready record, or None when the document is gone or a newer version exists (the task is
        stale and skipped). The old cache of an updated document is deleted once the new one is ready; the
        cache written here is deleted again when the document was deleted or updated while it was encoded
        (unless another record uses it). A corrupt stored text marks the record failed (and returns None).
        A chunked document encodes only its chunks not stored yet and drops only the old version's chunks
        this version does not have.

        Raises:
            CacheTooLarge: the KV does not fit the store even alone; the document is marked ``failed`` with
                the reason (queries still answer it, encoding it each time).
            ValueError: the document cannot be encoded (e.g. longer than the model's context).
        """
        rec = self.index.get(tenant, doc_id)
        if rec is None or is_corrupt(rec) or rec.version != version:
            return None
        stored = self.stored_text(tenant, doc_id)
        if stored is None or stored["version"] != version:
            return None
        doc = Document(stored["text"], stored["title"] or None)
        engine.check_document_tokens(engine.linked_tokens(doc))  # chunks fit, but all of them must too
        chunks = engine.chunks(doc)
        keys = [self.cache_key(tenant, c, engine) for c in chunks]
        cache = self.cache.for_tenant(tenant)
        kvs, num_tokens, nbytes = self._store_chunks(tenant, doc_id, version, chunks, keys, cache, engine)
        ready = self.index.set_status(tenant, doc_id, "ready", version=version, cache_key=" ".join(keys),
                                      num_tokens=num_tokens, nbytes=nbytes)
        if ready is None:  # deleted or updated while encoding: nothing may point at these caches any more
            for key in keys:
                self.drop_cache(key, kvs.get(key))
            return None
        for c, key in zip(chunks, keys, strict=True):
            if not self.blobs.contains(key):  # a concurrent drop_cache deleted it after our check: store it again
                cache.write(key, kvs[key] if key in kvs else engine.encode(c), fill_tiers=False)
        for key in set(rec.cache_keys) - set(keys):  # the old version's chunks this version no longer has
            self.drop_cache(key)
        return ready

    def _store_chunks(self, tenant: str, doc_id: str, version: int, chunks: list[Document], keys: list[str],
                      cache: StoreCache, engine) -> tuple[dict, int, int]:
        """Encode and write the chunks whose key is not stored yet: ``({key: KV encoded here}, tokens, bytes)``
        of all chunks together (stored ones counted from their metadata).

        Raises:
            CacheTooLarge: a chunk's KV does not fit the store (the document is marked failed; the chunks
                written here are dropped again unless another record uses them).
        """
        kvs: dict = {}
        num_tokens = nbytes = 0
        for c, key in zip(chunks, keys, strict=True):
            meta = self.blobs.meta(key)
            if meta is not None:
                num_tokens, nbytes = num_tokens + int(meta["num_tokens"]), nbytes + int(meta["nbytes"])
                continue
            if key in kvs:  # the same chunk text twice in one document: stored once
                num_tokens += kvs[key].num_tokens
                continue
            kv = engine.encode(c)
            try:
                nbytes += cache.write(key, kv, fill_tiers=False)
            except StoreFullError as e:
                reason = too_large_reason(kv, e)
                log.warning("precompute of %s/%s v%d: %s", tenant, doc_id, version, reason)
                self.fail(tenant, doc_id, version, reason)
                for written in kvs:
                    self.drop_cache(written)
                raise CacheTooLarge(reason) from e
            kvs[key] = kv
            num_tokens += kv.num_tokens
        return kvs, num_tokens, nbytes

    def adopt(self, tenant: str, doc_id: str, version: int, doc: Document, engine) -> DocumentRecord | None:
        """After a query encoded ``doc`` (version ``version`` as the query read it) and stored its cache:
        mark the record ready (no encoding: the cache is there); when the document was deleted or changed
        since, drop that cache unless another record uses it. The ready record, or None."""
        ready = self.precompute(tenant, doc_id, version, engine)
        if ready is None:
            for key in self.cache_keys(tenant, doc, engine):
                self.drop_cache(key)
        return ready

    def fail(self, tenant: str, doc_id: str, version: int, reason: str) -> None:
        """Mark a precompute of ``version`` as failed (kept for inspection; re-ingest retries)."""
        rec = self.index.get(tenant, doc_id)
        if rec is not None and not is_corrupt(rec):
            self.index.set_status(tenant, doc_id, "failed", version=version,
                                  metadata={**rec.metadata, "error": reason[:500]})

    def delete(self, tenant: str, doc_id: str, engine=None) -> bool:
        """Remove record, text and (if no other document uses it) the cache. False if neither the record
        nor the text exists.

        A text whose record the index lost (e.g. an emptied Redis) is deleted too; its cache is found
        through ``engine`` when given (else ``kvlink-rag store check --repair`` reclaims it).
        """
        rec = self.index.pop(tenant, doc_id)  # atomic: the cache key of exactly the record removed
        stored = None
        if (rec is None or not rec.cache_key) and engine is not None:
            stored = self.texts.last_known(tenant, doc_id)
        had_text = self.texts.delete(tenant, doc_id)
        if rec is not None and rec.cache_key:
            for key in rec.cache_keys:
                self.drop_cache(key)
        elif stored is not None:
            for key in self.cache_keys(tenant, Document(stored["text"], stored["title"] or None), engine):
                self.drop_cache(key)
        return rec is not None or had_text

    def drop_cache(self, key: str, kv=None) -> None:
        """Delete a cache from LMDB and the tiers unless a record still points at it.

        A precompute may point a record at the cache between the check and the delete (it found the cache
        stored, so it did not encode): the references are checked again after the delete and the cache is
        put back (``kv``, the document's KV if the caller has it) or those documents are queued again. A
        precompute that sets its record ready after this second check finds the cache gone itself.
        """
        if self.index.find_by_cache_key(key):
            return
        self.blobs.delete(key)
        self.tiered.invalidate(key)
        users = self.index.find_by_cache_key(key)
        if users and kv is not None:
            self.cache.write(key, kv, fill_tiers=False)
            return
        for tenant, doc_id in users:
            rec = self.index.get(tenant, doc_id)
            if rec is not None and key in rec.cache_keys and rec.status == "ready" and key not in self.blobs:
                if self.index.set_status(tenant, doc_id, "queued", version=rec.version, cache_key=""):
                    self.enqueue(tenant, doc_id, rec.version)
