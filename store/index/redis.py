"""The document index in Redis (redis-py; imported lazily): keys and record hashes as laid out in
:mod:`store.index.redis_records`. Mutations run as ``WATCH``/``MULTI`` transactions on the record's key,
retried on conflict.
"""

from __future__ import annotations

import time
import uuid
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

from store.index.document_index import (DocumentIndex, DocumentRecord, apply_fields, bands, check_id,
                                        check_status, is_corrupt)
from store.index.redis_records import DEFAULT_PREFIX, decode_record, encode_record, glob_escape, q

_MAX_RANGE = 2**63 - 1  # largest index of a Redis range


class RedisIndex(DocumentIndex):
    """:class:`DocumentIndex` on a Redis server.

    Args:
        client: a ``redis.Redis`` created with ``decode_responses=True``.
        prefix: prepended to every key (use a unique one per test run to isolate).
        clock: unix-seconds clock.
    """

    def __init__(self, client, prefix: str = DEFAULT_PREFIX, clock=time.time) -> None:
        super().__init__(clock)
        self.r = client
        self.prefix = prefix

    @classmethod
    def from_url(cls, url: str, prefix: str | None = None, clock=time.time, **client_kwargs: Any) -> RedisIndex:
        """Connect to ``redis://host:port/db[?prefix=...]``; ``prefix=`` overrides the URL's.

        Raises:
            ImportError: the ``redis`` package is not installed.
        """
        import redis

        parts = urlsplit(url)
        query = parse_qs(parts.query)
        url_prefix = query.pop("prefix", [None])[0]
        rest = "&".join(f"{k}={v}" for k, vs in query.items() for v in vs)
        clean = urlunsplit((parts.scheme, parts.netloc, parts.path, rest, parts.fragment))
        client = redis.Redis.from_url(clean, decode_responses=True, **client_kwargs)
        return cls(client, prefix=prefix or url_prefix or DEFAULT_PREFIX, clock=clock)

    # -- key names ---------------------------------------------------------------------------------
    def _doc(self, tenant: str, doc_id: str) -> str:
        return f"{self.prefix}doc:{q(tenant)}:{q(doc_id)}"

    def _docs(self, tenant: str) -> str:
        return f"{self.prefix}docs:{q(tenant)}"

    def _band(self, tenant: str, i: int, v: int) -> str:
        return f"{self.prefix}band:{q(tenant)}:{i}:{v:04x}"

    def _hash(self, tenant: str, content_hash: str) -> str:
        return f"{self.prefix}hash:{q(tenant)}:{content_hash}"

    def _ckey(self, cache_key: str) -> str:
        return f"{self.prefix}ckey:{cache_key}"

    # -- helpers -----------------------------------------------------------------------------------
    def _load(self, conn, tenant: str, doc_id: str) -> DocumentRecord | None:
        h = conn.hgetall(self._doc(tenant, doc_id))
        return self._parse(tenant, doc_id, h) if h else None

    def _parse(self, tenant: str, doc_id: str, h: dict[str, str]) -> DocumentRecord:
        """The record of hash ``h``, or a :class:`CorruptDocumentRecord` (counted) when it is corrupt."""
        try:
            rec = decode_record(h)
            if (rec.tenant, rec.doc_id) != (tenant, doc_id):
                raise ValueError("ids differ from its key")
            return rec
        except ValueError as e:
            return self._corrupt(tenant, doc_id, str(e) if str(e) in ("checksum mismatch", "ids differ from its key")
                                 else f"fields: {type(e).__name__}")
        except (TypeError, KeyError, AttributeError) as e:
            return self._corrupt(tenant, doc_id, f"fields: {type(e).__name__}")

    def _secondary(self, rec: DocumentRecord | None) -> list[tuple[str, str]]:
        """``(set key, member)`` of ``rec``'s secondary entries; a corrupt record's are found by scanning
        (read before ``MULTI``)."""
        if rec is None:
            return []
        member = f"{q(rec.tenant)}:{q(rec.doc_id)}"
        if is_corrupt(rec):
            t = glob_escape(self.prefix)
            tenant = glob_escape(q(rec.tenant))
            keys = [(k, rec.doc_id) for pat in (f"band:{tenant}:*", f"hash:{tenant}:*")
                    for k in self.r.scan_iter(match=t + pat, count=1000)]
            keys += [(k, member) for k in self.r.scan_iter(match=t + "ckey:*", count=1000)]
            pipe = self.r.pipeline(transaction=False)
            for k, m in keys:
                pipe.sismember(k, m)
            return [km for km, yes in zip(keys, pipe.execute(), strict=True) if yes]
        out = [(self._band(rec.tenant, i, v), rec.doc_id) for i, v in bands(rec.simhash)]
        if rec.content_hash:
            out.append((self._hash(rec.tenant, rec.content_hash), rec.doc_id))
        out += [(self._ckey(key), member) for key in rec.cache_keys]
        return out

    def _store(self, pipe, rec: DocumentRecord, stale: list[tuple[str, str]]) -> None:
        for k, m in stale:
            pipe.srem(k, m)
        key = self._doc(rec.tenant, rec.doc_id)
        pipe.delete(key)
        pipe.hset(key, mapping=encode_record(rec))
        pipe.zadd(self._docs(rec.tenant), {rec.doc_id: 0})
        pipe.sadd(f"{self.prefix}tenants", rec.tenant)
        for i, v in bands(rec.simhash):
            pipe.sadd(self._band(rec.tenant, i, v), rec.doc_id)
        if rec.content_hash:
            pipe.sadd(self._hash(rec.tenant, rec.content_hash), rec.doc_id)
        for key in rec.cache_keys:
            pipe.sadd(self._ckey(key), f"{q(rec.tenant)}:{q(rec.doc_id)}")

    def _update(self, tenant: str, doc_id: str, fn):
        """Run ``fn(old) -> (new_record | None, result)`` under WATCH of the record; store and return."""
        key = self._doc(tenant, doc_id)

        def txn(pipe):
            old = self._load(pipe, tenant, doc_id)
            stale = self._secondary(old)
            new, result = fn(old)
            pipe.multi()
            if new is not None:
                self._store(pipe, new, stale)
            return result

        return self.r.transaction(txn, key, value_from_callable=True)

    # -- interface ---------------------------------------------------------------------------------
    def swap(self, record: DocumentRecord) -> tuple[DocumentRecord, DocumentRecord | None]:
        now = self.clock()

        def fn(old):
            created = old.created if old is not None else (record.created or now)
            hits = old.hits if old is not None else record.hits
            rec = apply_fields(record, {"created": created, "updated": now, "hits": hits})
            return rec, (rec, old)

        return self._update(record.tenant, record.doc_id, fn)

    def get(self, tenant: str, doc_id: str) -> DocumentRecord | None:
        return self._load(self.r, tenant, doc_id)

    def pop(self, tenant: str, doc_id: str) -> DocumentRecord | None:
        key = self._doc(tenant, doc_id)

        def txn(pipe):
            old = self._load(pipe, tenant, doc_id)
            stale = self._secondary(old)
            pipe.multi()
            if old is None:
                return None
            for k, m in stale:
                pipe.srem(k, m)
            pipe.delete(key)
            pipe.zrem(self._docs(tenant), doc_id)
            return old

        old = self.r.transaction(txn, key, value_from_callable=True)
        if old is not None and not self.r.zcard(self._docs(tenant)):
            self.r.srem(f"{self.prefix}tenants", tenant)
        return old

    def list(self, tenant: str, offset: int = 0, limit: int = 100) -> list[DocumentRecord]:
        check_id("tenant", tenant)
        if limit <= 0 or offset < 0 or offset >= _MAX_RANGE:  # Redis ranges are signed 64-bit
            return []
        ids = self.r.zrange(self._docs(tenant), offset, min(offset + limit - 1, _MAX_RANGE))
        pipe = self.r.pipeline(transaction=False)
        for d in ids:
            pipe.hgetall(self._doc(tenant, d))
        return [self._parse(tenant, d, h) for d, h in zip(ids, pipe.execute(), strict=True) if h]

    def count(self, tenant: str) -> int:
        return int(self.r.zcard(self._docs(tenant)))

    def tenants(self) -> list[str]:
        return sorted(self.r.smembers(f"{self.prefix}tenants"))

    def set_status(
        self, tenant: str, doc_id: str, status: str, /, version: int | None = None, **fields: Any
    ) -> DocumentRecord | None:
        check_status(status)
        now = self.clock()

        def fn(old):
            if old is None or is_corrupt(old) or (version is not None and old.version != version):
                return None, None
            rec = apply_fields(old, {**fields, "status": status, "updated": now})
            return rec, rec

        return self._update(tenant, doc_id, fn)

    def incr_hits(self, tenant: str, doc_id: str, n: int = 1) -> int | None:
        key = self._doc(tenant, doc_id)

        def txn(pipe):
            exists = pipe.exists(key)
            pipe.multi()
            if exists:
                pipe.hincrby(key, "hits", n)

        import redis

        try:
            res = self.r.transaction(txn, key)
        except redis.exceptions.ResponseError:  # a corrupt hits field: the record reads as corrupt anyway
            return None
        return int(res[0]) if res else None

    def find_by_content_hash(self, tenant: str, content_hash: str) -> list[DocumentRecord]:
        ids = sorted(self.r.smembers(self._hash(tenant, content_hash)))
        recs = (self._load(self.r, tenant, d) for d in ids)
        return [r for r in recs if r is not None and not is_corrupt(r)]

    def find_by_cache_key(self, cache_key: str) -> list[tuple[str, str]]:
        rows = (m.split(":") for m in self.r.smembers(self._ckey(cache_key)))
        return sorted((unquote(t), unquote(d)) for t, d in rows)

    def _simhashes(self, tenant: str, ids) -> dict[str, int]:
        ids = sorted(ids)
        pipe = self.r.pipeline(transaction=False)
        for d in ids:
            pipe.hget(self._doc(tenant, d), "simhash")
        return {d: int(h) for d, h in zip(ids, pipe.execute(), strict=True) if h is not None and h.isdigit()}

    def _band_candidates(self, tenant: str, simhash: int) -> dict[str, int]:
        pipe = self.r.pipeline(transaction=False)
        for i, v in bands(simhash):
            pipe.smembers(self._band(tenant, i, v))
        ids = set().union(*pipe.execute())
        return self._simhashes(tenant, ids)

    def _all_simhashes(self, tenant: str) -> dict[str, int]:
        return self._simhashes(tenant, self.r.zrange(self._docs(tenant), 0, -1))

    def drop_all(self) -> int:
        """Delete every key under this index's prefix (tests, resets); returns the number deleted."""
        n = 0
        pattern = glob_escape(self.prefix) + "*"
        for key in self.r.scan_iter(match=pattern, count=500):
            n += self.r.delete(key)
        return n

    def ping(self, timeout: float = 2.0) -> None:
        """PING over a new connection with ``timeout``-second socket timeouts (this index's own client may
        have none, and a probe must not hang). Raises redis errors when the server is unreachable."""
        import redis

        pool = self.r.connection_pool
        probe = redis.ConnectionPool(connection_class=pool.connection_class, **{
            **pool.connection_kwargs, "socket_timeout": timeout, "socket_connect_timeout": timeout})
        try:
            redis.Redis(connection_pool=probe).ping()
        finally:
            probe.disconnect()

    def mark(self) -> tuple[str, bool]:
        """``(token, created)``: this Redis's index mark, a random token set once (``SET NX``) that only a loss
        of its data removes (a restart without the append-only file, ``FLUSHDB``); a token that changed, or one
        created by this call, means the index may have lost what it held (:mod:`service.index_watch`).

        Raises:
            redis errors: the server is unreachable.
        """
        key = f"{self.prefix}index-mark"
        token = self.r.get(key)
        if token is not None:
            return token, False
        created = bool(self.r.set(key, uuid.uuid4().hex, nx=True))
        return self.r.get(key), created

    def close(self) -> None:
        self.r.close()
