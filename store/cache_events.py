"""What enters and leaves a process's cache tiers, told to whoever listens (a router keeps an index of it).

The tiers (:class:`store.tiers.tier.CacheTier`: ``device``, ``host``, ``cold``) and the local LMDB store
(:class:`store.blobs.lmdb.LmdbBlobStore`: tier ``local``) call a :class:`CacheEvents` after each change, outside
their locks; the default :data:`NO_EVENTS` does nothing. :class:`service.cache_publisher.CachePublisher`
publishes them to a Redis Stream (``kvlink-rag router`` reads it), with a sequence number per replica.

A listener must not block or raise: it is called on the query path.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["NO_EVENTS", "CacheEvents", "NoEvents"]


@runtime_checkable
class CacheEvents(Protocol):
    """Listener of cache tier changes.

    Methods:
        stored(tier, key, tokens, nbytes): ``key`` (a document cache key, :mod:`store.keys`) entered ``tier``
            holding ``tokens`` of the document's tokens (0 when not known) in ``nbytes`` bytes.
        removed(tier, key): ``key`` left ``tier`` (evicted, deleted or fenced).
    """

    def stored(self, tier: str, key: str, tokens: int, nbytes: int) -> None: ...

    def removed(self, tier: str, key: str) -> None: ...


class NoEvents:
    """The default listener: nothing is told (no Redis configured, tests, the CLI)."""

    def stored(self, tier: str, key: str, tokens: int, nbytes: int) -> None:
        return None

    def removed(self, tier: str, key: str) -> None:
        return None


NO_EVENTS: CacheEvents = NoEvents()

