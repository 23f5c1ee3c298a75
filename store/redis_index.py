"""The document index in Redis (redis-py; imported lazily).

Keys, under a configurable ``prefix`` (default ``"kvlink:"``); ``q()`` percent-encodes an id so that
``:`` inside ids cannot collide:

- ``{p}doc:{q(tenant)}:{q(doc_id)}``            hash of the record's fields (metadata as JSON)
- ``{p}docs:{q(tenant)}``                       sorted set of doc_ids, all score 0 (lexical order)
- ``{p}band:{q(tenant)}:{band}:{value:04x}``    set of doc_ids
- ``{p}hash:{q(tenant)}:{content_hash}``        set of doc_ids
- ``{p}ckey:{cache_key}``                       set of ``"{q(tenant)}:{q(doc_id)}"``
- ``{p}tenants``                                set of tenants

Mutations run as ``WATCH``/``MULTI`` transactions on the record's key, retried on conflict.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit, urlunsplit

from store.index import DocumentIndex, DocumentRecord, apply_fields, bands, check_id, check_status

DEFAULT_PREFIX = "kvlink:"
_INT_FIELDS = ("simhash", "num_tokens", "nbytes", "version", "hits")
_FLOAT_FIELDS = ("created", "updated")


def q(part: str) -> str:
    """Percent-encode an id for use inside a key (no ``:`` survives)."""
    return quote(part, safe="")


def _encode(rec: DocumentRecord) -> dict[str, str]:
    d = rec.to_dict()
    d["metadata"] = json.dumps(d["metadata"])
    return {k: str(v) for k, v in d.items()}


def _decode(h: dict[str, str]) -> DocumentRecord:
    d: dict[str, Any] = dict(h)
    for k in _INT_FIELDS:
        d[k] = int(d[k])
    for k in _FLOAT_FIELDS:
        d[k] = float(d[k])
    d["metadata"] = json.loads(d.get("metadata") or "{}")
    return DocumentRecord.from_dict(d)


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
        return _decode(h) if h else None

    def _unlink(self, pipe, rec: DocumentRecord) -> None:
        for i, v in bands(rec.simhash):
            pipe.srem(self._band(rec.tenant, i, v), rec.doc_id)
        if rec.content_hash:
            pipe.srem(self._hash(rec.tenant, rec.content_hash), rec.doc_id)
        if rec.cache_key:
            pipe.srem(self._ckey(rec.cache_key), f"{q(rec.tenant)}:{q(rec.doc_id)}")

    def _store(self, pipe, rec: DocumentRecord, old: DocumentRecord | None) -> None:
        if old is not None:
            self._unlink(pipe, old)
        key = self._doc(rec.tenant, rec.doc_id)
        pipe.delete(key)
        pipe.hset(key, mapping=_encode(rec))
        pipe.zadd(self._docs(rec.tenant), {rec.doc_id: 0})
        pipe.sadd(f"{self.prefix}tenants", rec.tenant)
        for i, v in bands(rec.simhash):
            pipe.sadd(self._band(rec.tenant, i, v), rec.doc_id)
        if rec.content_hash:
            pipe.sadd(self._hash(rec.tenant, rec.content_hash), rec.doc_id)
        if rec.cache_key:
            pipe.sadd(self._ckey(rec.cache_key), f"{q(rec.tenant)}:{q(rec.doc_id)}")

    def _update(self, tenant: str, doc_id: str, fn):
        """Run ``fn(old) -> (new_record | None, result)`` under WATCH of the record; store and return."""
        key = self._doc(tenant, doc_id)

        def txn(pipe):
            old = self._load(pipe, tenant, doc_id)
            new, result = fn(old)
            pipe.multi()
            if new is not None:
                self._store(pipe, new, old)
            return result

        return self.r.transaction(txn, key, value_from_callable=True)

    # -- interface ---------------------------------------------------------------------------------
    def upsert(self, record: DocumentRecord) -> DocumentRecord:
        now = self.clock()

        def fn(old):
            created = old.created if old is not None else (record.created or now)
            hits = old.hits if old is not None else record.hits
            rec = apply_fields(record, {"created": created, "updated": now, "hits": hits})
            return rec, rec

        return self._update(record.tenant, record.doc_id, fn)

    def get(self, tenant: str, doc_id: str) -> DocumentRecord | None:
        return self._load(self.r, tenant, doc_id)

    def delete(self, tenant: str, doc_id: str) -> bool:
        key = self._doc(tenant, doc_id)

        def txn(pipe):
            old = self._load(pipe, tenant, doc_id)
            pipe.multi()
            if old is None:
                return False
            self._unlink(pipe, old)
            pipe.delete(key)
            pipe.zrem(self._docs(tenant), doc_id)
            return True

        existed = self.r.transaction(txn, key, value_from_callable=True)
        if existed and not self.r.zcard(self._docs(tenant)):
            self.r.srem(f"{self.prefix}tenants", tenant)
        return existed

    def list(self, tenant: str, offset: int = 0, limit: int = 100) -> list[DocumentRecord]:
        check_id("tenant", tenant)
        if limit <= 0:
            return []
        ids = self.r.zrange(self._docs(tenant), offset, offset + limit - 1)
        pipe = self.r.pipeline(transaction=False)
        for d in ids:
            pipe.hgetall(self._doc(tenant, d))
        return [_decode(h) for h in pipe.execute() if h]

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
            if old is None or (version is not None and old.version != version):
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

        res = self.r.transaction(txn, key)
        return int(res[0]) if res else None

    def find_by_content_hash(self, tenant: str, content_hash: str) -> list[DocumentRecord]:
        ids = sorted(self.r.smembers(self._hash(tenant, content_hash)))
        recs = (self._load(self.r, tenant, d) for d in ids)
        return [r for r in recs if r is not None]

    def find_by_cache_key(self, cache_key: str) -> list[tuple[str, str]]:
        rows = (m.split(":") for m in self.r.smembers(self._ckey(cache_key)))
        return sorted((unquote(t), unquote(d)) for t, d in rows)

    def _simhashes(self, tenant: str, ids) -> dict[str, int]:
        ids = sorted(ids)
        pipe = self.r.pipeline(transaction=False)
        for d in ids:
            pipe.hget(self._doc(tenant, d), "simhash")
        return {d: int(h) for d, h in zip(ids, pipe.execute(), strict=True) if h is not None}

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
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in self.prefix) + "*"
        for key in self.r.scan_iter(match=pattern, count=500):
            n += self.r.delete(key)
        return n

    def close(self) -> None:
        self.r.close()
