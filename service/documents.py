"""The documents' front door: ingest, update, delete, precompute and recovery, for every caller (the API
routes, the CLI, the workers, the precompute queues, start-up recovery).

The lifecycle lives here; :mod:`store.catalog` below keeps the bytes, keys, index records and tiers it
acts on. The engine is needed only to precompute and to find a text's cache keys, so the web process can
ingest before (or without) loading a model and a worker can precompute.

Update semantics (issue 3): re-ingesting a document id with the same content hash does nothing (but
queues the precompute again while the document is still ``queued``/``stale``: its task may have been
lost in a crash); with a different one the record becomes ``stale``, a new precompute is queued, the old
cache is never served (queries key caches by the *current* text) and is deleted once the new one is
ready.

No cache outlives the record that points to it: a precompute (or a query that encoded a document on the
spot) whose document was deleted or changed meanwhile drops the cache it wrote unless another record
uses it, and a delete drops the cache of exactly the record it removed (:meth:`DocumentIndex.pop`).

A document longer than ``chunk_tokens`` is stored as chunks (:mod:`kvlink_rag.text.chunking`), each a cache
keyed by its own text; its record points at all of them (:attr:`DocumentRecord.cache_keys`). Precompute
itself (which chunks to encode, what to drop) is :mod:`service.precompute`.

The failure policy is written once, in :meth:`DocumentService.precompute_or_fail`: a ``ValueError``
(too long for the model, a cache larger than the store) is permanent and marks the document ``failed``
with the reason; anything else is the caller's to retry (workers) or to mark failed
(:meth:`DocumentService.mark_failed`, the embedded pool).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from kvlink_rag.types import Document
from service.errors import QueueUnavailable
from service.precompute import CacheTooLarge, adopt, precompute
from store.index.document_index import DocumentRecord, is_corrupt
from kvlink_rag.encodable import normalize_text
from store.keys import content_hash, simhash64

if TYPE_CHECKING:
    from kvlink_rag.engine import Engine
    from service.pins import PinRegistry
    from service.retrieval import Retrieval
    from store.catalog import Catalog
    from store.factory import Store
    from store.recovery import RebuildReport

__all__ = ["CacheTooLarge", "DocumentService", "DocumentSize", "IngestResult", "PrecomputeOutcome"]
log = logging.getLogger(__name__)


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


@dataclass
class PrecomputeOutcome:
    """What one precompute did: ``ready`` (the record), ``skipped`` (deleted or superseded) or ``failed``
    (permanent: ``error`` says why, and the record is marked failed with it)."""

    status: Literal["ready", "skipped", "failed"]
    record: DocumentRecord | None = None
    error: str = ""


@dataclass
class DocumentSize:
    """A text's size as the engine sees it: ``tokens`` (its ids alone), ``linked`` (with the link tokens of
    its chunks), ``fits`` (what a query over this document alone can hold) and ``budget`` (that limit in
    words)."""

    tokens: int
    linked: int
    fits: int
    budget: str


class DocumentService:
    """Documents of all tenants.

    Args:
        store: the store (its catalog's ``enqueue`` schedules precomputes).
        engine: encodes documents and names their cache keys; None until loaded (ingest, delete of a
            recorded document and listing work without it).
        retrieval: BM25 over each tenant's documents, refreshed after an ingest or a delete.
        pins: the host tier's pins; an updated or deleted document is unpinned.
    """

    def __init__(self, store: Store, engine: Engine | None = None, retrieval: Retrieval | None = None,
                 pins: PinRegistry | None = None):
        self.store, self.engine, self.retrieval, self.pins = store, engine, retrieval, pins

    @property
    def catalog(self) -> Catalog:
        """The store's :class:`store.catalog.Catalog`."""
        return self.store.catalog

    def _engine(self) -> Engine:
        if self.engine is None:
            raise RuntimeError("no engine loaded: documents cannot be encoded in this process")
        return self.engine

    def ingest(self, tenant: str, doc_id: str, text: str, title: str = "",
               metadata: dict | None = None) -> IngestResult:
        """Add or update a document; queue its precompute when new or changed.

        Raises:
            ValueError: empty text, or an invalid tenant/document id.
            service.queues.QueueUnavailable: stored but not queued (the record is marked failed so that a
                re-ingest retries it).
        """
        try:
            res = self._ingest(tenant, doc_id, text, title, metadata)
        except QueueUnavailable:
            rec = self.store.index.get(tenant, doc_id)
            if rec is not None:
                self.catalog.fail(tenant, doc_id, rec.version, "precompute could not be queued")
            self._refresh(tenant)
            raise
        self._refresh(tenant)
        return res

    def _ingest(self, tenant: str, doc_id: str, text: str, title: str, metadata: dict | None) -> IngestResult:
        norm = normalize_text(text)
        if not norm:
            raise ValueError("document text is empty")
        title = normalize_text(title or "")
        ch, sh = content_hash(norm), simhash64(norm)
        index, texts, enqueue = self.store.index, self.store.texts, self.catalog.enqueue
        old = index.get(tenant, doc_id)
        if is_corrupt(old):
            old = None  # rewritten from scratch (the index drops the lost record's secondary entries)
        stored = texts.get_intact(tenant, doc_id)  # a corrupt one is rewritten below
        dups = [(d, dist) for d, dist in index.near_duplicates(sh, tenant) if d != doc_id]
        intact = old is not None and stored is not None and stored["version"] == old.version
        if intact and old.content_hash == ch and old.title == title and old.status != "failed":
            if old.status in ("queued", "stale"):  # its task may have been lost (crash): queue it again
                enqueue(tenant, doc_id, old.version)
            return IngestResult(old, dups, queued=old.status in ("queued", "stale"), changed=False)
        # versions continue past the text's, so a task of a lost record's version never matches
        version = max(old.version if old else 0, stored["version"] if stored else 0) + 1
        status = "stale" if old is not None and old.status == "ready" else "queued"
        meta = dict(metadata if metadata is not None else (old.metadata if old else {}))
        record = DocumentRecord(doc_id=doc_id, tenant=tenant, title=title, content_hash=ch, simhash=sh,
                                cache_key=old.cache_key if old else "", status=status, version=version,
                                hits=old.hits if old else 0, metadata=meta)
        texts.put(tenant, doc_id, version, norm, title, meta)
        record, replaced = index.swap(record)
        for key in set(replaced.cache_keys if replaced is not None else ()) - set(record.cache_keys):
            self.catalog.drop_cache(key)  # a worker made it ready after our read: no record keeps it now
        enqueue(tenant, doc_id, version)
        return IngestResult(record, dups, queued=True, changed=True)

    def update(self, tenant: str, doc_id: str, text: str, title: str, metadata: dict | None = None) -> IngestResult:
        """Replace a document's text (unpinning it first): :meth:`ingest`, whose errors it raises."""
        if self.pins is not None:
            self.pins.unpin(tenant, doc_id)
        return self.ingest(tenant, doc_id, text, title, metadata)

    def delete(self, tenant: str, doc_id: str) -> bool:
        """Unpin, then remove record, text and (if no other document uses it) the cache. False if neither
        the record nor the text exists.

        A text whose record the index lost (e.g. an emptied Redis) is deleted too; its cache is found
        through the engine when one is loaded (else ``kvlink-rag store check --repair`` reclaims it).
        """
        if self.pins is not None:
            self.pins.unpin(tenant, doc_id)
        rec = self.store.index.pop(tenant, doc_id)  # atomic: the cache key of exactly the record removed
        stored = None
        if (rec is None or not rec.cache_key) and self.engine is not None:
            stored = self.store.texts.last_known(tenant, doc_id)
        had_text = self.store.texts.delete(tenant, doc_id)
        if rec is not None and rec.cache_key:
            for key in rec.cache_keys:
                self.catalog.drop_cache(key)
        elif stored is not None:
            doc = Document(stored["text"], stored["title"] or None)
            for key in self.catalog.cache_keys(tenant, doc, self.engine):
                self.catalog.drop_cache(key)
        deleted = rec is not None or had_text
        if deleted:
            self._refresh(tenant)
        return deleted

    def precompute(self, tenant: str, doc_id: str, version: int) -> DocumentRecord | None:
        """Encode and store the document's KV if ``version`` is still current (:func:`service.precompute.
        precompute`): the ready record, or None when skipped.

        Raises:
            CacheTooLarge: the KV does not fit the store even alone (the document is marked failed).
            ValueError: the document cannot be encoded (e.g. longer than the model's context).
            RuntimeError: no engine is loaded.
        """
        return precompute(self.catalog, tenant, doc_id, version, self._engine())

    def precompute_or_fail(self, tenant: str, doc_id: str, version: int) -> PrecomputeOutcome:
        """:meth:`precompute`, a permanent failure (``ValueError``) marking the document ``failed``.

        Raises:
            Exception: anything else (Redis or store trouble): transient, the caller retries it or marks
                the document failed with :meth:`mark_failed`.
        """
        try:
            record = self.precompute(tenant, doc_id, version)
        except ValueError as e:  # permanent: empty, longer than the model's context, larger than the store
            self.mark_failed(tenant, doc_id, version, str(e))
            return PrecomputeOutcome("failed", error=str(e))
        return PrecomputeOutcome("skipped") if record is None else PrecomputeOutcome("ready", record)

    def mark_failed(self, tenant: str, doc_id: str, version: int, reason: str) -> bool:
        """Mark a precompute of ``version`` as failed (kept for inspection; re-ingest retries); best effort:
        False (logged) when the index cannot be written (it may be the thing that is down)."""
        try:
            self.catalog.fail(tenant, doc_id, version, reason)
        except Exception:  # noqa: BLE001
            log.exception("could not mark %s/%s v%d failed", tenant, doc_id, version)
            return False
        return True

    def adopt(self, tenant: str, doc_id: str, version: int, doc: Document) -> DocumentRecord | None:
        """After a query encoded ``doc`` and stored its cache: :func:`service.precompute.adopt`.

        Raises:
            ValueError, RuntimeError: as :meth:`precompute`.
        """
        return adopt(self.catalog, tenant, doc_id, version, doc, self._engine())

    def size(self, text: str, title: str = "") -> DocumentSize:
        """The token counts of a text about to be ingested (nothing is stored).

        Raises:
            ValueError: the engine cannot tokenise it. RuntimeError: no engine is loaded.
        """
        eng, doc = self._engine(), Document(text.strip(), title or None)
        return DocumentSize(int(eng.document_ids(doc).numel()), eng.linked_tokens(doc), eng.max_document_tokens(),
                            eng.document_budget_text())

    def requeue_unfinished(self) -> int:
        """Queue every ``queued`` or ``stale`` document again (:func:`store.recovery.requeue_unfinished`);
        how many."""
        from store.recovery import requeue_unfinished

        return requeue_unfinished(self.store, self.catalog.enqueue)

    def rebuild_index(self) -> RebuildReport:
        """Recreate the records the index lacks from the stored texts (:func:`store.recovery.rebuild_index`;
        the engine, when loaded, finds their stored caches).

        Raises:
            redis.exceptions.ConnectionError: the Redis index is unreachable.
        """
        from store.recovery import rebuild_index

        return rebuild_index(self.store, self.engine)

    def _refresh(self, tenant: str) -> None:
        if self.retrieval is not None:
            self.retrieval.invalidate(tenant)
