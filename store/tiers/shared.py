"""A host's local blob store (bounded LMDB) as a read-through tier in front of the shared one (Redis): the
:class:`~store.blobs.blob_store.BlobStore` of a service with ``KVLINK_RAG_SHARED_STORE_URL`` set.

* Writes (precompute, query-time encodes) go to the shared tier, then the local one: the same bytes
  (:class:`~store.blobs.blob_store.RawRecord`, encoded once).
* Reads ask the shared tier for the record's meta first. A local copy is served only when the shared tier
  holds the same record (equal checksums); when the shared tier no longer holds it (deleted after an update
  or a delete on any host, evicted) the local copy is dropped and the read is a miss. So a host never serves
  a cache the shared tier has given up, even from its own disk (version fencing). Cache keys are content
  hashes of the document's current text, which every host reads from the shared index and texts, so the
  key a query asks for already belongs to the current version; the fence makes the local tier exact too.
* Otherwise the record is streamed from the shared tier layer by layer (the linker starts on layer 0) and,
  once complete and verified, written to the local tier (a record too large for it is skipped); a streamed
  record is written by a background thread, off the query's path (:meth:`TieredBlobStore.drain` waits).
* An unreachable shared tier is a miss for records the local tier lacks; a local copy is then served
  (content-addressed: the key fixes the text and the encoding, and the payload is checksummed). A failed
  shared write raises :class:`~store.blobs.blob_store.BlobStoreUnavailable` after the local write. The shared tier's
  circuit breakers (:mod:`store.blobs.breakers`) make that cost one short timeout: while a target's breaker is
  open its calls fail at once (:class:`~store.blobs.breakers.TierSkipped`, logged at debug level).

Counters (``counters``, exported by ``/metrics``): ``local_hit``, ``shared_hit``, ``miss``, ``fenced`` (local
copy dropped), ``shared_error``, ``corrupt`` (a shared payload failed its checksum here), ``fill_skipped``
(did not fit locally).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import torch

from kvlink_rag.types import DocumentKV
from store.records import codec
from store.records.layer_decode import decode_document
from store.blobs.blob_store import BlobStore, BlobStoreUnavailable, RawRecord, RecordSink, RecordSource
from store.records.errors import CorruptRecordError
from store.lmdb_env import StoreFullError
from store.blobs.breakers import TierSkipped
from store.records import ordered_layout
from store.tiers.shared_stream import decoded_layers, stored_fills
from store.tiers.shared_records import kept as _kept, local_meta as _local_meta, same as _same

log = logging.getLogger(__name__)
_UNREACHABLE = object()


class TieredBlobStore(BlobStore):
    """``local`` (bounded, this host's disk) read-through in front of ``shared`` (every host's).

    Args:
        local: e.g. :class:`store.blobs.lmdb.LmdbBlobStore`; must also be a :class:`RecordSink`.
        shared: e.g. :class:`store.blobs.redis.RedisBlobStore`; must also be a :class:`RecordSource`.
    """

    def __init__(self, local: BlobStore, shared: BlobStore) -> None:
        if not isinstance(local, BlobStore) or not isinstance(shared, BlobStore):
            raise TypeError("local and shared must be blob stores")
        self.local: BlobStore = local
        self.shared: BlobStore = shared
        self._sink: RecordSink = local  # type: ignore[assignment]
        self._source: RecordSource = shared  # type: ignore[assignment]
        self.counters: Counter[str] = Counter()
        self._filler = ThreadPoolExecutor(1, thread_name_prefix="local-fill")
        self._pending: dict = {}  # key -> the Future of its local write in progress

    def drain(self) -> None:
        """Wait until the local fills of records streamed so far are written (they run in the background)."""
        self._filler.submit(lambda: None).result()

    @property
    def checksum_failures(self) -> int:  # type: ignore[override]
        return self.local.checksum_failures + self.shared.checksum_failures + self.counters["corrupt"]

    @property
    def evictions(self) -> int:  # type: ignore[override]
        return self.local.evictions

    def _shared_meta(self, key: str):
        """The shared tier's meta of ``key``, None when absent, or ``_UNREACHABLE`` (counted)."""
        if (pending := self._pending.get(key)) is not None:  # its local copy is being written: not fetched twice
            pending.result()
        try:
            return self.shared.meta(key)
        except BlobStoreUnavailable as e:
            self.counters["shared_error"] += 1
            log.log(logging.DEBUG if isinstance(e, TierSkipped) else logging.WARNING, "%s", e)  # skips: every call
            return _UNREACHABLE

    def _fenced_local(self, key: str, smeta) -> bool:
        """Whether the local copy of ``key`` may be served against the shared meta ``smeta``; a local copy
        the shared tier no longer vouches for is deleted (``fenced``)."""
        try:
            lmeta = self.local.meta(key)
        except CorruptRecordError:
            lmeta = None
        if lmeta is None:
            return False
        if smeta is _UNREACHABLE or _same(lmeta, smeta):
            return True
        self.counters["fenced"] += 1
        self.local.delete(key)
        return False

    # -- writing -----------------------------------------------------------------------------------
    def put_record(self, key: str, record: RawRecord) -> int:
        """Store an encoded record in the shared tier, then the local one (:meth:`BlobStore.put` encodes once
        and calls this).

        Raises:
            ValueError: invalid key. StoreFullError: the shared tier is full (no eviction).
            BlobStoreUnavailable: the shared tier failed (the local copy is still written).
        """
        try:
            nbytes = self._source.put_record(key, record)
        except BlobStoreUnavailable:
            self.counters["shared_error"] += 1
            self._fill(key, record)
            raise
        self._fill(key, record)
        return nbytes

    def _fill(self, key: str, record: RawRecord) -> None:
        try:
            self._sink.put_record(key, RawRecord(_local_meta(record.meta), record.ids, record.layers))
        except StoreFullError as e:
            self.counters["fill_skipped"] += 1
            log.info("%s not kept in the local tier: %s", key[:24], e)

    def delete(self, key: str) -> bool:
        """Delete from the shared tier (every host stops serving it) and this host's local tier.

        Raises:
            BlobStoreUnavailable: the shared tier failed (the local copy is deleted anyway).
        """
        existed = self.local.delete(key)
        return self.shared.delete(key) or existed

    # -- reading -----------------------------------------------------------------------------------
    def get(self, key: str, dtype: torch.dtype | str | None = None) -> DocumentKV | None:
        """Local copy if the shared tier vouches for it, else from the shared tier (then kept locally)."""
        smeta = self._shared_meta(key)
        if self._fenced_local(key, smeta):
            kv = self.local.get(key, dtype)
            if kv is not None:
                self.counters["local_hit"] += 1
                return kv
        if smeta is None or smeta is _UNREACHABLE:
            self.counters["miss"] += 1
            return None
        layers: list[bytes] = []
        try:
            opened = self._source.open_record(key)
            if opened is None:
                self.counters["miss"] += 1
                return None
            meta, ids, it = opened
            kv = decode_document(meta, ids, _kept(it, layers), dtype)
        except (KeyError, CorruptRecordError, BlobStoreUnavailable) as e:
            return self._failed_read(key, e)
        self.counters["shared_hit"] += 1
        self._fill(key, RawRecord(meta, ids, layers))
        return kv

    def _failed_read(self, key: str, err: Exception) -> None:
        """A shared read that failed mid-way is a miss (a corrupt record is deleted by the shared tier)."""
        self.counters["shared_error" if isinstance(err, BlobStoreUnavailable) else "miss"] += 1
        if isinstance(err, CorruptRecordError):  # found while decoding here: the shared tier has not seen it
            self.counters["corrupt"] += 1
            try:
                self.shared.delete(key)
            except BlobStoreUnavailable:
                pass
        log.log(logging.DEBUG if isinstance(err, TierSkipped) else logging.WARNING,
                "shared read of %s failed (%s): a miss", key[:24], err)
        return None

    def iter_layers(self, key: str, dtype: torch.dtype | str | None = None
                    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(k, v)`` ``[H, T, D]`` per layer from the local copy (if vouched for) or streamed from the shared
        tier, which is then kept locally.

        Raises:
            KeyError: absent, or the shared tier lost it or failed mid-stream (a miss: the caller encodes).
            CorruptRecordError: a layer failed its checksum (the record is deleted).
        """
        smeta = self._shared_meta(key)
        if self._fenced_local(key, smeta):
            self.counters["local_hit"] += 1
            yield from self.local.iter_layers(key, dtype)
            return
        meta, ids, it = self._open_shared(key, smeta)
        yield from decoded_layers(meta, ids, it, dtype, lambda e: self._failed_read(key, e),
                                  lambda layers: self._kept_locally(key, RawRecord(meta, ids, layers)))

    def _open_shared(self, key: str, smeta) -> tuple[dict, bytes, Iterator[bytes]]:
        """The shared record's ``(meta, ids, payloads)``; KeyError (a miss, counted) when absent or unreachable."""
        try:
            opened = self._source.open_record(key) if isinstance(smeta, dict) else None
        except BlobStoreUnavailable as e:
            opened = self._failed_read(key, e)
        if opened is None:
            self.counters["miss"] += 1
            raise KeyError(key)
        return opened

    def iter_stored_layers(self, key: str) -> tuple[torch.Tensor | None, Iterator]:
        """:meth:`BlobStore.iter_stored_layers`: a vouched-for local copy's own (LMDB's staged path), else the shared
        tier's payloads as stored-order fills (:mod:`store.tiers.shared_stream`), then kept locally. Raises as
        :meth:`iter_layers` (a bad order here, a lost record or a bad layer from the fills)."""
        smeta = self._shared_meta(key)
        if self._fenced_local(key, smeta):
            try:
                stored = self.local.iter_stored_layers(key)
                self.counters["local_hit"] += 1
                return stored
            except KeyError:
                pass  # gone since the check: the shared tier's stream
        meta, ids, it = self._open_shared(key, smeta)
        try:
            order = ordered_layout.token_order(meta)
        except CorruptRecordError as e:
            self._failed_read(key, e)
            raise
        return order, stored_fills(meta, ids, it, lambda e: self._failed_read(key, e),
                                   lambda layers: self._kept_locally(key, RawRecord(meta, ids, layers)))

    def _kept_locally(self, key: str, record: RawRecord) -> None:
        """A shared hit, written locally off the query's path (a read meanwhile waits, :meth:`_shared_meta`)."""
        self.counters["shared_hit"] += 1
        fut = self._pending[key] = self._filler.submit(self._fill, key, record)
        fut.add_done_callback(lambda f: self._pending.pop(key, None) if self._pending.get(key) is f else None)

    def layer_session(self):
        """:meth:`BlobStore.layer_session`: the local store's."""
        return self.local.layer_session()

    def get_ids(self, key: str) -> torch.Tensor | None:
        """Token ids from the local copy when present (it is verified), else from the shared tier."""
        ids = self.local.get_ids(key)
        if ids is not None:
            return ids
        try:
            return self.shared.get_ids(key)
        except BlobStoreUnavailable:
            return None

    def meta(self, key: str) -> dict | None:
        """The shared tier's meta (the local one's while the shared tier is unreachable)."""
        smeta = self._shared_meta(key)
        return self.local.meta(key) if smeta is _UNREACHABLE else smeta

    def contains(self, key: str) -> bool:
        """Whether the shared tier holds ``key`` (the local tier while the shared one is unreachable)."""
        try:
            return self.shared.contains(key)
        except BlobStoreUnavailable:
            self.counters["shared_error"] += 1
            return self.local.contains(key)

    # -- listing, space, health --------------------------------------------------------------------
    def keys(self) -> list[str]:
        """The shared tier's keys (the record of truth)."""
        return self.shared.keys()

    def entries(self) -> dict[str, dict]:
        """The shared tier's entries."""
        return self.shared.entries()

    def events(self) -> dict[str, int]:
        """The tiering counters (see the module docstring) and the shared tier's own events."""
        return dict(Counter(self.shared.events()) + self.counters)

    def evict(self, bytes_wanted: int) -> int:
        """Evict from the local tier (the shared one evicts by itself)."""
        return self.local.evict(bytes_wanted)

    def stats(self) -> dict:
        """The shared tier's stats with ``local`` (the local tier's) and ``tiering`` (the counters)."""
        return {**self.shared.stats(), "local": self.local.stats(), "tiering": dict(self.counters)}

    def used_bytes(self) -> int:
        """Bytes of the local tier (the shared tier reports its own)."""
        return self.local.used_bytes()

    def ping(self) -> None:
        """Both tiers readable; raises the local error or :class:`BlobStoreUnavailable` naming the shared tier."""
        self.local.ping()
        self.shared.ping()

    def close(self) -> None:
        """Finish the pending local fills, then close both tiers."""
        self._filler.shutdown(wait=True)
        self.local.close()
        self.shared.close()
