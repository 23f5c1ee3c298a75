"""Per-document access statistics of the blob store, and the eviction order they define.

One fixed-size record per stored document in the ``blob_stats`` sub-database (key = cache key)::

    hits (int64), last_access (float64 unix seconds), created (float64 unix seconds), nbytes (int64)

Reads only count hits in memory; the counts are written back at most every ``flush_s`` seconds
(a write transaction per read would fsync on the hot path).
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable

from store.lmdb_env import LmdbEnv, StoreFullError

log = logging.getLogger(__name__)

STATS_DB = b"blob_stats"
_REC = struct.Struct("<qddq")


def eviction_value(hits: int, last_access: float, now: float) -> float:
    """How much a stored document is worth keeping: ``(1 + hits) / (1 + seconds since last access)``."""
    return (1.0 + hits) / (1.0 + max(0.0, now - last_access))


class AccessStats:
    """Hit counts and access times, buffered in memory and persisted in ``env``.

    Args:
        env: the shared environment.
        clock: unix-seconds clock.
        flush_s: seconds between write-backs triggered by :meth:`touch`.
    """

    def __init__(self, env: LmdbEnv, clock: Callable[[], float], flush_s: float = 5.0) -> None:
        self.env = env
        self.db = env.db(STATS_DB)
        self.clock = clock
        self.flush_s = flush_s
        self._pending: dict[bytes, list] = {}  # key -> [hits delta, last access]
        self._lock = threading.Lock()
        self._last_flush = clock()

    def record(self, txn, kraw: bytes, nbytes: int) -> None:
        """Inside a write transaction: a fresh record for a document just written (0 hits)."""
        now = self.clock()
        txn.put(kraw, _REC.pack(0, now, now, nbytes), db=self.db)

    def remove(self, txn, kraw: bytes) -> None:
        """Inside a write transaction: drop the record of a deleted document."""
        txn.delete(kraw, db=self.db)

    def forget(self, kraw: bytes) -> None:
        """Drop buffered hits of a document (call after its record was replaced or deleted)."""
        with self._lock:
            self._pending.pop(kraw, None)

    def touch(self, kraw: bytes) -> None:
        """Count one read of a document; writes back when ``flush_s`` has passed.

        Never raises for a full map: the write-back neither evicts documents for room (bookkeeping is not worth
        a stored document) nor fails the read that counted; the counts stay buffered for the next write-back.
        """
        now = self.clock()
        with self._lock:
            entry = self._pending.setdefault(kraw, [0, now])
            entry[0] += 1
            entry[1] = now
            due = now - self._last_flush >= self.flush_s
        if due:
            try:
                self.flush()
            except StoreFullError as e:
                log.warning("access stats kept in memory, not written back: %s", e)

    def flush(self) -> None:
        """Write buffered hits and access times back (one write transaction, never evicting a document for room).

        Raises:
            StoreFullError: no room (the counts stay buffered).
        """
        with self._lock:
            pending, self._pending = self._pending, {}
            self._last_flush = self.clock()
        if not pending:
            return

        def write(txn) -> None:
            for kraw, (hits, last) in pending.items():
                buf = txn.get(kraw, db=self.db)
                if buf is not None:
                    h, _, created, nbytes = _REC.unpack(bytes(buf))
                    txn.put(kraw, _REC.pack(h + hits, last, created, nbytes), db=self.db)

        try:
            self.env.write(write, reclaim=False)
        except Exception:
            with self._lock:  # keep the counts for the next flush
                for kraw, (hits, last) in pending.items():
                    entry = self._pending.setdefault(kraw, [0, last])
                    entry[0] += hits
                    entry[1] = max(entry[1], last)
            raise

    def keys(self) -> list[str]:
        """Cache keys of all stored documents, sorted."""
        with self.env.read() as txn:
            return [bytes(k).decode() for k, _ in txn.cursor(db=self.db)]

    def rows(self) -> dict[str, dict]:
        """Key -> {hits, last_access, created, nbytes}, buffered reads included."""
        with self.env.read() as txn:
            rows = {bytes(k): _REC.unpack(bytes(v)) for k, v in txn.cursor(db=self.db)}
        with self._lock:
            pending = dict(self._pending)
        out = {}
        for kraw, (hits, last, created, nbytes) in rows.items():
            extra = pending.get(kraw)
            if extra:
                hits, last = hits + extra[0], max(last, extra[1])
            out[kraw.decode()] = {"hits": hits, "last_access": last, "created": created, "nbytes": nbytes}
        return out

    def eviction_order(self) -> list[tuple[str, int]]:
        """``(key, nbytes)`` from least to most valuable: by :func:`eviction_value`, then older
        last access, then key."""
        now = self.clock()
        rows = self.rows()

        def rank(k: str) -> tuple:
            r = rows[k]
            return (eviction_value(r["hits"], r["last_access"], now), r["last_access"], k)

        return [(k, rows[k]["nbytes"]) for k in sorted(rows, key=rank)]
