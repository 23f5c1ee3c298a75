"""The LMDB :class:`~store.blobs.blob_store.BlobStore`: document KV caches, readable layer by layer,
checksummed, self-evicting (``lmdb://PATH``).

Records live in the ``blobs`` sub-database of one :class:`~store.lmdb_env.LmdbEnv` (shared with the
embedded index), laid out as :mod:`store.blobs.lmdb_records` describes; this module runs the transactions,
deletes and reports corrupt records, and evicts. A small access-stats record per document (``blob_stats``
sub-database: hits, last access, bytes, created) ranks documents for eviction when the map cannot grow past
``max_map_size``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator

import torch

from kvlink_rag.types import DocumentKV
from store.blobs import lmdb_records as records
from store.blobs.access_stats import AccessStats
from store.blobs.blob_store import BlobStore, LayerFill, RawRecord
from store.blobs.lmdb_records import BLOBS_DB, check_key, rkey
from store.blobs.lmdb_streams import LayerStreams
from store.lmdb_env import DEFAULT_MAP_SIZE, DEFAULT_MAX_MAP_SIZE, LmdbEnv, StoreFullError, open_env
from store.records import codec
from store.records.errors import CorruptRecordError
from store.cache_events import NO_EVENTS, CacheEvents

log = logging.getLogger(__name__)


class LmdbBlobStore(BlobStore):
    """Document KV caches in LMDB.

    Args:
        location: a folder, ``lmdb://PATH``, or an open :class:`LmdbEnv` to share.
        map_size: initial map size in bytes (ignored when the env is already open).
        max_map_size: bytes the map may grow to before documents are evicted.
        on_corrupt: called with the cache key after a record failed its checksum and was deleted
            (e.g. to re-queue the document for precomputation). Exceptions are logged, not raised.
        on_evict: called with each cache key evicted for space.
        clock: unix-seconds clock for access stats (injectable for tests).
        stats_flush_s: seconds between writes of buffered access stats.
    """

    def __init__(self, location: str | os.PathLike | LmdbEnv, *, map_size: int = DEFAULT_MAP_SIZE,
                 max_map_size: int = DEFAULT_MAX_MAP_SIZE, on_corrupt: Callable[[str], None] | None = None,
                 on_evict: Callable[[str], None] | None = None, clock: Callable[[], float] = time.time,
                 stats_flush_s: float = 5.0) -> None:
        if isinstance(location, LmdbEnv):
            self.env = location
        else:
            path = str(location)
            path = path[len("lmdb://") :] if path.startswith("lmdb://") else path
            self.env = open_env(path, map_size=map_size, max_map_size=max_map_size)
        self.env.env.reader_check()  # drop reader slots of killed processes so their pages free up
        self._db = self.env.db(BLOBS_DB)
        self.on_corrupt = on_corrupt
        self.on_evict = on_evict
        self.cache_events: CacheEvents = NO_EVENTS  # tier 'local' of store.cache_events (a router's index)
        self.clock = clock
        self.access = AccessStats(self.env, clock, stats_flush_s)
        self.checksum_failures = 0
        self.evictions = 0
        self.env.add_reclaimer(self.evict)
        self._streams = LayerStreams(self.env, self._db, self._corrupt, self.access.touch)

    # -- writing -----------------------------------------------------------------------------------
    def put_record(self, key: str, record: RawRecord) -> int:
        """Store an encoded record (:func:`store.blobs.blob_store.encode_record`, or bytes copied from another
        backend) under ``key`` (no ``/``, at most 400 bytes) in one write transaction, evicting the least
        valuable documents for space (:meth:`BlobStore.put` encodes and calls this).

        Raises:
            ValueError: invalid key. StoreFullError: it does not fit after evicting every other document;
                StoreBusyError: a reader older than its eviction holds the space (:meth:`LmdbEnv.write`).
        """
        kraw = check_key(key)
        nbytes = record.meta["nbytes"]
        if nbytes > self.env.max_map_size * 0.9:
            raise StoreFullError(f"document of {nbytes} bytes exceeds the store's max map size")

        def write(txn) -> None:
            self._delete_in(txn, key)
            records.put_record(txn, self._db, key, record)
            self.access.record(txn, kraw, nbytes)

        self.env.write(write, reclaim_bytes=int(nbytes * 1.25) + (1 << 16), what=key)  # evicts (the reclaimer)
        self.access.forget(kraw)
        self.cache_events.stored("local", key, len(record.ids) // 8, nbytes)
        return nbytes

    def delete(self, key: str) -> bool:
        """Remove the record of ``key``; True if it existed."""
        check_key(key)
        existed = self.env.write(lambda txn: self._delete_in(txn, key))
        self.access.forget(key.encode())
        if existed:
            self.cache_events.removed("local", key)
        return existed

    def _delete_in(self, txn, key: str) -> bool:
        existed = records.delete_record(txn, self._db, key)
        self.access.remove(txn, key.encode())
        return existed

    # -- reading -----------------------------------------------------------------------------------
    def get(self, key: str, dtype: torch.dtype | str | None = None) -> DocumentKV | None:
        """The stored document, on CPU, or None when absent or corrupt.

        Args:
            dtype: dtype of the returned keys/values; default the stored dtype (int8 records are
                dequantised to their source dtype).

        A record that fails its checksum is deleted, counted in ``checksum_failures`` and reported to
        ``on_corrupt``; the call then returns None.
        """
        check_key(key)
        try:
            with self.env.read() as txn:
                kv = records.read_document(txn, self._db, key, dtype)
        except CorruptRecordError as e:
            self._corrupt(key, e)
            return None
        if kv is not None:
            self.access.touch(key.encode())
        return kv

    def iter_layers(self, key: str, dtype: torch.dtype | str | None = None
                    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield ``(k, v)`` ``[H, T, D]`` per layer, each read in its own short transaction
        (:meth:`store.blobs.lmdb_streams.LayerStreams.layers`).

        Raises:
            KeyError: ``key`` is absent, or its record was replaced or deleted while iterating.
            CorruptRecordError: a layer failed its checksum (the record is then deleted and reported
                like in :meth:`get`).
        """
        yield from self._streams.layers(key, dtype)

    def iter_stored_layers(self, key: str) -> tuple[torch.Tensor | None, Iterator[LayerFill]]:
        """:meth:`BlobStore.iter_stored_layers`, each layer decoded straight into the caller's buffers in its own
        short transaction (:meth:`store.blobs.lmdb_streams.LayerStreams.stored`).

        Raises:
            KeyError: absent, or replaced while read. CorruptRecordError: a bad order or layer (deleted, reported).
        """
        return self._streams.stored(key)

    def layer_session(self):
        """:meth:`BlobStore.layer_session`: one read transaction for this thread's fills inside it."""
        return self._streams.session()

    def iter_retained_layers(self, key: str, retention: float, dtype: torch.dtype | str | None = None
                             ) -> tuple[torch.Tensor, Iterator[tuple[torch.Tensor, torch.Tensor]]]:
        """:meth:`BlobStore.iter_retained_layers`, reading of an importance-ordered record only the prefix of
        each layer that holds the kept tokens (:meth:`store.blobs.lmdb_streams.LayerStreams.retained`).
        Records without an order read whole layers.

        Raises:
            KeyError: absent, or replaced while read. ValueError: retention outside (0, 1].
            CorruptRecordError: a chunk failed its checksum (the record is deleted and reported).
        """
        found = self._streams.retained(key, retention, dtype)
        return super().iter_retained_layers(key, retention, dtype) if found is None else found

    def get_ids(self, key: str) -> torch.Tensor | None:
        """``[tokens]`` int64 token ids of ``key`` (checksummed), or None when absent.

        Raises:
            CorruptRecordError: the ids failed their checksum (the record is deleted and reported).
        """
        check_key(key)
        try:
            with self.env.read() as txn:
                meta = records.read_meta(txn, self._db, key)
                if meta is None:
                    return None
                return records.read_ids(txn, self._db, key, meta)
        except CorruptRecordError as e:
            self._corrupt(key, e)
            raise

    def meta(self, key: str) -> dict | None:
        """The parsed meta record of ``key`` (no payload check), or None."""
        with self.env.read() as txn:
            buf = txn.get(rkey(key, "meta"), db=self._db)
            return None if buf is None else codec.parse_meta(buf)

    def contains(self, key: str) -> bool:
        """Whether a record for ``key`` exists (payload not verified)."""
        with self.env.read() as txn:
            return txn.get(rkey(key, "meta"), db=self._db) is not None

    def keys(self) -> list[str]:
        """All stored cache keys, sorted."""
        return self.access.keys()

    def entries(self) -> dict[str, dict]:
        """Key -> ``{hits, last_access, created, nbytes}`` from the access stats (buffered reads included)."""
        return self.access.rows()

    def _corrupt(self, key: str, err: Exception) -> None:
        log.warning("corrupt KV record %s (%s); deleting it", key, err)
        self.checksum_failures += 1
        self.env.write(lambda txn: self._delete_in(txn, key))
        self.access.forget(key.encode())
        if self.on_corrupt is not None:
            try:
                self.on_corrupt(key)
            except Exception:  # noqa: BLE001 - a callback must not turn a miss into a failure
                log.exception("on_corrupt callback failed for %s", key)

    # -- eviction --------------------------------------------------------------------------------
    def evict(self, bytes_wanted: int) -> int:
        """Delete the least valuable documents (see :func:`store.blobs.access_stats.eviction_value`) until ``bytes_wanted``
        payload bytes are freed or none is left; one transaction per document.

        Returns:
            payload bytes freed.
        """
        freed = 0
        for key, nbytes in self.access.eviction_order():
            if freed >= bytes_wanted:
                break
            try:
                deleted = self.env.write(lambda txn, k=key: self._delete_in(txn, k), reclaim=False)
            except StoreFullError:
                log.error("LMDB map too full to delete %s", key)
                break
            self.access.forget(key.encode())
            if not deleted:
                continue
            freed += nbytes
            self.evictions += 1
            self.cache_events.removed("local", key)
            if self.on_evict is not None:
                try:
                    self.on_evict(key)
                except Exception:  # noqa: BLE001
                    log.exception("on_evict callback failed for %s", key)
        return freed

    def stats(self) -> dict:
        """Counters and sizes: documents, payload_bytes, map_size, used_bytes, max_map_size (bytes),
        checksum_failures, evictions, map_grows."""
        rows = self.access.rows()
        return {
            "documents": len(rows),
            "payload_bytes": sum(r["nbytes"] for r in rows.values()),
            "map_size": self.env.map_size,
            "used_bytes": self.env.used_bytes,
            "max_map_size": self.env.max_map_size,
            "checksum_failures": self.checksum_failures,
            "evictions": self.evictions,
            "map_grows": self.env.grow_count,
        }

    def used_bytes(self) -> int:
        """Bytes of the LMDB map in use (the whole environment: blobs, texts, embedded index)."""
        return self.env.used_bytes

    def ping(self) -> None:
        """Open and close one read transaction (raises the LMDB error when the store is unreadable)."""
        with self.env.read():
            pass

    def close(self) -> None:
        """Flush access stats (the shared environment stays open; on a full map they are dropped, never a
        stored document evicted for them)."""
        try:
            self.access.flush()
        except StoreFullError as e:
            log.warning("access stats not written back on close: %s", e)
        finally:
            self.env.remove_reclaimer(self.evict)
