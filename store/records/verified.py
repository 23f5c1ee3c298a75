"""Layer payloads of memory-mapped records this process has already verified, so a hot document read again from
LMDB's page cache is not hashed again (the checksum cost ~0.4 of a memcpy of the bytes on every query's load).

A layer is remembered by its cache key, layer, expected checksum and where its bytes lie in the memory map
(address and length of the read's buffer). LMDB never changes a committed page in place (copy-on-write): a
record written again lands on other pages or on freed pages that now hold the new bytes, and a remembered
place is trusted only for the same key, layer and expected checksum, so a rewrite with other contents is
hashed anew. What this does not cover is a page of the file corrupted on disk after it was verified and read
back from disk later in the same process; ``kvlink-rag store check`` verifies every record, and every process
verifies each layer on its first read. Only the LMDB backend uses it (Redis hands out fresh bytes per read).
"""

from __future__ import annotations

import threading

import numpy as np

LIMIT = 1 << 18  # places remembered; past it the set starts again (~20 MB of hashes and plan references at most)


class VerifiedLayers:
    """A bounded, thread-safe set of verified layer places (:meth:`token`), kept as the tokens' 64-bit hashes (two
    places sharing one among at most :data:`LIMIT` has a chance of ~2e-9, and a wrong trust needs that place to
    hold corrupt bytes besides), each with what its reader parsed of it (:meth:`plan`: where its rows lie), so a
    layer read again is neither hashed nor parsed again."""

    def __init__(self, limit: int = LIMIT) -> None:
        self._seen: dict[int, object] = {}
        self._limit = limit
        self._lock = threading.Lock()

    @staticmethod
    def token(key: str, layer: int, buf, expected: str) -> tuple:
        """The place of layer ``layer`` of ``key`` whose buffer ``buf`` (a memoryview into the memory map, or a flat
        uint8 array over one) is read now, with the checksum its meta expects."""
        raw = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
        return key, layer, expected, raw.__array_interface__["data"][0], raw.nbytes

    def __contains__(self, token: tuple | None) -> bool:
        return token is not None and hash(token) in self._seen

    def plan(self, token: tuple | None):
        """What was remembered with the verified place ``token`` (:meth:`add`), or None (not verified, or nothing)."""
        return None if token is None else self._seen.get(hash(token))

    def add(self, token: tuple | None, plan: object = None) -> None:
        """Remember a place whose bytes matched their checksum (None: nothing to remember), with ``plan``: what the
        reader parsed of it, handed back by :meth:`plan` while the place is remembered."""
        if token is None:
            return
        with self._lock:
            if len(self._seen) >= self._limit:
                self._seen.clear()
            self._seen[hash(token)] = plan

    def clear(self) -> None:
        """Forget every place (tests; a store that wants every read verified again)."""
        with self._lock:
            self._seen.clear()


VERIFIED = VerifiedLayers()
