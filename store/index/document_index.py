"""The document index: one :class:`DocumentRecord` per (tenant, document), behind one interface.

Backends are chosen by URL scheme with :func:`store.backends.open_index`:

- ``lmdb://PATH``: :class:`store.index.embedded.EmbeddedIndex`, sub-databases of the same LMDB
  environment as the blob store (no server).
- ``redis://host:port/db`` (also ``rediss://``, ``unix://``): :class:`store.index.redis.RedisIndex`.

Near-duplicates are found through SimHash bands: the 64-bit hash is cut into 4 bands of 16 bits, and
a document is filed under each ``(band number, band value)``. Two hashes within Hamming distance 3
differ in at most 3 bands, so they share at least one band exactly (pigeonhole); candidates from the
shared buckets are then checked for their true distance.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from store.keys import hamming

log = logging.getLogger(__name__)

STATUSES = ("queued", "ready", "failed", "stale")
BANDS = 4
BAND_BITS = 16
BAND_RADIUS = BANDS - 1  # the largest distance the band buckets are guaranteed to find
_MAX_ID_BYTES = 200


@dataclass
class DocumentRecord:
    """What the index knows about one document of one tenant.

    Attributes:
        doc_id, tenant: identity; non-empty, no NUL, at most 200 UTF-8 bytes each.
        title: display title.
        content_hash: sha256 hex of the normalised text (:func:`store.keys.content_hash`).
        simhash: unsigned 64-bit SimHash (:func:`store.keys.simhash64`).
        cache_key: blob-store key of the precomputed KV (empty until computed); a document stored as chunks
            (:mod:`kvlink_rag.text.chunking`) has its chunks' keys here, in order, separated by spaces
            (:attr:`cache_keys`).
        num_tokens: document length in tokens.
        nbytes: stored payload bytes.
        status: ``'queued' | 'ready' | 'failed' | 'stale'``.
        version: incremented by the caller whenever the text changes; guards late worker results.
        created, updated: unix seconds.
        hits: times the cache was used (see :meth:`DocumentIndex.incr_hits`).
        metadata: free-form JSON-able dict.
    """

    doc_id: str
    tenant: str
    title: str = ""
    content_hash: str = ""
    simhash: int = 0
    cache_key: str = ""
    num_tokens: int = 0
    nbytes: int = 0
    status: str = "queued"
    version: int = 1
    created: float = 0.0
    updated: float = 0.0
    hits: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_id("tenant", self.tenant)
        check_id("doc_id", self.doc_id)
        check_status(self.status)
        if not 0 <= int(self.simhash) < 1 << 64:
            raise ValueError(f"simhash must be an unsigned 64-bit int, got {self.simhash}")

    @property
    def cache_keys(self) -> list[str]:
        """The keys of this document's caches: one, one per chunk, or none before it is computed."""
        return self.cache_key.split()

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of all fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DocumentRecord:
        """Inverse of :meth:`to_dict`; unknown keys are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class CorruptDocumentRecord(DocumentRecord):
    """Stands in for a stored record that failed its checksum or could not be parsed: only the ids are
    known; ``status`` is ``failed`` and ``metadata["error"]`` says to re-ingest. Re-ingesting (or any
    write of the record) replaces it and drops whatever secondary entries the lost record had."""

    def __init__(self, tenant: str, doc_id: str, reason: str):
        super().__init__(doc_id=doc_id, tenant=tenant, status="failed", version=0,
                         metadata={"error": f"corrupt index record ({reason}); re-ingest the document"})
        self.reason = reason


def is_corrupt(record: DocumentRecord | None) -> bool:
    """True for a :class:`CorruptDocumentRecord`."""
    return isinstance(record, CorruptDocumentRecord)


FIELD_NAMES = tuple(f.name for f in fields(DocumentRecord))
_IMMUTABLE = ("doc_id", "tenant")


def check_status(status: str) -> None:
    """Raises ValueError unless ``status`` is one of :data:`STATUSES`."""
    if status not in STATUSES:
        raise ValueError(f"unknown status {status!r}; choose one of {STATUSES}")


def check_id(what: str, value: str) -> None:
    """Raises ValueError unless ``value`` is a non-empty string without NUL of at most 200 bytes."""
    if not isinstance(value, str) or not value or "\0" in value or len(value.encode()) > _MAX_ID_BYTES:
        raise ValueError(f"{what} must be a non-empty string without NUL, at most {_MAX_ID_BYTES} bytes: {value!r}")


def bands(simhash: int) -> list[tuple[int, int]]:
    """``[(band number, 16-bit band value)]`` for the 4 bands of a 64-bit hash, low bits first."""
    mask = (1 << BAND_BITS) - 1
    return [(i, (simhash >> (BAND_BITS * i)) & mask) for i in range(BANDS)]


def apply_fields(record: DocumentRecord, updates: dict[str, Any]) -> DocumentRecord:
    """A copy of ``record`` with ``updates`` applied.

    Raises:
        ValueError: an unknown field, or an attempt to change ``doc_id``/``tenant``.
    """
    bad = [k for k in updates if k not in FIELD_NAMES or k in _IMMUTABLE]
    if bad:
        raise ValueError(f"cannot set {bad}; settable fields: {[n for n in FIELD_NAMES if n not in _IMMUTABLE]}")
    return DocumentRecord.from_dict({**record.to_dict(), **updates})


class DocumentIndex(ABC):
    """Tenant-scoped document records with secondary lookups (content hash, cache key, SimHash).

    All methods are safe to call from several threads; each mutation is atomic.

    Args:
        clock: unix-seconds clock stamping ``created``/``updated`` (injectable for tests).
    """

    def __init__(self, clock=time.time) -> None:
        self.clock = clock
        self.corrupt_reads = 0  # reads that found a corrupt record (exported as a metric)

    def _corrupt(self, tenant: str, doc_id: str, reason: str) -> CorruptDocumentRecord:
        """Count and log a corrupt read; the stand-in record."""
        self.corrupt_reads += 1
        log.warning("corrupt index record %s/%s (%s); reported as failed until re-ingested", tenant, doc_id, reason)
        return CorruptDocumentRecord(tenant, doc_id, reason)

    def upsert(self, record: DocumentRecord) -> DocumentRecord:
        """Insert or replace a record; returns what was stored.

        ``created`` is kept from an existing record (or set to now when 0), ``updated`` is set to
        now and ``hits`` are kept from an existing record (they belong to :meth:`incr_hits`).
        """
        return self.swap(record)[0]

    @abstractmethod
    def swap(self, record: DocumentRecord) -> tuple[DocumentRecord, DocumentRecord | None]:
        """:meth:`upsert` that also returns the record it replaced (read in the same atomic step), so the
        caller learns of a worker that changed it after the caller's own read: ``(stored, replaced)``."""

    @abstractmethod
    def get(self, tenant: str, doc_id: str) -> DocumentRecord | None:
        """The record, or None; a :class:`CorruptDocumentRecord` when the stored one is corrupt."""

    def delete(self, tenant: str, doc_id: str) -> bool:
        """Remove a record and its secondary entries; True if it existed."""
        return self.pop(tenant, doc_id) is not None

    @abstractmethod
    def pop(self, tenant: str, doc_id: str) -> DocumentRecord | None:
        """Remove a record and its secondary entries atomically; the record removed, or None.

        The caller learns exactly which cache the removed record pointed at, even when a worker set it
        between an earlier read and this call.
        """

    @abstractmethod
    def list(self, tenant: str, offset: int = 0, limit: int = 100) -> list[DocumentRecord]:
        """Records of ``tenant`` ordered by ``doc_id`` (code point order), ``limit`` from ``offset``;
        corrupt ones as :class:`CorruptDocumentRecord` (status ``failed``)."""

    def records(self, tenant: str, page: int = 1000) -> Iterator[DocumentRecord]:
        """Every record of ``tenant`` in id order, read :meth:`list` ``page`` records at a time (corrupt
        ones as :class:`CorruptDocumentRecord`)."""
        offset = 0
        while True:
            batch = self.list(tenant, offset=offset, limit=page)
            yield from batch
            if len(batch) < page:
                return
            offset += page

    @abstractmethod
    def count(self, tenant: str) -> int:
        """Number of records of ``tenant``."""

    @abstractmethod
    def set_status(
        self, tenant: str, doc_id: str, status: str, /, version: int | None = None, **fields: Any
    ) -> DocumentRecord | None:
        """Set ``status`` (and any other ``fields``, e.g. ``cache_key``, ``num_tokens``) atomically.

        Returns the updated record, or None when the record is absent or corrupt (only an upsert
        replaces a corrupt one) or ``version`` is given and differs from the stored one (a worker
        finishing an outdated version must not win).

        Raises:
            ValueError: unknown status or field.
        """

    @abstractmethod
    def incr_hits(self, tenant: str, doc_id: str, n: int = 1) -> int | None:
        """Add ``n`` to ``hits``; the new count, or None when the record is absent."""

    @abstractmethod
    def find_by_content_hash(self, tenant: str, content_hash: str) -> list[DocumentRecord]:
        """Records of ``tenant`` with exactly this content hash, ordered by ``doc_id``."""

    @abstractmethod
    def find_by_cache_key(self, cache_key: str) -> list[tuple[str, str]]:
        """``(tenant, doc_id)`` of every record pointing at ``cache_key``, sorted (for re-queueing a
        corrupt or evicted blob)."""

    @abstractmethod
    def _band_candidates(self, tenant: str, simhash: int) -> dict[str, int]:
        """doc_id -> simhash of the records of ``tenant`` sharing at least one band with ``simhash``."""

    @abstractmethod
    def _all_simhashes(self, tenant: str) -> dict[str, int]:
        """doc_id -> simhash of every record of ``tenant``."""

    def near_duplicates(self, simhash: int, tenant: str, max_distance: int = 3) -> list[tuple[str, int]]:
        """``(doc_id, distance)`` of the records of ``tenant`` whose SimHash is within
        ``max_distance`` bits, nearest first (ties by ``doc_id``).

        Up to distance 3 this reads only the 4 band buckets; a larger ``max_distance`` scans the
        tenant. A near-duplicate is a hint: only an equal content hash makes caches interchangeable.
        """
        cands = self._band_candidates(tenant, simhash) if max_distance <= BAND_RADIUS else self._all_simhashes(tenant)
        hits = [(d, hamming(simhash, h)) for d, h in cands.items()]
        return sorted(((d, n) for d, n in hits if n <= max_distance), key=lambda x: (x[1], x[0]))

    @abstractmethod
    def tenants(self) -> list[str]:
        """Tenants with at least one record, sorted."""

    def ping(self, timeout: float = 2.0) -> None:  # noqa: B027 - a backend with a server overrides it
        """Raise when the index cannot be reached within ``timeout`` seconds (readiness probes); the
        embedded index lives in the store's LMDB environment and has nothing of its own to reach."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections (the LMDB environment of the embedded index stays open)."""
