"""Document texts in Redis (:class:`~store.texts.Texts`), beside a Redis index, so that a host with an empty
``KVLINK_RAG_HOME`` reads every tenant's texts (and a persistent Redis keeps them: append-only file).

With a ``local`` :class:`~store.texts.TextStore`, every text this host writes or reads is mirrored on its
disk, and a read while Redis is unreachable answers from that copy (queries that name documents keep
working through a Redis outage, as with the embedded texts); a text this host never saw raises the Redis
error (503), never a 404. The mirror is the version this host last read: an update made elsewhere and not
read here before the outage is seen when Redis is back. Redis decides while it answers (a text it does not
hold is absent, whatever the mirror has); deletes through this host remove the mirrored copy too. A Redis
that comes back empty is refilled from the mirror when the store opens (:meth:`seed_from_local`), so the
index can be rebuilt from the texts as before (a document deleted on another host and never read as
deleted here may come back then: the lesser loss).

Keys, under the index's ``prefix`` (default ``kvlink:``); ids percent-encoded as in :mod:`store.index.redis`:

- ``{p}text:{q(tenant)}:{q(doc_id)}``   the sealed value (:func:`store.integrity.seal`: checksum + JSON)
- ``{p}texts``                           sorted set of ``tenant \\0 doc_id`` (all score 0, lexical order)
"""

from __future__ import annotations

from collections.abc import Iterator

from store.redis_conn import connect, split_url
from store.index.redis_records import DEFAULT_PREFIX, q
from store.texts import Texts, TextStore

_PAGE = 256


class RedisTextStore(Texts):
    """:class:`Texts` on a Redis server.

    Args:
        client: a ``redis.Redis`` with ``decode_responses=False``.
        prefix: prepended to every key.
    """

    def __init__(self, client, prefix: str = DEFAULT_PREFIX, local: TextStore | None = None) -> None:
        import redis

        self.r, self.prefix, self.local = client, prefix, local
        self.corrupt_reads = 0
        self._down = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)

    @classmethod
    def from_url(cls, url: str, local: TextStore | None = None) -> RedisTextStore:
        """The texts beside the index of ``redis://host:port/db[?prefix=...]`` (same prefix), mirrored in
        ``local`` when given; connects lazily."""
        clean, own = split_url(url)
        return cls(connect(clean), prefix=own.get("prefix") or DEFAULT_PREFIX, local=local)

    def _key(self, tenant: str, doc_id: str) -> str:
        return f"{self.prefix}text:{q(tenant)}:{q(doc_id)}"

    @property
    def _set(self) -> str:
        return f"{self.prefix}texts"

    def _put_raw(self, tenant: str, doc_id: str, value: bytes) -> None:
        pipe = self.r.pipeline(transaction=True)
        pipe.set(self._key(tenant, doc_id), value)
        pipe.zadd(self._set, {f"{tenant}\0{doc_id}".encode(): 0})
        pipe.execute()
        if self.local is not None:
            self.local._put_raw(tenant, doc_id, value)

    def _get_raw(self, tenant: str, doc_id: str) -> bytes | None:
        try:
            raw = self.r.get(self._key(tenant, doc_id))
        except self._down:
            mirrored = self.local._get_raw(tenant, doc_id) if self.local is not None else None
            if mirrored is None:
                raise
            return mirrored
        if raw is not None and self.local is not None and self.local._get_raw(tenant, doc_id) != raw:
            self.local._put_raw(tenant, doc_id, raw)
        return raw

    def last_known(self, tenant: str, doc_id: str) -> dict | None:
        """The text in Redis, else this host's mirrored copy (e.g. Redis lost it): what a delete uses to find
        the cache to drop."""
        return self.get_intact(tenant, doc_id) or (self.local.get_intact(tenant, doc_id) if self.local else None)

    def seed_from_local(self, always: bool = False) -> int:
        """Copy the local texts into Redis when Redis holds none (a store whose texts lived only in LMDB, from
        before texts moved to Redis, or a Redis restarted empty); the number offered (0 when Redis has texts,
        or is unreachable).

        Args:
            always: copy the texts Redis lacks even when it holds some (Redis lost its data under a running
                host and other hosts wrote since); a text Redis holds is never overwritten (``SET NX``).
        """
        try:
            if self.local is None or (not always and not self.empty()) or self.local.empty():
                return 0
            n = 0
            for tenant, doc_id, raw in self.local._raw_items():
                pipe = self.r.pipeline(transaction=True)
                pipe.set(self._key(tenant, doc_id), raw, nx=True)
                pipe.zadd(self._set, {f"{tenant}\0{doc_id}".encode(): 0})
                pipe.execute()
                n += 1
            return n
        except self._down:
            return 0

    def _raw_items(self) -> Iterator[tuple[str, str, bytes]]:
        start = b"-"
        while True:
            members = self.r.zrangebylex(self._set, start, b"+", start=0, num=_PAGE)
            pairs = [m.decode("utf-8", "replace").partition("\0")[::2] for m in members]
            values = self.r.mget([self._key(t, d) for t, d in pairs]) if pairs else []
            for (tenant, doc_id), raw in zip(pairs, values, strict=True):
                if raw is not None:
                    yield tenant, doc_id, raw
            if len(members) < _PAGE:
                return
            start = b"(" + members[-1]

    def empty(self) -> bool:
        """True when no text is stored."""
        return not self.r.zcard(self._set)

    def delete(self, tenant: str, doc_id: str) -> bool:
        """Remove; True if it existed."""
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(self._key(tenant, doc_id))
        pipe.zrem(self._set, f"{tenant}\0{doc_id}".encode())
        existed = bool(pipe.execute()[0])
        mirrored = self.local.delete(tenant, doc_id) if self.local is not None else False
        return existed or mirrored

    def close(self) -> None:
        """Close the client's connections."""
        self.r.close()
