"""Where a record's bytes go in Redis: key names, values split into chunks, pipelined writes and reads of one
generation (the layout of :class:`store.blobs.redis.RedisBlobStore`; see its module docstring).

Keys, under ``prefix``; the cache key is a hash tag (``{...}``) so a document's keys share one Cluster slot::

    {p}kv:{<cache key>}:meta              JSON: the codec meta + "redis": {"layout", "gen", "chunks": [ids, L0..]}
    {p}kv:{<cache key>}:<gen>:ids:<c>     chunk c of the token ids
    {p}kv:{<cache key>}:<gen>:L<l>:<c>    chunk c of layer l's payload
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterator

log = logging.getLogger(__name__)
LAYOUT = 1


class MissingChunk(KeyError):
    """A chunk of the generation being read is gone (evicted, expired, or the record was replaced)."""


class ChunkedLayout:
    """Key names and chunked, pipelined I/O of records under ``prefix``.

    Args:
        prefix: prepended to every key (no braces).
        chunk_bytes: largest value written (bytes); keep under the server's ``proto-max-bulk-len``.
        batch_bytes: payload bytes per pipelined round trip.
        pending_ms: expiry of a generation's chunks until its meta is committed (milliseconds).
    Raises:
        ValueError: braces in the prefix, or a size below 1.
    """

    def __init__(self, prefix: str, chunk_bytes: int, batch_bytes: int, pending_ms: int) -> None:
        if "{" in prefix or "}" in prefix or min(chunk_bytes, batch_bytes, pending_ms) < 1:
            raise ValueError("prefix without braces; chunk_bytes, batch_bytes, pending_ttl_s >= 1")
        self.prefix, self.chunk_bytes, self.batch_bytes, self.pending_ms = prefix, chunk_bytes, batch_bytes, pending_ms

    def key(self, key: str, part: str) -> str:
        """The Redis key of ``part`` (``meta``, or ``<gen>:<part>:<chunk>``) of cache key ``key``."""
        return f"{self.prefix}kv:{{{key}}}:{part}"

    @staticmethod
    def readable(meta: dict, format_version: int) -> bool:
        """Whether a parsed meta record is of this layout and at most ``format_version`` (False: a newer
        release wrote it).

        Raises:
            store.records.codec.CorruptRecordError: the chunk layout is missing or does not fit the shape.
        """
        from store.records.errors import CorruptRecordError

        layout = meta.get("redis") if isinstance(meta.get("redis"), dict) else None
        if layout is None or not isinstance(layout.get("chunks"), list) or len(layout["chunks"]) != meta["shape"][0] + 1:
            raise CorruptRecordError("meta record without its chunk layout")
        return meta["format_version"] <= format_version and layout.get("layout") == LAYOUT

    @staticmethod
    def generation(meta_bytes: bytes | None) -> str | None:
        """The generation a stored meta record points at; None when absent, "" when unreadable."""
        if meta_bytes is None:
            return None
        try:
            return str(json.loads(meta_bytes)["redis"]["gen"])
        except (ValueError, KeyError, TypeError):
            return ""

    def meta_pattern(self) -> str:
        """SCAN pattern of every meta key."""
        return f"{self.prefix}kv:{{*}}:meta"

    def cache_key_of(self, meta_key: bytes) -> str:
        """The cache key inside a meta key."""
        return meta_key.decode()[len(self.prefix) + 4:-len("}:meta")]

    def chunk_keys(self, key: str, gen: str, part: str, n: int) -> list[str]:
        return [self.key(key, f"{gen}:{part}:{c}") for c in range(n)]

    def all_chunk_keys(self, key: str, meta: dict) -> list[str]:
        """Every chunk key of the generation ``meta`` describes."""
        gen, counts = meta["redis"]["gen"], meta["redis"]["chunks"]
        parts = ["ids"] + [f"L{i}" for i in range(len(counts) - 1)]
        return [k for part, n in zip(parts, counts) for k in self.chunk_keys(key, gen, part, n)]

    def write_chunks(self, r, key: str, parts: list[tuple[str, memoryview]]) -> tuple[dict, list[str]]:
        """Write ``parts`` (``[(part name, payload)]``) as chunks of a fresh generation, pipelined in batches,
        each expiring after ``pending_ms``; ``({"layout", "gen", "chunks"}, keys written)``. On an error the
        keys written so far are deleted (best effort) and the error raised."""
        gen, counts, written = secrets.token_hex(6), [], []
        pipe, pending = r.pipeline(transaction=False), 0
        try:
            for part, buf in parts:
                n = max(1, -(-len(buf) // self.chunk_bytes))
                counts.append(n)
                for c, ck in enumerate(self.chunk_keys(key, gen, part, n)):
                    pipe.set(ck, buf[c * self.chunk_bytes:(c + 1) * self.chunk_bytes], px=self.pending_ms)
                    written.append(ck)
                    pending += min(self.chunk_bytes, len(buf))
                    if pending >= self.batch_bytes:
                        pipe.execute()
                        pending = 0
            pipe.execute()
        except Exception:
            try:  # best effort: what is left expires after pending_ms anyway
                self.delete_keys(r, written)
            except Exception:  # noqa: BLE001 - the first error is the one to report
                pass
            raise
        return {"layout": LAYOUT, "gen": gen, "chunks": counts}, written

    def commit(self, r, key: str, meta: dict, written: list[str]) -> bytes | None:
        """Swap in ``meta`` (``SET ... GET``: readers see the old record or the new one), clear the expiry of
        ``written``; the meta it replaced."""
        old = r.set(self.key(key, "meta"), json.dumps(meta).encode(), get=True)
        pipe = r.pipeline(transaction=False)
        for k in written:
            pipe.persist(k)
        pipe.execute()
        return old

    @staticmethod
    def delete_keys(r, keys: list[str]) -> None:
        if keys:
            pipe = r.pipeline(transaction=False)
            for k in keys:
                pipe.delete(k)
            pipe.execute()

    def drop(self, r, key: str, meta_bytes: bytes | None) -> bool:
        """Delete the chunks of the generation whose meta was ``meta_bytes``; True if there was one."""
        if meta_bytes is None:
            return False
        try:
            self.delete_keys(r, self.all_chunk_keys(key, json.loads(meta_bytes)))
        except (ValueError, KeyError, TypeError):  # unreadable meta: its chunks are evicted in time
            log.warning("replaced an unreadable meta record of %s", key[:24])
        return True

    def fetch(self, r, key: str, meta: dict, parts: list[tuple[str, int]]) -> list[bytes]:
        """The payloads of ``parts`` (``[(part name, chunk count)]``) in one pipelined round trip.

        Raises:
            MissingChunk: a chunk is gone.
        """
        pipe = r.pipeline(transaction=False)
        for part, n in parts:
            for ck in self.chunk_keys(key, meta["redis"]["gen"], part, n):
                pipe.get(ck)
        got, out = pipe.execute(), []
        for part, n in parts:
            chunks, got = got[:n], got[n:]
            if any(c is None for c in chunks):
                raise MissingChunk(f"{key}: {part} is no longer stored")
            out.append(chunks[0] if n == 1 else b"".join(chunks))
        return out

    def batches(self, meta: dict) -> Iterator[list[int]]:
        """Layer numbers grouped into round trips of about ``batch_bytes`` (at least one layer each)."""
        counts = meta["redis"]["chunks"][1:]
        batch, size = [], 0
        for i, n in enumerate(counts):
            batch.append(i)
            size += n * self.chunk_bytes if n > 1 else meta["nbytes"] // max(1, len(counts))
            if size >= self.batch_bytes:
                yield batch
                batch, size = [], 0
        if batch:
            yield batch
