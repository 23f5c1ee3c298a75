"""The LMDB :class:`~store.blobs.blob_store.BlobStore`: document KV caches, readable layer by layer,
checksummed, self-evicting (``lmdb://PATH``).

Records live in the ``blobs`` sub-database of one :class:`~store.lmdb_env.LmdbEnv` (shared with the
embedded index), under the cache key (see :func:`store.keys.cache_key`)::

    <key>/meta   JSON: format_version, dtype, source_dtype, key_axis, shape [L, H, T, D], fingerprint,
                 encoding, num_tokens, nbytes, checksum {ids, layers[L]} (xxh3_64 hex; xxh64 in version-1 records), created
    <key>/ids    int64 little-endian token ids, T * 8 bytes
    <key>/L{l}   safetensors bytes of layer l (see :mod:`store.records.codec`); a document stored with importance
                 scores has its tokens in retention order, token-major, with per-tenth chunk checksums in
                 the meta (``token_order``, ``checksum.chunks``; :mod:`store.records.ordered_layout`), so a read at
                 retention r touches only the first ~r of each layer's bytes

A small access-stats record per document (``blob_stats`` sub-database: hits, last access, bytes,
created) ranks documents for eviction when the map cannot grow past ``max_map_size``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator

import torch

from kvlink_rag.types import DocumentKV
from store.records import codec, ordered_layout
from store.records.layer_decode import decode_layer_into, decode_layers_into
from store.blobs.access_stats import AccessStats
from store.blobs.blob_store import BlobStore, RawRecord, encode_record
from store.tiers.events import NO_EVENTS, CacheEvents
from store.records.errors import CorruptRecordError
from store.lmdb_env import DEFAULT_MAP_SIZE, DEFAULT_MAX_MAP_SIZE, LmdbEnv, StoreFullError, open_env

log = logging.getLogger(__name__)

BLOBS_DB = b"blobs"
_MAX_KEY_BYTES = 400


def _rkey(key: str, part: str) -> bytes:
    return f"{key}/{part}".encode()


def _check_key(key: str) -> bytes:
    raw = key.encode()
    if not key or "/" in key or len(raw) > _MAX_KEY_BYTES:
        raise ValueError(f"invalid cache key {key!r}: non-empty, no '/', at most {_MAX_KEY_BYTES} bytes")
    return raw


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

    def __init__(
        self,
        location: str | os.PathLike | LmdbEnv,
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        max_map_size: int = DEFAULT_MAX_MAP_SIZE,
        on_corrupt: Callable[[str], None] | None = None,
        on_evict: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
        stats_flush_s: float = 5.0,
    ) -> None:
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
        self.cache_events: CacheEvents = NO_EVENTS  # tier 'local' of store.tiers.events (a router's index)
        self.clock = clock
        self.access = AccessStats(self.env, clock, stats_flush_s)
        self.checksum_failures = 0
        self.evictions = 0
        self.env.add_reclaimer(self.evict)

    # -- writing -----------------------------------------------------------------------------------
    def put(self, key: str, kv: DocumentKV, int8: bool = False, tracked: bool = True) -> int:
        """Store ``kv`` under ``key`` in one write transaction (replacing any earlier record).

        Args:
            key: cache key (no ``/``, at most 400 bytes).
            kv: the document; keys/values ``[L, H, T, D]`` float32/bfloat16/float16.
            int8: store int8 (keys per channel, values per token) instead of ``kv.dtype``.
            tracked: a document record will point at it (False: an ad-hoc cache, see
                :func:`store.records.codec.build_meta`).

        Returns:
            payload bytes written.

        Raises:
            ValueError: invalid key or document.
            StoreFullError: the document does not fit even after evicting every other document.
        """
        return self.put_record(key, encode_record(kv, int8, tracked))

    def put_record(self, key: str, record: RawRecord) -> int:
        """Store an encoded record (:func:`store.blobs.blob_store.encode_record`, or bytes copied from another
        backend) under ``key`` in one write transaction, evicting others for space as :meth:`put` does.

        Raises:
            ValueError: invalid key. StoreFullError: it does not fit even after evicting every other document.
        """
        kraw = _check_key(key)
        nbytes = record.meta["nbytes"]
        if nbytes > self.env.max_map_size * 0.9:
            raise StoreFullError(f"document of {nbytes} bytes exceeds the store's max map size")
        meta_bytes = json.dumps(record.meta).encode()

        def write(txn) -> None:
            self._delete_in(txn, key)
            txn.put(_rkey(key, "meta"), meta_bytes, db=self._db)
            txn.put(_rkey(key, "ids"), record.ids, db=self._db)
            for i, payload in enumerate(record.layers):
                txn.put(_rkey(key, f"L{i}"), payload, db=self._db)
            self.access.record(txn, kraw, nbytes)

        while True:
            try:
                self.env.write(write, reclaim=False)
                self.access.forget(kraw)
                self.cache_events.stored("local", key, len(record.ids) // 8, nbytes)
                return nbytes
            except StoreFullError:
                self.env.env.reader_check()
                if self.evict(int(nbytes * 1.25) + (1 << 16)) <= 0:
                    raise
                self.env.settle()

    def delete(self, key: str) -> bool:
        """Remove the record of ``key``; True if it existed."""
        _check_key(key)
        existed = self.env.write(lambda txn: self._delete_in(txn, key))
        self.access.forget(key.encode())
        if existed:
            self.cache_events.removed("local", key)
        return existed

    def _delete_in(self, txn, key: str) -> bool:
        meta_buf = txn.get(_rkey(key, "meta"), db=self._db)
        existed = meta_buf is not None
        n_layers = 0
        if existed:
            try:
                n_layers = codec.parse_meta(meta_buf)["shape"][0]
            except CorruptRecordError:
                n_layers = 0
        txn.delete(_rkey(key, "meta"), db=self._db)
        txn.delete(_rkey(key, "ids"), db=self._db)
        for i in range(n_layers):
            txn.delete(_rkey(key, f"L{i}"), db=self._db)
        if not n_layers:  # meta unreadable or absent: sweep every layer record by prefix
            cur = txn.cursor(db=self._db)
            prefix = _rkey(key, "L")
            while cur.set_range(prefix) and bytes(cur.key()).startswith(prefix):
                cur.delete()
                existed = True
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
        _check_key(key)
        try:
            with self.env.read() as txn:
                meta = self._meta_in(txn, key)
                if meta is None:
                    return None
                L, H, T, D = meta["shape"]
                ids = codec.decode_ids(txn.get(_rkey(key, "ids"), db=self._db), meta)
                out_dtype = codec.target_dtype(meta, dtype)
                keys = torch.empty((L, H, T, D), dtype=out_dtype)
                values = torch.empty((L, H, T, D), dtype=out_dtype)
                decode_layers_into((txn.get(_rkey(key, f"L{i}"), db=self._db) for i in range(L)), meta,
                                         keys, values)
        except CorruptRecordError as e:
            self._corrupt(key, e)
            return None
        self.access.touch(key.encode())
        return DocumentKV(
            keys=keys, values=values, token_ids=ids, fingerprint=meta["fingerprint"], encoding=meta["encoding"],
            importance=ordered_layout.record_importance(meta),
        )

    def iter_layers(
        self, key: str, dtype: torch.dtype | str | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield ``(k, v)`` ``[H, T, D]`` per layer, each read in its own short transaction.

        Raises:
            KeyError: ``key`` is absent, or its record was replaced or deleted while iterating.
            CorruptRecordError: a layer failed its checksum (the record is then deleted and reported
                like in :meth:`get`).
        """
        meta_bytes, meta = self._stored_meta(key)
        L, H, T, D = meta["shape"]
        out_dtype = codec.target_dtype(meta, dtype)
        for i in range(L):
            k = torch.empty((H, T, D), dtype=out_dtype)
            v = torch.empty((H, T, D), dtype=out_dtype)
            try:
                with self.env.read() as txn:
                    now_meta = txn.get(_rkey(key, "meta"), db=self._db)
                    if now_meta is None or bytes(now_meta) != meta_bytes:
                        raise KeyError(f"{key} changed while its layers were read")
                    decode_layer_into(txn.get(_rkey(key, f"L{i}"), db=self._db), meta, i, k, v)
            except CorruptRecordError as e:
                self._corrupt(key, e)
                raise
            yield k, v
        self.access.touch(key.encode())

    def _stored_meta(self, key: str) -> tuple[bytes, dict]:
        """The raw and parsed meta record of ``key``.

        Raises:
            KeyError: absent. CorruptRecordError: unparsable (the record is deleted and reported).
        """
        _check_key(key)
        with self.env.read() as txn:
            buf = txn.get(_rkey(key, "meta"), db=self._db)
            meta_bytes = None if buf is None else bytes(buf)
        if meta_bytes is None:
            raise KeyError(key)
        try:
            return meta_bytes, codec.parse_meta(meta_bytes)
        except CorruptRecordError as e:
            self._corrupt(key, e)
            raise

    def iter_retained_layers(self, key: str, retention: float, dtype: torch.dtype | str | None = None
                             ) -> tuple[torch.Tensor, Iterator[tuple[torch.Tensor, torch.Tensor]]]:
        """:meth:`BlobStore.iter_retained_layers`, reading of an importance-ordered record only the prefix of
        each layer that holds the kept tokens (the bytes read scale with ``retention``; the chunks read are
        verified against their checksums). Records without an order read whole layers.

        Raises:
            KeyError: absent, or replaced while read. ValueError: retention outside (0, 1].
            CorruptRecordError: a chunk failed its checksum (the record is deleted and reported).
        """
        meta_bytes, meta = self._stored_meta(key)
        if "token_order" not in meta:
            return super().iter_retained_layers(key, retention, dtype)
        try:
            pos = ordered_layout.retained_positions(meta, retention)
        except CorruptRecordError as e:
            self._corrupt(key, e)
            raise
        return pos, self._prefix_layers(key, meta_bytes, meta, retention, codec.target_dtype(meta, dtype))

    def _prefix_layers(self, key: str, meta_bytes: bytes, meta: dict, retention: float,
                       dtype: torch.dtype) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(k, v)`` ``[H, kept, D]`` per layer from prefixes of the ordered layer records (one short read
        transaction each; the memoryview is touched only where the prefix lies)."""
        order = ordered_layout.token_order(meta)  # checked once per document (by iter_retained_layers)
        for i in range(meta["shape"][0]):
            try:
                with self.env.read() as txn:
                    now_meta = txn.get(_rkey(key, "meta"), db=self._db)
                    if now_meta is None or bytes(now_meta) != meta_bytes:
                        raise KeyError(f"{key} changed while its layers were read")
                    buf = txn.get(_rkey(key, f"L{i}"), db=self._db)
                    if buf is None:
                        raise CorruptRecordError(f"layer {i} is missing")
                    k, v = ordered_layout.decode_ordered_prefix(buf, meta, i, retention, dtype, order)
            except CorruptRecordError as e:
                self._corrupt(key, e)
                raise
            yield k, v
        self.access.touch(key.encode())

    def _meta_in(self, txn, key: str) -> dict | None:
        """Parsed meta of ``key`` inside ``txn``; None when absent or written by a newer format version.

        Raises:
            CorruptRecordError: the meta record cannot be parsed.
        """
        buf = txn.get(_rkey(key, "meta"), db=self._db)
        if buf is None:
            return None
        meta = codec.parse_meta(buf)
        return None if meta["format_version"] > codec.FORMAT_VERSION else meta  # newer release: leave it

    def get_ids(self, key: str) -> torch.Tensor | None:
        """``[tokens]`` int64 token ids of ``key`` (checksummed), or None when absent.

        Raises:
            CorruptRecordError: the ids failed their checksum (the record is deleted and reported).
        """
        _check_key(key)
        try:
            with self.env.read() as txn:
                meta = self._meta_in(txn, key)
                if meta is None:
                    return None
                return codec.decode_ids(txn.get(_rkey(key, "ids"), db=self._db), meta)
        except CorruptRecordError as e:
            self._corrupt(key, e)
            raise

    def meta(self, key: str) -> dict | None:
        """The parsed meta record of ``key`` (no payload check), or None."""
        with self.env.read() as txn:
            buf = txn.get(_rkey(key, "meta"), db=self._db)
            return None if buf is None else codec.parse_meta(buf)

    def contains(self, key: str) -> bool:
        """Whether a record for ``key`` exists (payload not verified)."""
        with self.env.read() as txn:
            return txn.get(_rkey(key, "meta"), db=self._db) is not None

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
        """Flush access stats (the shared environment stays open)."""
        self.access.flush()
        self.env.remove_reclaimer(self.evict)
