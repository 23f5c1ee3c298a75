"""Reading a record of the Redis blob store (:class:`store.blobs.redis.RedisBlobStore`): its meta, then its chunks
in pipelined batches (:mod:`store.blobs.redis_layout`), and what makes a read a miss. A meta written by a newer
format or layout is a miss left alone (``newer_format``); a chunk that is gone (evicted under ``maxmemory``,
expired) makes the record a miss and deletes it unless it was replaced meanwhile (``missing``); a record that fails
its checksum is deleted (``corrupt``, ``checksum_failures``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator

from store.blobs.redis_health import TierClient
from store.blobs.redis_layout import ChunkedLayout, MissingChunk
from store.records import codec
from store.records.errors import CorruptRecordError

log = logging.getLogger(__name__)


class RecordReads:
    """The reads of one Redis store's records (not guarded: the store's methods pass the circuit breakers).

    Args:
        client: the store's client (:class:`store.blobs.redis_health.TierClient`).
        layout: the store's key names and chunked I/O.
        delete: deletes a record by cache key (the store's ``delete``).
    Attributes:
        counters: ``missing`` (a chunk was gone), ``corrupt`` (checksum), ``newer_format`` (left alone).
        checksum_failures: records that failed their checksum and were deleted.
    """

    def __init__(self, client: TierClient, layout: ChunkedLayout, delete: Callable[[str], bool]) -> None:
        self.client, self.layout, self._delete = client, layout, delete
        self.counters: Counter[str] = Counter()
        self.checksum_failures = 0

    def meta(self, key: str) -> dict | None:
        """The parsed meta of ``key``; None when absent or written by a newer format or layout.

        Raises:
            CorruptRecordError: unparsable meta.
        """
        raw = self.client.r.get(self.layout.key(key, "meta"))
        if raw is None:
            return None
        meta = codec.parse_meta(raw)
        if not self.layout.readable(meta, codec.FORMAT_VERSION):
            self.counters["newer_format"] += 1
            return None  # written by a newer release: a miss here, left alone
        return meta

    def fetch(self, key: str, meta: dict, parts: list[tuple[str, int]]) -> list[bytes]:
        """:meth:`ChunkedLayout.fetch`; a missing chunk deletes the record (unless it was replaced meanwhile).

        Raises:
            KeyError: a chunk is gone.
        """
        try:
            return self.layout.fetch(self.client.r, key, meta, parts)
        except MissingChunk:
            self._gone(key, meta["redis"]["gen"])
            raise

    def _gone(self, key: str, gen: str) -> None:
        """A chunk of generation ``gen`` is missing: delete the record if it is still that generation."""
        if self.layout.generation(self.client.r.get(self.layout.key(key, "meta"))) in (gen, ""):
            self.counters["missing"] += 1
            log.warning("shared KV record %s lost a chunk (evicted or expired); deleting it", key[:24])
            self._delete(key)

    def _layer_bytes(self, key: str, meta: dict) -> Iterator[bytes]:
        counts = meta["redis"]["chunks"]
        for batch in self.layout.batches(meta):
            yield from self.fetch(key, meta, [(f"L{i}", counts[i + 1]) for i in batch])

    def open(self, key: str) -> tuple[dict, bytes, Iterator[bytes]] | None:
        """``(meta, ids bytes, layer payloads as they arrive)`` or None when absent, unreadable (deleted) or
        newer; the payloads are not verified, and the iterator's Redis calls pass the key's breaker."""
        try:
            meta = self.meta(key)
        except CorruptRecordError as e:
            self.corrupt(key, e)
            return None
        if meta is None:
            return None
        try:
            ids = self.fetch(key, meta, [("ids", meta["redis"]["chunks"][0])])[0]
        except KeyError:
            return None
        return meta, ids, self.client.guarded_stream(self._layer_bytes(key, meta), self.layout.key(key, "meta"))

    def corrupt(self, key: str, err: Exception) -> None:
        """``key``'s record failed its checksum or could not be parsed: count it and delete it."""
        log.warning("corrupt shared KV record %s (%s); deleting it", key[:24], err)
        self.checksum_failures += 1
        self.counters["corrupt"] += 1
        self._delete(key)
